"""`dualpace-hw profile --quick` on the CPU with a tiny model: the profile loads in the
simulator and drives `dualpace-sim run`; an interrupted profile resumes."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from dualpace_hw.cli import app as hw_app
from dualpace_hw.profiler import run as profile_run
from dualpace_hw.profiler.measure import Measurer
from dualpace_sim.cli import app as sim_app
from dualpace_sim.costs import load_profile
from dualpace_sim.costs.profile import check_magnitudes


@pytest.fixture(scope="module")
def quick_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("prof") / "tiny-llama.yaml"
    result = CliRunner().invoke(hw_app, [
        "profile", "--model", "tiny-llama", "--out", str(out), "--quick", "--gpu-device", "cpu",
        "--box", "ci-box", "--cpu-cores", "2", "--quiet"])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_quick_profile_has_provenance_fits_and_plots(quick_profile):
    out, output = quick_profile
    profile = load_profile(out)
    prov = profile.provenance
    assert prov.method == "measured" and prov.torch_version and prov.cpu_cores == 2
    assert "QUICK" in prov.notes and prov.command.startswith("dualpace-hw profile")
    assert profile.box.name == "ci-box" and profile.model.name == "tiny-llama"
    c = profile.controls
    lines = output.strip().splitlines()[-4:]
    assert lines == [f"route_p={c.route_p}", f"route_f={c.route_f}",
                     f"gpu_token_limit={c.gpu_token_limit}", f"cpu_batch_limit={c.cpu_batch_limit}"]
    assert out.with_name("tiny-llama-fit.png").stat().st_size > 0
    assert not out.with_suffix(".partial.json").exists()
    # every table measured (quick timings of a tiny model are overhead-bound, so no ordering
    # between points is asserted) and plausible in the simulator's unit checks
    z = profile.gpu.decode_attn.z
    assert len(z) == 3 and all(len(row) == 3 for row in z)
    assert min(profile.cpu.post_layer.y) > 0 and min(profile.assist.g_p.y) > 0
    check_magnitudes(profile, str(out))


def test_quick_profile_drives_the_simulator(quick_profile, tmp_path):
    out, _ = quick_profile
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "measured", "profile": str(out), "policies": ["dualpace"],
        "workload": {"source": "default", "num_requests": 30, "rate": 2.0},
    }))
    result = CliRunner().invoke(sim_app, ["run", str(scenario), "--out", str(tmp_path / "o"),
                                          "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())[0]
    assert summary["completed"] == 30 and summary["profile"]["method"] == "measured"
    assert summary["controls"]["route_p"]["source"] == "profile controls"


def test_an_interrupted_profile_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "p.yaml"
    calls = {"n": 0}
    real = Measurer.cpu_decode_attn

    def flaky(self, b, total):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, b, total)

    monkeypatch.setattr(Measurer, "cpu_decode_attn", flaky)
    opt = profile_run.Options(shape=load_profile_shape(), out=out, box_name="b", quick=True,
                              gpu_device="cpu", progress=False)
    with pytest.raises(KeyboardInterrupt):
        profile_run.run_profile(opt)
    saved = json.loads(out.with_suffix(".partial.json").read_text())["points"]
    assert "gpu.pre_attn|1" in saved and len([k for k in saved if "cpu.decode" in k]) == 2
    profile_run.run_profile(opt)
    # 2 measured and 1 interrupted before; then only the 7 missing points of the 3 x 3 grid,
    # plus NEO's launch term (a one-token CPU attention call)
    assert calls["n"] == 3 + 7 + 1
    assert not out.with_suffix(".partial.json").exists()
    assert load_profile(out).cpu.decode_attn.z


def test_no_cuda_device_is_a_clear_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    result = CliRunner().invoke(hw_app, ["profile", "--model", "tiny-llama", "--out",
                                         str(tmp_path / "p.yaml"), "--quick"])
    assert result.exit_code == 2 and "no CUDA device" in result.output


def load_profile_shape():
    from dualpace_sim.costs.shapes import ModelShape

    return ModelShape.from_name("tiny-llama")


def test_cpu_tensor_parallel_profile_times_the_sharded_stages_on_the_ranks(tmp_path,
                                                                            monkeypatch):
    """`--cpu-tp 2`: the sharded CPU stages are measured by two Gloo ranks (one core each) and
    the profile says so; the stages that stay whole are measured as before."""
    from dualpace_hw.profiler import ranks as ranks_module

    seen: list[tuple] = []
    measure = ranks_module.CpuRanks.measure

    def recorded(self, stage, *args):
        seen.append((stage, args))
        return measure(self, stage, *args)

    monkeypatch.setattr(ranks_module.CpuRanks, "measure", recorded)
    out = tmp_path / "tiny-llama-tp2.yaml"
    result = CliRunner().invoke(hw_app, [
        "profile", "--model", "tiny-llama", "--out", str(out), "--quick", "--gpu-device", "cpu",
        "--box", "ci-box", "--cpu-cores", "2", "--cpu-tp", "2", "--quiet"])
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    assert profile.box.cpu_tensor_parallel == 2 and "--cpu-tp 2" in profile.provenance.command
    assert {stage for stage, _ in seen} == {"cpu.pre_attn", "cpu.post_attn", "cpu.decode_attn"}
    assert min(profile.cpu.post_attn.y) > 0 and min(profile.cpu.pre_layer.y) > 0
    check_magnitudes(profile, str(out))


def test_cpu_tensor_parallel_needs_a_core_per_rank(tmp_path):
    result = CliRunner().invoke(hw_app, [
        "profile", "--model", "tiny-llama", "--out", str(tmp_path / "p.yaml"), "--quick",
        "--gpu-device", "cpu", "--cpu-cores", "1", "--cpu-tp", "2", "--quiet"])
    assert result.exit_code == 2
    assert "--cpu-tp 2: 2 CPU ranks need at least 2 cores, got 1" in result.output
