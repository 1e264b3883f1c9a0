"""`dualpace-hw profile --quick` on the CPU with a tiny model: the profile loads in the
simulator and drives `dualpace-sim run`; an interrupted profile resumes."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
import yaml
from typer.testing import CliRunner

from dualpace_hw.cli import app as hw_app
from dualpace_hw.profiler import run as profile_run
from dualpace_hw.profiler.measure import Measurer
from dualpace_sim.cli.main import app as sim_app
from dualpace_sim.costs import load_profile
from dualpace_sim.costs.profile import check_magnitudes

pytestmark = pytest.mark.usefixtures("keep_the_cores")


def test_quick_profile_has_provenance_fits_and_plots(quick_profile):
    out, output = quick_profile
    profile = load_profile(out)
    prov = profile.provenance
    assert prov.method == "measured" and prov.torch_version and prov.cpu_cores == 2
    assert "QUICK" in prov.notes and prov.command.startswith("dualpace-hw profile")
    assert prov.quick is True  # recorded as a field, for `dualpace-sim validate`'s note
    # run via the old name --gpu-device, recorded under the one name both commands share
    assert "--device cpu" in prov.command and "--gpu-device" not in prov.command
    assert prov.onednn_version is None or prov.onednn_version[0].isdigit()
    assert prov.is_quick()  # what `dualpace-sim validate` notes
    # the host's read bandwidth on the profiled cores, beside which validate sets a run's
    assert 1e8 < prov.host_read_bytes_per_s < 1e13
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
    # the eager floor measured again beside a stand-in CPU engine, as DualPace runs it
    assert profile.gpu.eager_layer_beside_cpu_s > 0 and profile.gpu.eager_layer_s > 0
    assert "gpu.eager_layer_beside_cpu_s" in prov.notes
    # and NEO's decode floor (its iterations run eagerly, decodes included)
    assert profile.neo.eager_decode_layer_s > 0 and "neo.eager_decode_layer_s" in prov.notes
    assert profile.neo.eager_prefill_layer_s > 0 and "neo.eager_prefill_layer_s" in prov.notes
    # q and o through the runtime's shared control block (handshake.py), not in-process
    assert "shared control block" in prov.notes
    assert min(profile.assist.q.p, profile.assist.q.lA, profile.assist.q.lS) > 0
    check_magnitudes(profile, str(out))
    # Appendix B: q and o replaced by the calibration workload's, which the profiler served
    cal = profile.assist.calibration
    assert cal is not None and cal.kept == [] and "Azure-Conversation" in cal.workload
    assert cal.runs == ["tiny-llama-calibration/fused-assist/run",
                        "tiny-llama-calibration/split-final/run"]
    assert all((out.parent / r / "assists-dualpace.csv.gz").is_file() for r in cal.runs)
    for r in cal.runs:  # served as `dualpace-hw run` serves: its host's figure recorded
        summary = json.loads((out.parent / r / "summary.json").read_text())
        assert all(1e8 < s["host_read_bytes_per_s"] < 1e13 for s in summary)
    # and the GPU iteration overhead from the same runs' decode-only rounds with the CPU
    # engine idle, where the tiny passes have any (the arithmetic on the H200 passes:
    # tests/test_served_rounds.py); without them the timed overhead stays, and says so
    served = profile.gpu.iteration_overhead_calibration
    set_from_runs = "gpu.iteration_overhead_s then set from the same runs'"
    if served is None:
        assert set_from_runs not in profile.provenance.notes
    else:
        assert served.runs == cal.runs and served.rounds > 0
        assert profile.gpu.iteration_overhead_s == served.served_s
        assert set_from_runs in profile.provenance.notes
    assert "Appendix B's end-to-end calibration" in prov.notes
    assert "calibration: routes (P, F) = " in output


def test_no_calibration_keeps_the_handshakes_q_and_o(tmp_path):
    out = tmp_path / "p.yaml"
    result = CliRunner().invoke(hw_app, [
        "profile", "--model", "tiny-llama", "--out", str(out), "--quick", "--device", "cpu",
        "--cpu-cores", "2", "--no-calibration", "--quiet"])
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    assert profile.assist.calibration is None and not (tmp_path / "p-calibration").exists()
    assert profile.provenance.command.endswith("--no-calibration")


def test_the_calibration_passes_are_served_on_all_the_process_cores(tmp_path, monkeypatch):
    """The profiler narrows itself to the --cpu-cores it measures; the calibration passes must
    be served as `dualpace-hw run` serves, the GPU engine on the cores the CPU engine leaves.
    On the narrowed set none are left, and the H200 box's passes ran the GPU engine's threads
    on the CPU engine's cores (CPU steps 2.3-3.4x their modelled work, q_p ten times a served
    run's)."""
    cores = os.sched_getaffinity(0)
    if len(cores) < 2:
        pytest.skip("needs two cores: one to measure on and one left for the GPU engine")
    seen: dict[str, object] = {}

    class Served(Exception):
        pass

    def serve(*args, **kwargs):
        seen.update(cores=os.sched_getaffinity(0), threads=torch.get_num_threads())
        raise Served

    monkeypatch.setattr(profile_run, "serve_passes", serve)
    with pytest.raises(Served):
        profile_run.run_profile(profile_run.Options(
            shape=load_profile_shape(), out=tmp_path / "p.yaml", box_name="b", quick=True,
            gpu_device="cpu", cpu_cores=1, progress=False))
    assert seen == {"cores": cores, "threads": len(cores)}


