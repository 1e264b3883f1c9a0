"""The CPU speed check: the profiler's CPU measurements at the profile's own grid points, and
`dualpace-hw run` recording it around each policy with a CPU engine, which `dualpace-sim
validate` then prices the run's CPU stages at."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml
from typer.testing import CliRunner

from dualpace_hw.cli import app as hw_app
from dualpace_hw.profiler.cpu_check import cpu_speed_check, within
from dualpace_sim.cli.main import app as sim_app
from dualpace_sim.costs import load_profile
from tests.conftest import RTX4090_LLAMA

pytestmark = pytest.mark.usefixtures("keep_the_cores")


def test_within_takes_the_grids_serving_range_or_its_nearest_point():
    assert within([1.0, 4.0, 16.0, 64.0, 256.0, 512.0], 16, 256) == [16, 64, 256]
    assert within([1.0, 4.0, 8.0], 16, 128) == [8]  # a tiny grid: its largest up to 128
    assert within([512.0, 1024.0], 16, 128) == [512]  # none up to 128: its smallest


def test_the_check_times_the_profiles_own_grid_points(quick_profile):
    path, _ = quick_profile
    profile = load_profile(path)
    check = cpu_speed_check(profile)
    cpu = profile.cpu
    pre = [p for p in check["points"] if p["table"] == "cpu.pre_attn"]
    attn = [p for p in check["points"] if p["table"] == "cpu.decode_attn"]
    assert pre and attn
    for p in pre:
        assert p["profiled_s"] == cpu.pre_attn.y[cpu.pre_attn.x.index(p["x"])]
    for p in attn:
        assert p["profiled_s"] == cpu.decode_attn.z[cpu.decode_attn.x.index(p["x"])][
            cpu.decode_attn.y.index(p["y"])]
    assert all(p["measured_s"] > 0 for p in check["points"])
    assert check["pre_attn"] == statistics.median(p["measured_s"] / p["profiled_s"] for p in pre)
    assert check["decode_attn"] == statistics.median(
        p["measured_s"] / p["profiled_s"] for p in attn)
    json.dumps(check)  # a summary's field
    assert cpu_speed_check(load_profile(RTX4090_LLAMA)) is None  # a roofline measured no host


def test_a_run_records_its_cpu_speed_and_validate_prices_it(quick_profile, tmp_path):
    path, _ = quick_profile
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "checked", "profile": str(path), "policies": ["dualpace", "vllm"],
        "vllm": {"max_num_batched_tokens": 64, "max_num_seqs": 8},
        "scheduler": {"gpu_kv_blocks": 10, "host_kv_blocks": 400, "gpu_token_limit": 16,
                      "cpu_batch_limit": 4, "route_p": 0, "route_f": 0},
        "workload": {"source": "default", "num_requests": 8, "rate": 5000.0, "seed": 2,
                     "max_prompt_tokens": 40, "max_output_tokens": 16}}))
    out = tmp_path / "real"
    result = CliRunner().invoke(hw_app, ["run", str(scenario), "--out", str(out), "--device",
                                         "cpu", "--cpu-cores", "1"])
    assert result.exit_code == 0, result.output
    dualpace, vllm = json.loads((out / "summary.json").read_text())
    assert set(dualpace["cpu_speed"]) == {"start", "end"}  # before and after it served
    for check in dualpace["cpu_speed"].values():
        assert check["pre_attn"] > 0 and check["decode_attn"] > 0 and check["points"]
    assert "cpu_speed" not in vllm  # no CPU engine: nothing checked

    result = CliRunner().invoke(sim_app, ["validate", str(scenario), "--real", str(out), "--out",
                                          str(tmp_path / "v"), "--quiet"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(sim_app, ["validate", str(scenario), "--real", str(out), "--out",
                                          str(tmp_path / "v")])
    assert "note: dualpace's run timed its CPU engine's cores at" in result.output

    unchecked = tmp_path / "unchecked"
    result = CliRunner().invoke(hw_app, ["run", str(scenario), "--out", str(unchecked),
                                         "--device", "cpu", "--policy", "dualpace",
                                         "--no-cpu-check"])
    assert result.exit_code == 0, result.output
    assert "cpu_speed" not in json.loads((unchecked / "summary.json").read_text())[0]
