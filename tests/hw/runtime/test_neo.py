"""NEO on the real runtime, on the CPU with a tiny model: its pipelined iterations (CPU
attention of CPU-resident requests beside the GPU's linear work), GPU-only iterations, swaps and
CPU prefills, every request with the greedy tokens of a dense forward, and its journal
replayed through a fresh NEO scheduler to the same plans."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from dualpace_hw.serving.serve import build_runtime
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.core import Owner
from dualpace_sim.core.journal import JOURNAL_FILE, Journal
from dualpace_sim.results.records import read_records, records_frame
from dualpace_sim.results.replay import replay, replay_run
from tests.hw.scenarios import tiny_scenario

from .test_engines import check_reference_tokens


def neo_scenario(tmp_path, policies=("neo",), **neo) -> object:
    """Tiny pools (10 HBM blocks, 400 host): prompts overflow to the host and decodes swap;
    NEO's launch term 0, so the tiny model's microsecond layers can hide CPU attention."""
    path = tiny_scenario(tmp_path / "s.yaml", "tiny-llama", list(policies), "real-tiny-neo",
                         {"num_requests": 10, "rate": 5000.0, "seed": 2,
                          "max_prompt_tokens": 40, "max_output_tokens": 24})
    spec = yaml.safe_load(path.read_text())
    spec["neo"] = {"launch_s": 0.0, **neo}
    path.write_text(yaml.safe_dump(spec))
    return path


def test_neo_serves_every_request_the_reference_tokens_through_its_pipeline(tmp_path):
    loaded = load_scenario(neo_scenario(tmp_path))
    runtime = build_runtime(loaded, "neo", "cpu", None)
    requests = runtime.serve()
    owners = check_reference_tokens(loaded, runtime, requests)
    st = runtime.stats
    assert owners.count(Owner.CPU) == st.cpu_decode_tokens > 0, "CPU attention decoded some"
    assert 0 < st.pipelined_iterations < st.gpu_rounds, "pipelined and GPU-only iterations"
    assert st.cpu_rounds <= st.pipelined_iterations  # CPU decodes run in pipelined ones only
    assert st.swap_outs > 0 and st.swap_ins > 0 and st.prefills_to_cpu > 0
    assert st.cpu_busy_s > 0
    shape = loaded.profile.model
    per_row = 2 * st.cpu_decode_tokens * shape.n_layers  # bf16, every layer
    assert st.activations_to_host_bytes == per_row * (shape.q_dim + 2 * shape.kv_dim)
    assert st.activations_to_gpu_bytes == per_row * shape.q_dim
    runtime.sched.check_invariants()
    assert runtime.sched.hbm.used == runtime.sched.host.used == 0
    # the journal, replayed through a fresh scheduler at the measured times, makes every plan
    report = replay(runtime.journal, loaded, "neo", records_frame(requests, "neo"))
    assert report.ok and report.records_match, report.line()
    assert report.plans == len([e for e in runtime.journal.entries if e.call == "schedule"])


def test_a_tampered_neo_journal_diverges(tmp_path):
    loaded = load_scenario(neo_scenario(tmp_path))
    runtime = build_runtime(loaded, "neo", "cpu", None)
    runtime.serve()
    journal = runtime.journal
    entry = next(e for e in journal.entries if len(e.data.get("plan", {}).get("batches", [])) == 2)
    entry.data["plan"]["batches"] = entry.data["plan"]["batches"][:1]  # "ran it GPU-only"
    report = replay(journal, loaded, "neo")
    assert not report.ok
    assert f"(gpu schedule at {entry.t:.6f} s)" in report.mismatches[0]


def test_run_policy_neo_writes_what_validate_replays(tmp_path):
    """`dualpace-hw run --policy neo` beside vLLM: records, summary and journal, and the
    replay check of `dualpace-sim validate` passes on both."""
    path = neo_scenario(tmp_path, ("dualpace", "vllm", "neo"))
    out = tmp_path / "real"
    cmd = [sys.executable, "-c", "from dualpace_hw.cli import main; main()", "run", str(path),
           "--out", str(out), "--device", "cpu", "--policy", "neo", "--policy", "vllm",
           "--cpu-cores", "1"]  # NEO's CPU attention on core 0, its engine's threads off it
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "neo: completed=10/10" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["neo", "vllm"]
    neo = summary[0]
    assert neo["real"] and neo["completed"] == neo["submitted"] == 10
    assert neo["engine"]["pipelined_iterations"] > 0 and neo["engine"]["cpu_decode_tokens"] > 0
    assert neo["engine"]["launch_s"] == 0.0  # the scenario's, which the predictor used
    records = read_records(out / "requests.parquet")
    assert (records["n_tokens"] == records["max_tokens"]).all()
    assert Journal.read(out / JOURNAL_FILE.format(policy="neo")).entries
    reports = replay_run(out, load_scenario(path))
    assert [r.policy for r in reports] == ["vllm", "neo"]
    assert all(r.ok and r.records_match for r in reports), [r.line() for r in reports]
    sim = [sys.executable, "-c", "from dualpace_sim.cli.main import main; main()"]
    checked = subprocess.run([*sim, "validate", str(path), "--real", str(out),
                              "--out", str(tmp_path / "v")],
                             capture_output=True, text=True, timeout=300)
    assert "replay check: neo: replayed" in checked.stdout, checked.stdout + checked.stderr
    assert "neo: replayed" in (tmp_path / "v" / "replay.txt").read_text()
    assert "DIVERGED" not in checked.stdout and "Traceback" not in checked.stderr


def test_neo_on_two_gpu_ranks_is_refused_naming_the_flag(tmp_path):
    loaded = load_scenario(neo_scenario(tmp_path))
    with pytest.raises(ValueError, match="--gpu-tp: the real NEO runs on one GPU"):
        build_runtime(loaded, "neo", "cpu", None, gpu_tp=2)