def test_the_cpu_engine_load_runs_on_its_cores_until_the_block_ends():
    """The stand-in CPU engine decodes in a process of its own, pinned to the cores given, and
    is gone when the block ends."""
    import multiprocessing

    from dualpace_hw.profiler.load import cpu_engine_load
    from dualpace_sim.costs.shapes import ModelShape

    core = sorted(os.sched_getaffinity(0))[:1]
    with cpu_engine_load(ModelShape.from_name("tiny-llama"), 0, 16, core):
        (child,) = multiprocessing.active_children()
        assert os.sched_getaffinity(child.pid) == set(core)
        ticks = _cpu_ticks(child.pid)
        time.sleep(0.5)
        assert _cpu_ticks(child.pid) > ticks, "the load is decoding"
    assert not multiprocessing.active_children()


def _cpu_ticks(pid: int) -> int:
    """The process's CPU time so far, in clock ticks (utime + stime from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


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
                              gpu_device="cpu", progress=False, calibration=False)
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
        "--box", "ci-box", "--cpu-cores", "2", "--cpu-tp", "2", "--no-calibration", "--quiet"])
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


def test_gpu_tensor_parallel_profile_times_every_gpu_measurement_on_the_ranks(tmp_path,
                                                                               monkeypatch):
    """`--gpu-tp 2` (with `--cpu-tp 2`: they combine): every GPU table, the assists, the eager
    layer and the link are measured by two GPU ranks (on the CPU device here), the sharded CPU
    stages by two CPU ranks; the profile records two GPUs at tensor parallel 2."""
    from dualpace_hw.profiler import ranks as ranks_module

    seen: list[str] = []
    for cls, name in [(ranks_module.GpuRanks, "measure"), (ranks_module.GpuRanks, "assist"),
                      (ranks_module.GpuRanks, "link"), (ranks_module.CpuRanks, "measure")]:
        real = getattr(cls, name)

        def recorded(self, *args, real=real, cls=cls, name=name):
            seen.append(f"{cls.kind}:{args[0] if name == 'measure' else name}")
            return real(self, *args)

        monkeypatch.setattr(cls, name, recorded)
    out = tmp_path / "tiny-llama-gtp2.yaml"
    result = CliRunner().invoke(hw_app, [
        "profile", "--model", "tiny-llama", "--out", str(out), "--quick", "--gpu-device", "cpu",
        "--box", "ci-box", "--cpu-cores", "2", "--cpu-tp", "2", "--gpu-tp", "2",
        "--no-calibration", "--quiet"])
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    assert profile.box.gpu_count == profile.box.tensor_parallel == 2
    assert profile.box.cpu_tensor_parallel == 2
    assert "--gpu-tp 2" in profile.provenance.command
    assert "GPU tensor parallel over 2 ranks" in profile.provenance.notes
    assert "CPU tensor parallel over 2 ranks" in profile.provenance.notes
    assert set(seen) == ({f"GPU:{s}" for s in ranks_module.GPU_STAGES}
                         | {"GPU:gpu.eager_layer_s", "GPU:assist", "GPU:link"}
                         | {f"CPU:{s}" for s in ranks_module.CPU_STAGES})
    assert min(profile.gpu.post_attn.y) > 0 and min(profile.assist.g_lA.y) > 0
    assert profile.gpu.eager_layer_beside_cpu_s is None  # not measured on GPU ranks
    assert profile.neo.eager_decode_layer_s is None  # the real NEO runs on one GPU
    assert profile.neo.eager_prefill_layer_s is None
    # whole rounds through the runtime's LeadExecutor over the two ranks, less their price
    assert profile.gpu.rank_round is not None and profile.gpu.rank_round.x == [1, 4]
    assert min(profile.gpu.rank_round.y) >= 0 and max(profile.gpu.rank_round.y) > 0
    notes = profile.provenance.notes
    assert "gpu.rank_round = whole decode rounds of 1,024-token requests" in notes
    assert "at the model's depth" in notes
    check_magnitudes(profile, str(out))


def test_gpu_ranks_keep_the_slowest_rank_and_aggregate_the_link(monkeypatch):
    """Rank-critical: a stage's time and an assist's are the maximum over the ranks; the link's
    bandwidth is all ranks' bytes over the slowest rank's time."""
    from dualpace_hw.profiler.ranks import GpuRanks

    per_rank = {
        "gpu.post_attn": [2.0, 5.0, 3.0],
        "assist": [(1.0, 4.0), (3.0, 2.0), (2.0, 1.0)],
        "link": [{"h2d_bytes_per_s": 10.0, "d2h_bytes_per_s": 8.0, "latency_s": 1.0},
                 {"h2d_bytes_per_s": 6.0, "d2h_bytes_per_s": 9.0, "latency_s": 3.0},
                 {"h2d_bytes_per_s": 7.0, "d2h_bytes_per_s": 12.0, "latency_s": 2.0}],
    }
    ranks = object.__new__(GpuRanks)  # no processes: the ranks' answers are given
    monkeypatch.setattr(GpuRanks, "_each", lambda self, stage, args: per_rank[stage])
    assert ranks.measure("gpu.post_attn", 8) == 5.0
    assert ranks.assist("p", 8) == (3.0, 4.0)
    assert ranks.link() == {"h2d_bytes_per_s": 18.0, "d2h_bytes_per_s": 24.0, "latency_s": 3.0}


def _post_attn_inputs(shape):
    g = torch.Generator().manual_seed(5)
    return (torch.randn(4, shape.q_dim, generator=g).bfloat16(),
            torch.randn(4, shape.hidden_size, generator=g).bfloat16())


def _post_attn_on_a_gpu_rank(rank: int, rendezvous: str, results) -> None:
    """A GPU rank as the profiler starts it (on the CPU device): its post-attention stage on
    its heads' columns of the attention output."""
    from dualpace_hw.profiler.grids import Grids
    from dualpace_hw.profiler.ranks import GpuRankSpec
    from dualpace_hw.profiler.timing import Protocol

    shape = load_profile_shape()
    spec = GpuRankSpec(shape, 3, 4, Grids.quick(), Protocol.quick(), rank, 2, rendezvous,
                       "cpu", (sorted(os.sched_getaffinity(0))[0],))
    gpu_rank = spec.start()
    attn, residual = _post_attn_inputs(shape)
    out = gpu_rank.m.gpu.post_attn(0, attn.chunk(2, dim=1)[rank], residual)
    results.put((rank, out.float().tolist()))  # lists: the rank exits before tensors are read
    import torch.distributed as dist

    dist.barrier()  # leave the group together: a Gloo rank whose peer is gone aborts at exit
    dist.destroy_process_group()


