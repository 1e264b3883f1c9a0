"""The real runtime end to end on the CPU with a tiny model: both engines, migrations and
Dense Assist, against greedy tokens from a dense forward of each request."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from dualpace_hw.cli import app
from dualpace_hw.executors.model import Model, ModelWeights, greedy
from dualpace_hw.memory.shm import SharedArena
from dualpace_hw.runtime.assist_server import AssistServer
from dualpace_hw.runtime.cpu_worker import AssistBlock, WorkerStopped
from dualpace_hw.runtime.engines import EngineFailure, Engines
from dualpace_hw.serving.serve import build_runtime, run_real
from dualpace_sim.cli.main import app as sim_app
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.core import Owner
from dualpace_sim.core.journal import JOURNAL_FILE, Journal
from dualpace_sim.costs import load_profile
from dualpace_sim.costs.calibrate import run_assist_calls
from dualpace_sim.costs.cpu_step_records import CPU_STEPS_FILE, read_cpu_steps
from dualpace_sim.results.node_series import ENGINES, STATE_COLUMNS, read_series
from dualpace_sim.results.provenance import PARQUET_KEY, RUN_PROFILE, provenance, scenario_hash
from dualpace_sim.results.records import read_metadata, read_records
from dualpace_sim.results.replay import replay, replay_run, replay_states
from tests.conftest import REPO_ROOT
from tests.hw.reference import dense_logits
from tests.hw.scenarios import tiny_scenario
from tests.hw.summaries import check_real_summary
from tests.signals import default_sigint


def scenario(tmp_path, policies, **scheduler) -> object:
    return tiny_scenario(tmp_path / "s.yaml", "tiny-llama", policies, "real-tiny",
                         {"num_requests": 10, "rate": 5000.0, "seed": 2,
                          "max_prompt_tokens": 40, "max_output_tokens": 24}, **scheduler)


def reference_tokens(model: Model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(greedy(dense_logits(model, ids)[-1:])[0]))
    return ids[len(prompt):]


def check_reference_tokens(loaded, runtime, requests, dtype: torch.dtype = torch.bfloat16
                           ) -> bytes:
    """Every request has all its tokens, exactly the greedy ones of a dense forward; returns
    the owners of all of them."""
    model = Model(loaded.profile.model,
                  ModelWeights.random(loaded.profile.model, seed=0, dtype=dtype))
    owners = b""
    for r in requests:
        ids = runtime.tokens.ids(r.req_id)
        assert r.generated == r.max_tokens == len(ids) - r.prompt_tokens
        assert ids[r.prompt_tokens:] == reference_tokens(model, ids[:r.prompt_tokens],
                                                         r.max_tokens), r.req_id
        owners += bytes(r.token_owners)
    return owners


def serve_and_check_reference(loaded, runtime, assists: bool,
                              dtype: torch.dtype = torch.bfloat16) -> None:
    """Every request gets exactly the greedy tokens of a dense forward, some from the CPU."""
    owners = check_reference_tokens(loaded, runtime, runtime.serve(), dtype)
    assert Owner.CPU in owners, "the CPU engine decoded some tokens"
    if assists:
        assert runtime.stats.assist_calls > 0
        assert runtime.stats.assist_service_s > runtime.stats.assist_gpu_s == 0.0  # no CUDA
    runtime.state.check_invariants()
    assert runtime.state.hbm.used == runtime.state.host.used == 0


@pytest.mark.parametrize("route", [(0, 0), (8, 4), (2, 1)],
                         ids=["fused-assist", "full-cpu", "split-final"])
def test_dualpace_runtime_serves_every_request_with_the_reference_tokens(tmp_path, route):
    loaded = load_scenario(scenario(tmp_path, ["dualpace"], route_p=route[0], route_f=route[1]))
    serve_and_check_reference(loaded, build_runtime(loaded, "dualpace", "cpu", None),
                              assists=route != (8, 4))


@pytest.mark.parametrize("route", [(0, 0), (8, 4)], ids=["fused-assist", "full-cpu"])
def test_two_tensor_parallel_cpu_ranks_serve_the_reference_tokens(tmp_path, route):
    """The CPU engine as two Gloo ranks (heads split, one shared host pool, rank-sharded Dense
    Assist): the same tokens as one dense model (in float32: split sums round differently)."""
    loaded = load_scenario(scenario(tmp_path, ["dualpace"], route_p=route[0], route_f=route[1]))
    runtime = build_runtime(loaded, "dualpace", "cpu", None, cpu_tp=2, dtype=torch.float32)
    assert len(runtime.cpu_engine.pids) == 2
    serve_and_check_reference(loaded, runtime, assists=route != (8, 4), dtype=torch.float32)
    assert not runtime.cpu_engine.alive


@pytest.mark.parametrize("route", [(0, 0), (8, 4)], ids=["fused-assist", "full-cpu"])
def test_two_tensor_parallel_gpu_ranks_serve_the_reference_tokens(tmp_path, route):
    """The GPU engine as two ranks (a process for rank 1; Gloo on the CPU device): rounds,
    stages, Dense Assists, swaps and Prefill-to-CPU copies in lockstep, each rank with its
    heads of the HBM pool and of the shared host pool; with two CPU ranks as well."""
    loaded = load_scenario(scenario(tmp_path, ["dualpace"], route_p=route[0], route_f=route[1]))
    runtime = build_runtime(loaded, "dualpace", "cpu", None, gpu_tp=2, cpu_tp=2,
                            dtype=torch.float32)
    assert runtime.gpu.world == 2 and runtime.gpu.shape.n_kv_heads == \
        loaded.profile.model.n_kv_heads // 2
    serve_and_check_reference(loaded, runtime, assists=route != (8, 4), dtype=torch.float32)
    assert runtime.stats.gpu_rounds > 0 and not multiprocessing.active_children()


def test_vllm_on_two_tensor_parallel_gpu_ranks_serves_the_reference_tokens(tmp_path):
    loaded = load_scenario(scenario(tmp_path, ["vllm"]))
    runtime = build_runtime(loaded, "vllm", "cpu", None, gpu_tp=2, dtype=torch.float32)
    requests = runtime.serve()
    model = Model(loaded.profile.model,
                  ModelWeights.random(loaded.profile.model, seed=0, dtype=torch.float32))
    for r in requests:
        ids = runtime.tokens.ids(r.req_id)
        assert ids[r.prompt_tokens:] == reference_tokens(model, ids[:r.prompt_tokens],
                                                         r.max_tokens), r.req_id
    assert not multiprocessing.active_children()


def test_a_killed_gpu_rank_ends_the_run_with_a_clear_error(tmp_path):
    runtime = build_runtime(load_scenario(slow_scenario(tmp_path)), "dualpace", "cpu", None,
                            gpu_tp=2)
    pid = runtime.gpu.peers.pids[0]
    killer = kill_when(pid, lambda: runtime.stats.gpu_rounds >= 5)
    with pytest.raises(EngineFailure, match=r"GPU engine failed: .*GPU rank 1 .*died"):
        runtime.serve()
    killer.join()
    assert not runtime.cpu_engine.alive and _gone(pid)
    assert not multiprocessing.active_children()


def test_two_gpu_ranks_serve_both_policies_through_the_cli_and_shut_down(tmp_path, device):
    """Both policies one after the other in one process (the group made, left and made again),
    on Gloo ranks in CI and on NCCL ranks with CUDA graphs on a 2-GPU box
    (DUALPACE_TEST_DEVICE=cuda). There, a rank that exits before rank 0 destroys the group
    leaves rank 0 stuck in NCCL's teardown, as first seen on the box: the time limit turns that
    into a failure."""
    if device == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    out = tmp_path / "real"
    path = scenario(tmp_path, ["vllm", "dualpace"], route_p=0, route_f=0)
    cmd = [sys.executable, "-c", "from dualpace_hw.cli import main; main()", "run", str(path),
           "--out", str(out), "--device", device, "--gpu-tp", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["vllm", "dualpace"]
    assert all(s["completed"] == s["submitted"] == 10 and s["gpu_tp"] == 2 for s in summary)
    assert "vllm: GPU engine on 2 tensor-parallel ranks" in done.stdout


@pytest.mark.parametrize("flag", ["--gpu-tp", "--cpu-tp"])
def test_a_split_the_heads_cannot_take_is_refused_naming_the_flag(tmp_path, flag):
    path = scenario(tmp_path, ["dualpace"])
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "o"),
                                      "--device", "cpu", flag, "4"])
    assert result.exit_code == 2
    assert f"error: {flag} 4: tiny-llama: n_kv_heads=2 does not split over 4 ranks" in \
        result.output
    assert not (tmp_path / "o" / "summary.json").exists()


def test_run_command_writes_what_the_simulator_writes(tmp_path):
    out = tmp_path / "real"
    path = scenario(tmp_path, ["dualpace", "vllm", "neo"], route_p=0, route_f=0)  # assists
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--device", "cpu",
                                      "--trace-events", str(out / "trace.json")])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["dualpace", "vllm", "neo"]
    assert all(s["completed"] == s["submitted"] == 10 and s["real"] for s in summary)
    for s in summary:  # the simulator's summary shape, every key described
        check_real_summary(s)
    # the host's read bandwidth on the CPU engine's cores, measured once before serving
    assert len({s["host_read_bytes_per_s"] for s in summary}) == 1
    assert 1e8 < summary[0]["host_read_bytes_per_s"] < 1e13
    records = read_records(out / "requests.parquet")
    assert set(records["policy"]) == {"dualpace", "vllm", "neo"}
    assert (records["n_tokens"] == records["max_tokens"]).all()
    assert (out / "timeline.png").exists()
    check_real_trace(out / "trace.json", summary)
    check_real_series(out, path, summary, records)
    # provenance, as the simulator's outputs carry it
    record = provenance(load_scenario(path))
    assert all(s["provenance"] == record and s["scenario_hash"] == scenario_hash(path)
               for s in summary)
    for name in ("requests.parquet", "state.parquet", "utilisation.parquet"):
        assert json.loads(read_metadata(out / name)[PARQUET_KEY]) == record, name
    # the calibration profile it ran with, for `dualpace-sim validate` to compare it with
    assert load_profile(out / RUN_PROFILE) == load_scenario(path).profile
    # every Dense Assist, for the Appendix B calibration (routes (0, 0): Fused-Assist only)
    calls = run_assist_calls(out)
    dualpace = next(s for s in summary if s["policy"] == "dualpace")
    assert len(calls) == dualpace["engine"]["assist_calls"] > 0
    assert {c.path for c in calls} == {"p", "lA"}
    assert all(c.rows >= 1 and c.wait_s >= c.host_s >= 0 and c.cuda_s == 0 for c in calls)
    assert not (out / "assists-vllm.csv").exists()
    # every CPU step, phase by phase (what the profile's stage tables are checked against)
    steps = read_cpu_steps(out / CPU_STEPS_FILE.format(policy="dualpace"))
    assert len(steps) == dualpace["engine"]["cpu_rounds"] > 0
    assert {s.route for s in steps} == {"Fused-Assist"}
    # the executor's assists hold the worker's waits and the results' copies out
    assert sum(s.assists_s for s in steps) >= dualpace["engine"]["cpu_assist_s"]
    for s in steps:
        parts = (s.setup_s, s.pre_layer_s, s.pre_attn_s, s.kv_write_s, s.attention_s,
                 s.assists_s, s.post_s)
        assert s.rows >= 1 and s.context >= s.rows and min(parts) >= 0
        assert s.attention_s > 0 and s.assists_s > 0 and sum(parts) <= s.step_s
    assert not (out / "cpu-steps-vllm.csv").exists()


def test_a_runs_cpu_steps_split_into_their_assists_and_phases(tmp_path):
    """dualpace_sim/validation/analysis/cpu_step_parts.py on a real run: each Fused-Assist step's
    assists (from the assist records) and its phases (from the step records), by batch size,
    beside the model of the profile the run used."""
    out = tmp_path / "real"
    path = scenario(tmp_path, ["dualpace"], route_p=0, route_f=0)
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    done = subprocess.run([sys.executable, "-m", "dualpace_sim.validation.analysis.cpu_step_parts",
                           "--scenario", str(path), "--real", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    rounds = json.loads((out / "summary.json").read_text())[0]["engine"]["cpu_rounds"]
    assert f"{rounds} Fused-Assist steps in {out}" in done.stdout
    assert "the CPU engine's own work, phase by phase" in done.stdout
    assert re.search(r"\n1-15\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+"
                     r"[\d.]+\s+[\d.]+\s+[\d.]+\n", done.stdout), done.stdout


def test_run_takes_the_policies_asked_for_in_the_order_given(tmp_path):
    path = scenario(tmp_path, ["dualpace", "vllm"])
    out = tmp_path / "real"
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--device", "cpu",
                                      "--policy", "vllm", "--policy", "dualpace"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["vllm", "dualpace"]
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "o"),
                                      "--device", "cpu", "--policy", "neo"])
    assert result.exit_code == 2
    assert "error: --policy neo: not in the scenario's policies (dualpace, vllm)" in \
        result.output


def test_policies_run_one_call_at_a_time_land_in_one_folder(tmp_path):
    """`run --policy vllm` then `run --policy dualpace` into one --out keeps both, as one run
    of both writes them; a run of another scenario there is refused, not mixed in."""
    path = scenario(tmp_path, ["dualpace", "vllm"])
    out = tmp_path / "real"
    for policy in ("vllm", "dualpace"):
        result = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--device", "cpu",
                                          "--policy", policy])
        assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["vllm", "dualpace"]
    records = read_records(out / "requests.parquet")
    assert records.groupby("policy").size().to_dict() == {"dualpace": 10, "vllm": 10}
    assert set(read_series(out)) == {"dualpace", "vllm"}
    path.write_text(path.read_text().replace("seed: 2", "seed: 3"))
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--device", "cpu",
                                      "--policy", "vllm"])
    assert result.exit_code == 2
    assert f"--out {out}: holds dualpace of another scenario" in result.output
    assert [s["policy"] for s in json.loads((out / "summary.json").read_text())] == \
        ["vllm", "dualpace"]
    path.write_text(path.read_text().replace("seed: 3", "seed: 2"))
    (out / "requests.parquet").unlink()
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--device", "cpu",
                                      "--policy", "vllm"])
    assert result.exit_code == 2
    assert "requests.parquet: dualpace have a summary but no readable records" in result.output


def check_real_trace(path, summary) -> None:
    """The runtime's timeline: the simulator's tracks, sequential slices per track, inside
    the run, and one slice per CPU round and per Dense Assist the engines counted."""
    events = json.loads(path.read_text())["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "process_name"}
    assert {n for _, n in names} == {f"real-tiny: {s['policy']} (real)" for s in summary}
    for pid, s in enumerate(summary, 1):
        tracks = {e["tid"]: e["args"]["name"] for e in events
                  if e["pid"] == pid and e.get("name") == "thread_name"}
        slices: dict[str, list[tuple[float, float]]] = {}
        for e in events:
            if e["pid"] == pid and e["ph"] == "X":
                assert e["ts"] >= 0 and e["dur"] >= 0
                assert e["ts"] + e["dur"] <= s["engine"]["wall_s"] * 1e6 + 1
                slices.setdefault(tracks[e["tid"]], []).append((e["ts"], e["ts"] + e["dur"]))
        for track, spans in slices.items():
            spans.sort()
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), f"overlap: {track}"
        engine = s["engine"]
        assert len(slices["GPU engine"]) >= 1
        assert len(slices.get("CPU engine", [])) == engine["cpu_rounds"]
        assert len(slices.get("Dense Assist", [])) == engine["assist_calls"]
        if s["policy"] == "dualpace":
            assert engine["cpu_rounds"] > 0 and engine["assist_calls"] > 0


def check_real_series(out, path, summary, records) -> None:
    """A real run's queues and KV over time are the core state replaying its journal through
    fresh schedulers gives, at every call; its utilisation lies in [0, 1], with CPU work where
    the CPU decoded; its trace has the counter tracks; `dualpace-sim plot` draws the panels."""
    loaded = load_scenario(path)
    series = read_series(out)
    assert list(series) == [s["policy"] for s in summary]
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    for pid, (policy, s) in enumerate(series.items(), 1):
        journal = Journal.read(out / JOURNAL_FILE.format(policy=policy))
        pd.testing.assert_frame_equal(s.state, replay_states(journal, loaded, policy))
        assert len(s.state) > 10 and s.state["hbm_kv_blocks"].max() > 0
        assert s.state["hbm_kv_blocks"].max() <= loaded.config.gpu_kv_blocks
        assert (s.state.iloc[-1][list(STATE_COLUMNS)] == 0).all()
        u = s.utilisation
        assert ((u[list(ENGINES)] >= 0) & (u[list(ENGINES)] <= 1)).all(axis=None)
        assert u["gpu"].max() > 0
        cpu_tokens = "C" in "".join(records[records["policy"] == policy]["token_owners"])
        assert (u["cpu"].max() > 0) == cpu_tokens
        kv = [e for e in events if e["pid"] == pid and e.get("name") == "KV blocks"]
        assert [e["args"]["hbm_kv_blocks"] for e in kv] == s.state["hbm_kv_blocks"].tolist()
    result = CliRunner().invoke(sim_app, ["plot", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "plots" / "state_over_time.png").stat().st_size > 1000


def test_assist_block_hands_off_at_a_boundary_and_lets_go_on_stop():
    """CPU-Ready -> GPU-Running -> GPU-Done through the shared block; STOPPED frees a spinner."""
    arena = SharedArena(1 << 16)
    views = [arena.empty(s, d)[0] for s, d in (((5,), torch.int64), ((2, 4), torch.float32),
                                               ((2, 4), torch.float32), ((2, 4), torch.float32),
                                               ((2,), torch.int64))]
    block = AssistBlock(*views)
    server = AssistServer(block, Engines([], 16, 8))

    class FakeGpu:
        cuda = False

        def assist_post_layer(self, hidden, out):
            return out.copy_(hidden.sum(1).long() + 1)

    other = block  # the CPU engine's side (another process in the runtime)
    other.residual[:2] = torch.tensor([[1.0] * 4, [2.0] * 4])
    worker = threading.Thread(target=other.request, args=("lS", -1, 2, lambda: False))
    worker.start()
    while not server.serve(FakeGpu()):
        pass
    worker.join(5)
    assert not worker.is_alive() and block.tokens.tolist() == [5, 9]
    assert server.calls == 1 and server.wait_s >= 0 and not block.ready()
    spinner = threading.Thread(target=lambda: pytest.raises(WorkerStopped, other.request, "p", 0,
                                                            1, lambda: False))
    spinner.start()
    while not block.ready():
        time.sleep(0.001)
    block.stop()
    spinner.join(5)
    assert not spinner.is_alive()

def slow_scenario(tmp_path, policies=("dualpace",)):
    """Enough CPU-resident decoding that the CPU engine is mid-run for several seconds."""
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump({
        "name": "real-tiny-slow",
        "roofline": {"hardware": "rtx4090-xeon4510-12c", "model": "tiny-llama"},
        "policies": list(policies),
        "scheduler": {"gpu_kv_blocks": 10, "host_kv_blocks": 4000, "gpu_token_limit": 64,
                      "cpu_batch_limit": 8, "route_p": 0, "route_f": 0},
        "workload": {"source": "default", "num_requests": 40, "rate": 20.0, "seed": 3,
                     "max_prompt_tokens": 40, "max_output_tokens": 400},
    }))
    return path


def kill_when(pid: int, busy) -> threading.Thread:
    """A started thread that SIGKILLs `pid` once `busy()` holds (or after 60 s)."""

    def kill() -> None:
        deadline = time.monotonic() + 60
        while not busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill)
    killer.start()
    return killer


def _gone(pid: int) -> bool:
    """No such process, or only a zombie (it exited; its parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


def test_a_killed_cpu_worker_ends_the_run_with_a_clear_error(tmp_path):
    runtime = build_runtime(load_scenario(slow_scenario(tmp_path)), "dualpace", "cpu", None)
    pid = runtime.cpu_engine.pid
    killer = kill_when(pid, lambda: runtime.stats.cpu_rounds >= 3)
    with pytest.raises(EngineFailure, match=r"CPU engine failed: .*process \(pid \d+\) died "
                                            r"\(killed by SIGKILL\)"):
        runtime.serve()
    killer.join()
    assert runtime.stats.cpu_rounds >= 3
    assert not runtime.cpu_engine.alive and _gone(pid)
    assert not multiprocessing.active_children()


def test_a_failing_gpu_engine_stops_the_cpu_process_too(tmp_path):
    runtime = build_runtime(load_scenario(slow_scenario(tmp_path)), "dualpace", "cpu", None)
    pid, stages, calls = runtime.cpu_engine.pid, runtime.gpu.stages, []

    def failing(plan, moves=None):
        calls.append(plan)
        if len(calls) > 20:
            raise RuntimeError("CUDA error: an illegal memory access (injected)")
        return stages(plan, moves)

    runtime.gpu.stages = failing
    with pytest.raises(EngineFailure, match=r"GPU engine failed: RuntimeError: CUDA error"):
        runtime.serve()
    assert not runtime.cpu_engine.alive and _gone(pid)
    assert not multiprocessing.active_children()


def test_ctrl_c_stops_both_engines_and_the_cpu_process(tmp_path):
    """SIGINT reaches the whole process group, as from a terminal: the CLI exits with 130 and a
    message, and the CPU engine's process does not outlive it."""
    cmd = [sys.executable, "-c", "from dualpace_hw.cli import main; main()", "run",
           str(slow_scenario(tmp_path)), "--out", str(tmp_path / "out"), "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=default_sigint)
    line = proc.stdout.readline()
    match = re.search(r"CPU engine process (\d+)", line)
    assert match, line + proc.stderr.read()
    pid = int(match.group(1))
    time.sleep(2.0)  # serving
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "interrupted: the engines stopped" in err and "Traceback" not in err
    assert _gone(pid)


def test_replaying_the_journal_reproduces_every_decision(tmp_path):
    """The replay check: the same core fed the runtime's measured times and inputs makes the
    same plans and gives every request the same token times; a changed plan is caught."""
    loaded = load_scenario(scenario(tmp_path, ["dualpace", "vllm"], route_p=0, route_f=0))
    out = tmp_path / "real"
    run_real(loaded, out, "cpu")
    reports = replay_run(out, loaded)
    assert [r.policy for r in reports] == ["dualpace", "vllm"]
    for r in reports:
        assert r.ok and r.records_match, r.line()
        assert r.plans > 10
    journal = Journal.read(out / JOURNAL_FILE.format(policy="dualpace"))
    kinds = {(e.engine, e.call) for e in journal.entries}
    assert {("gpu", "migrations_done"), ("cpu", "apply")} <= kinds, "CPU tier and migrations ran"
    # The runtime decided otherwise than the core would have: the replay says where.
    entry = next(e for e in journal.entries if e.data.get("plan", {}).get("decodes"))
    entry.data["plan"]["decodes"] = entry.data["plan"]["decodes"][::-1] + [999]
    tampered = replay(journal, loaded, "dualpace")
    assert not tampered.ok and "999" in tampered.mismatches[0]


def test_warm_up_captures_the_graphs_of_the_runs_largest_batch_and_context(tmp_path,
                                                                           monkeypatch):
    from dualpace_hw.executors.gpu import GpuExecutor

    asked: list[tuple[int, int]] = []
    real = GpuExecutor.warm_graphs
    monkeypatch.setattr(GpuExecutor, "warm_graphs",
                        lambda self, rows, context: asked.append((rows, context))
                        or real(self, rows, context))
    loaded = load_scenario(scenario(tmp_path, ["vllm"]))
    runtime = build_runtime(loaded, "vllm", "cpu", None)
    runtime.serve()
    longest = max(r.prompt_tokens + r.max_tokens for r in runtime.requests)
    assert asked == [(min(len(runtime.requests), runtime.gpu.pool.n_blocks), longest)]
    assert runtime.stats.graphs_warmed == runtime.stats.graph_captures == 0  # none on the CPU


def test_a_run_stopped_by_sigterm_keeps_what_it_did(tmp_path):
    """SIGTERM mid-run (a `timeout`, a scheduler's kill): the policy's records, journal and a
    summary marked partial are written before the process exits, and the simulator's plot and
    validate read them, saying the run is partial."""
    out = tmp_path / "real"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "real-tiny-slow", "policies": ["dualpace"],
        "roofline": {"hardware": "rtx4090-xeon4510-12c", "model": "tiny-llama"},
        "scheduler": {"gpu_kv_blocks": 10, "host_kv_blocks": 400, "gpu_token_limit": 16,
                      "cpu_batch_limit": 4},
        # arrivals over ~40 s: the run is still going when the signal comes
        "workload": {"source": "default", "num_requests": 40, "rate": 1.0, "seed": 2,
                     "max_prompt_tokens": 40, "max_output_tokens": 24},
    }))
    cmd = [sys.executable, "-c", "from dualpace_hw.cli import main; main()", "run", str(path),
           "--out", str(out), "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "dualpace: CPU engine process ..." once it serves
        assert "CPU engine process" in line, line + proc.stderr.read()
        time.sleep(8.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary[0]["partial"] is True and "SIGTERM" in summary[0]["stopped_by"]
    assert 0 < summary[0]["completed"] < summary[0]["submitted"] == 40
    engine = summary[0]["engine"]
    assert engine["wall_s"] > 5 and sum(engine["gc_collections"]) > 0  # the clock it served
    assert engine["gc_collections"][2] == 0  # no full collection while serving
    records = read_records(out / "requests.parquet")
    assert len(records) == 40 and records["n_tokens"].sum() > 0
    assert (out / JOURNAL_FILE.format(policy="dualpace")).exists()
    sim = [sys.executable, "-c", "from dualpace_sim.cli.main import main; main()"]
    plotted = subprocess.run([*sim, "plot", str(out)], capture_output=True, text=True,
                             timeout=120)
    assert plotted.returncode == 0, plotted.stderr
    assert "dualpace is a partial run (interrupted (signal SIGTERM))" in plotted.stdout
    checked = subprocess.run([*sim, "validate", str(path), "--real", str(out)],
                             capture_output=True, text=True, timeout=300)
    assert "dualpace is a partial run" in checked.stdout + checked.stderr, checked.stderr
    assert "Traceback" not in checked.stderr