def test_gpu_ranks_time_the_sharded_stage_with_its_all_reduces(tmp_path):
    """The layer a GPU rank times is its shard with the all-reduces: two ranks' post-attention
    outputs are the same, and the whole layer's (a rank without the all-reduces is off by
    about 2.5 here)."""
    import multiprocessing as mp

    from dualpace_hw.executors.model import Model, ModelWeights

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_post_attn_on_a_gpu_rank,
                         args=(r, str(tmp_path / "rendezvous"), results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    shape = load_profile_shape()
    whole = Model(shape, ModelWeights.random(shape, 3, "cpu", n_layers=1))
    expected = whole.post_attn(0, *_post_attn_inputs(shape)).float()
    assert got[0] == got[1]
    torch.testing.assert_close(torch.tensor(got[0]), expected, atol=0.1, rtol=0.05)


def test_gpu_tensor_parallel_must_split_the_heads_and_have_the_gpus(tmp_path, monkeypatch):
    args = ["profile", "--model", "tiny-llama", "--out", str(tmp_path / "p.yaml"), "--quick",
            "--quiet"]
    result = CliRunner().invoke(hw_app, [*args, "--gpu-device", "cpu", "--gpu-tp", "4"])
    assert result.exit_code == 2
    assert "--gpu-tp 4: tiny-llama: n_kv_heads=2 does not split over 4 ranks" in result.output
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    result = CliRunner().invoke(hw_app, [*args, "--gpu-tp", "2"])
    assert result.exit_code == 2
    assert "--gpu-tp 2: one rank per GPU needs 2 CUDA devices, this box has 1" in result.output
    assert not (tmp_path / "p.partial.json").exists()


def test_gpu_tensor_parallel_kv_capacity_sums_the_gpus(tmp_path, monkeypatch):
    """Each GPU keeps 90% of its memory less its half of the weights and the reserve; the pool
    is the sum, in blocks of the whole model (a block's heads are spread over the GPUs)."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=80 * profile_run.GIB))
    shape = load_profile_shape()
    opt = profile_run.Options(shape=shape, out=tmp_path / "p.yaml", box_name="b", gpu_tp=2,
                              host_kv_gib=1.0)
    blocks, _, params = profile_run._capacities(opt, torch.device("cuda"))
    per_gpu = 80 * 0.9 * profile_run.GIB - shape.weight_bytes / 2 \
        - profile_run.GPU_RESERVE_GIB * profile_run.GIB
    assert blocks == int(2 * per_gpu // (opt.block_size * shape.kv_bytes_per_token))
    assert params["gpu_kv_gib"] == round(2 * per_gpu / profile_run.GIB, 2)


def test_the_cpu_layer_ring_holds_every_layer_where_memory_allows_and_twice_the_cache_at_least():
    from dualpace_hw.profiler.measure import cpu_layer_ring
    from dualpace_sim.costs.shapes import ModelShape

    llama = ModelShape.from_name("llama-3.1-8b")  # QKV 48 MiB a layer, 416 MiB all of a layer
    qkv = llama.hidden_size * (llama.q_dim + 2 * llama.kv_dim) * 2
    layer = llama.weight_bytes_per_layer
    assert qkv == 48 * 2**20 and 415 * 2**20 < layer < 417 * 2**20
    # the H200 box (a 300 MiB cache, 125 GiB): every layer, as a decode step reads them
    assert cpu_layer_ring(llama, 300 * 2**20, budget=31 * 2**30) == 32
    # a budget for 24 layers (a plain and a packed copy of each): 24
    assert cpu_layer_ring(llama, 300 * 2**20, budget=24 * 2 * layer) == 24
    # little memory: still twice the cache in QKV (14 layers), as before
    ring = cpu_layer_ring(llama, 300 * 2**20, budget=2**30)
    assert ring == 14 and (ring - 1) * qkv >= 2 * 300 * 2**20
    assert cpu_layer_ring(llama, 105 * 2**20, budget=2**30) == 6
    assert cpu_layer_ring(load_profile_shape(), 32 * 2**20) == 16  # a tiny layer: the cap
    assert cpu_layer_ring(llama, 0, budget=2**30) == 4  # sysfs silent: 64 MiB assumed


def test_cpu_decode_attention_is_timed_over_a_window_for_every_layer_and_twice_the_cache():
    from dualpace_hw.profiler.measure import cpu_kv_pool, kv_windows

    block = 16 * 4096  # a Llama-3.1-8B block of K and V, one layer
    assert kv_windows(block, 16 * 64, 300 * 2**20, 32) == 32  # 16 requests of 1,024 tokens
    assert kv_windows(block, 256 * 64, 300 * 2**20, 32) == 32
    assert kv_windows(block, 16 * 64, 300 * 2**20, 2) == 10  # two layers: twice the cache
    assert kv_windows(block, 256 * 64, 300 * 2**20, 1) == 1  # already twice the cache
    tiny = load_profile_shape()
    tiny_block = 16 * tiny.kv_bytes_per_token_per_layer
    # room for a window a layer where the budget holds it, and never less than twice the cache
    pool = cpu_kv_pool(tiny, 100, 16, 2**20, budget=2**30)
    assert pool.n_blocks == 100 + max((tiny.n_layers - 1) * 100, 2 * 2**20 // tiny_block)


def test_cpu_dense_stages_take_the_next_layer_of_the_ring_on_every_call():
    """Timed on one layer over and over, a stage whose weights fit the cache would read them
    from it; a decode step reads each layer's weights once."""
    from dualpace_hw.profiler.grids import Grids
    from dualpace_hw.profiler.timing import Protocol, Timer

    cpu = torch.device("cpu")
    m = Measurer(load_profile_shape(), cpu, Timer(cpu, Protocol.quick()),
                 Timer(cpu, Protocol.quick()), Grids.quick(), 16)
    assert m.cpu_ring > 1 and len(m.cpu.w.layers) == m.cpu_ring
    for stage in ("pre_attn", "post_attn"):
        seen: list[int] = []
        real = getattr(m.cpu, stage)

        def spy(layer, *a, real=real, seen=seen):
            seen.append(layer)
            return real(layer, *a)

        setattr(m.cpu, stage, spy)
        getattr(m, f"cpu_{stage}")(2)
        assert len(seen) > 1 and seen == [i % m.cpu_ring for i in range(len(seen))], stage


def test_full_grids_reach_down_to_one_token_chunks():
    """Serving's last chunks and shortest prompts are a few tokens: the prefill table covers
    them rather than extrapolating below its smallest row."""
    from dualpace_hw.profiler.grids import Grids

    g = Grids.full()
    assert g.prefill_chunks[0] == g.prefill_contexts[0] == 1
    assert {256, 512, 1024, 2048, 4096} <= set(g.prefill_chunks) & set(g.prefill_contexts)


def test_a_stalled_first_assist_is_measured_again(tmp_path, monkeypatch):
    """The assist tables get the stage tables' guard: in a CI run on a busy 2-core machine,
    g_p at 1 row came out 60 times its value at 16 rows and the profile was refused as
    reversed."""
    from dualpace_hw.profiler import run as profile_run
    from dualpace_hw.profiler.measure import Measurer

    stalled = {"p": 1}  # the first call of path p stalls

    def assist(self, kind, b):
        if stalled.get(kind):
            stalled[kind] -= 1
            return 2e-2, 2e-2
        return 1e-5 * b, 2e-5 * b

    monkeypatch.setattr(Measurer, "assist", assist)
    out = tmp_path / "p.yaml"
    profile_run.run_profile(profile_run.Options(
        shape=load_profile_shape(), out=out, box_name="b", quick=True, gpu_device="cpu",
        progress=False, calibration=False))
    g_p = load_profile(out).assist.g_p
    assert g_p.y[0] == 1e-5 * g_p.x[0] and not stalled["p"]


def test_the_eager_floors_are_the_median_of_the_start_middle_and_end_of_the_run(tmp_path,
                                                                               monkeypatch):
    """The host's speed drifts within minutes (the H200 box's floor read 1.05 and 1.53 ms in
    two profiles an hour apart; its iteration overhead 0.56 and 1.03 ms), so each floor and
    the iteration overhead are sampled three times across the run and the profile keeps the
    median, with the samples in its notes."""
    order: list[str] = []
    alone, beside = iter([3e-3, 1e-3, 2e-3]), iter([6e-3, 4e-3, 5e-3])
    overheads = iter([9e-4, 5e-4, 7e-4])
    monkeypatch.setattr(Measurer, "iteration_overhead", lambda self: next(overheads))
    decode = iter([9e-4, 7e-4, 8e-4])
    first_table, last_table = Measurer.gpu_pre_attn, Measurer.gpu_decode_attn

    def eager(self):
        order.append("floor")
        return next(alone)

    monkeypatch.setattr(Measurer, "eager_layer", eager)
    monkeypatch.setattr(Measurer, "eager_decode_layer", lambda self: next(decode))
    prefill = iter([4e-3, 2e-3, 3e-3])
    monkeypatch.setattr(Measurer, "eager_prefill_layer", lambda self: next(prefill))
    monkeypatch.setattr(Measurer, "gpu_pre_attn",
                        lambda self, n: order.append("first table") or first_table(self, n))
    monkeypatch.setattr(Measurer, "gpu_decode_attn",
                        lambda self, b, t: order.append("last table") or last_table(self, b, t))
    monkeypatch.setattr(profile_run, "_eager_beside_cpu", lambda *a: next(beside))
    out = tmp_path / "p.yaml"
    profile_run.run_profile(profile_run.Options(
        shape=load_profile_shape(), out=out, box_name="b", quick=True, gpu_device="cpu",
        progress=False, calibration=False))
    profile = load_profile(out)
    assert profile.gpu.eager_layer_s == 2e-3 and profile.gpu.eager_layer_beside_cpu_s == 5e-3
    assert profile.neo.eager_decode_layer_s == 8e-4 and profile.neo.eager_prefill_layer_s == 3e-3
    assert ("eager 3.000, 1.000, 2.000 ms; beside 6.000, 4.000, 5.000 ms; NEO decode 0.900, "
            "0.700, 0.800 ms; NEO prefill 4.000, 2.000, 3.000 ms") in profile.provenance.notes
    assert profile.gpu.iteration_overhead_s == profile.cpu.iteration_overhead_s == 7e-4
    assert "the median of 0.900, 0.500, 0.700 ms" in profile.provenance.notes
    assert not profile.provenance.command and profile.provenance.is_quick()  # from its notes
    runs = [x for i, x in enumerate(order) if i == 0 or order[i - 1] != x]
    assert runs == ["floor", "first table", "floor", "last table", "floor"]


def test_cpu_decode_attention_reads_a_new_window_each_call_where_the_pool_has_room():
    from dualpace_hw.memory.kv import PagedKVPool
    from dualpace_hw.profiler.grids import Grids
    from dualpace_hw.profiler.measure import decode_time

    shape = load_profile_shape()
    block_bytes = 16 * shape.kv_bytes_per_token_per_layer
    cache = 8 * block_bytes  # twice it is 8 windows of one 32-token request (2 blocks) ...
    pool = PagedKVPool(shape, 6, 16, "cpu", n_layers=1)  # ... of which the pool holds 3
    grids = Grids.quick()
    seen = []

    def kernel(q, kc, vc, tables, lens):
        seen.append(int(tables[0, 0]))

    def timer(fn):
        for _ in range(7):
            fn()
        return 1.0

    decode_time(shape, grids, kernel, timer, pool, "cpu", 1, 32, cache_bytes=cache)
    assert seen == [0, 2, 4, 0, 2, 4, 0]
    seen.clear()
    timer.graphed = timer
    decode_time(shape, grids, kernel, timer, pool, "cpu", 1, 32)  # the GPU's way: one window
    assert seen == [0] * 7


def test_the_ring_is_copies_of_one_layer_in_distinct_memory():
    from dualpace_hw.executors.model import ModelWeights
    from dualpace_hw.profiler.measure import ring_of

    one = ModelWeights.random(load_profile_shape(), 0, "cpu", n_layers=1)
    ring = ring_of(one, 4)
    assert len(ring.layers) == 4 and ring.embed is one.embed
    for name in ("qkv", "o", "gate_up", "down"):  # four places in memory ...
        assert len({getattr(lw, name).weight.data_ptr() for lw in ring.layers}) == 4
    assert len({lw.input_norm.data_ptr() for lw in ring.layers}) == 4
    for lw in ring.layers:  # ... holding the same values
        assert torch.equal(lw.qkv.weight, one.layers[0].qkv.weight)
        assert torch.equal(lw.down.weight, one.layers[0].down.weight)


def test_rank_round_is_what_whole_rounds_cost_beyond_the_models_price():
    """`gpu.rank_round` is each timed round less the cost model's price for it, at the model's
    depth; timed shallower, the part that grows with depth is extended linearly to it."""
    from dualpace_hw.profiler.rank_round import priced_round, with_rank_round
    from dualpace_sim.costs.model import CostModel

    profile = load_profile("calibration/h200x2-xeon32/qwen3-14b.yaml").model_copy(deep=True)
    profile.gpu.rank_round = None
    cost, n, rows = CostModel(profile), profile.model.n_layers, [1, 16, 64]
    per_round, per_layer = {1: 4e-4, 16: 6e-4, 64: -3e-3}, {1: 2e-5, 16: 2.5e-5, 64: 2e-5}

    def walls(depth: int) -> dict[int, float]:
        return {b: priced_round(cost, b, depth) + per_round[b] + depth * per_layer[b]
                for b in rows}

    want = [max(per_round[b] + n * per_layer[b], 0.0) for b in rows]
    direct = with_rank_round(profile, {n: walls(n)}).gpu.rank_round
    extended = with_rank_round(profile, {1: walls(1), 12: walls(12)}).gpu.rank_round
    assert direct.x == extended.x == rows
    assert direct.y == pytest.approx(want) and extended.y == pytest.approx(want)
    assert want[-1] == 0.0  # a round cheaper than its price adds nothing
    with pytest.raises(ValueError, match="needs two depths"):
        with_rank_round(profile, {12: walls(12)})


def test_rank_rounds_are_timed_at_the_depth_rank_0s_gpu_holds(monkeypatch):
    """The whole model where rank 0's GPU holds its full weights, its shard and its KV beside
    them; else as many layers as fit, and never fewer than two (a slope needs two depths)."""
    from dualpace_hw.profiler.rank_round import MEMORY_SHARE, timed_depth
    from dualpace_sim.costs.shapes import BUILTIN_SHAPES

    shape, cuda = BUILTIN_SHAPES["qwen3-14b"], torch.device("cuda", 0)
    need = ((shape.embedding_params + shape.lm_head_params) * shape.dtype_bytes
            + shape.n_layers * (shape.weight_bytes_per_layer * 1.5
                                + shape.kv_bytes_per_token_per_layer * 16 * 4096 / 2))

    def free(nbytes: float):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (nbytes, 0))

    free(need / MEMORY_SHARE * 1.01)
    assert timed_depth(shape, 2, cuda, 4096, 16) == shape.n_layers  # Qwen3-14B on an H200
    free(need / MEMORY_SHARE / 2)
    assert 2 < timed_depth(shape, 2, cuda, 4096, 16) < shape.n_layers
    free(1 << 30)
    assert timed_depth(shape, 2, cuda, 4096, 16) == 2
    assert timed_depth(shape, 2, torch.device("cpu"), 4096, 16) == shape.n_layers


@pytest.mark.parametrize("command", ["run", "profile"])
def test_run_and_profile_name_the_device_alike(command):
    result = CliRunner().invoke(hw_app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--device" in result.output and "--gpu-device" in result.output


def test_the_quick_protocol_keeps_the_fastest_repeat_and_the_full_one_the_mean():
    """One descheduling must not make a quick (tiny, microsecond) point 30x too slow; the
    paper's protocol averages its repeats."""
    from dualpace_hw.profiler.timing import Protocol, Timer

    def timed(protocol: Protocol) -> float:
        calls = {"n": 0}

        def fn() -> None:  # the first timed repeat stalls once, as a descheduled process does
            calls["n"] += 1
            if calls["n"] == protocol.warmups + 2:
                time.sleep(0.05)

        return Timer(torch.device("cpu"), protocol)(fn)

    assert timed(Protocol.quick()) < 0.005
    assert timed(Protocol(warmups=1, invocations=1, repeats=2, max_repeat_s=1e-9)) > 0.02


def test_a_stalled_smallest_shape_is_measured_again_and_a_real_rise_kept():
    """A table whose first point came out over REVERSED_RATIO times its last (a busy host
    stalled it) gets that point measured again, its fastest kept; a table that grows is left
    alone, and the last point is never lowered."""
    from dualpace_hw.profiler.run import remeasure_stalled_first

    calls = []

    def measure(x, y=None):
        calls.append((x, y))
        return 1e-4 * x

    stalled = {"x": [1, 4, 8], "y": [8e-3, 4e-4, 8e-4]}
    remeasure_stalled_first(stalled, measure)
    assert stalled["y"] == [1e-4, 4e-4, 8e-4] and calls == [(1, None)]
    grid = {"x": [1, 8], "y": [16, 64], "z": [[9e-3, 1e-3], [1e-3, 8e-4]]}
    remeasure_stalled_first(grid, measure)
    assert grid["z"][0][0] == 1e-4 and grid["z"][-1][-1] == 8e-4
    calls.clear()
    rising = {"x": [1, 8], "y": [2e-4, 8e-4]}
    remeasure_stalled_first(rising, measure)
    assert rising["y"] == [2e-4, 8e-4] and not calls
    always_slow = {"x": [1, 8], "y": [8e-3, 1e-4]}
    remeasure_stalled_first(always_slow, lambda x: 5e-3, tries=2)
    assert always_slow["y"][0] == 5e-3  # still reversed after the tries: the check says so
