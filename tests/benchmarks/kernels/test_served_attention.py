"""The served-attention benchmark (benchmarks/kernels/served_attention.py) runs end to end on a
tiny real run: it replays the run's journal, times the sampled CPU steps' own block tables
beside the profiler's measurement and the table, floating and pinned, and writes each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
COLUMNS = {"recorded", "table", "table_linear_context", "profiler_floating", "served_floating",
           "profiler_pinned", "served_pinned"}


def hw(*args: str) -> subprocess.CompletedProcess:
    """`dualpace-hw ARGS` in a process of its own (the profiler pins the process's cores)."""
    return subprocess.run([sys.executable, "-c", "from dualpace_hw.cli import main; main()",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_the_benchmark_times_a_runs_own_cpu_steps_beside_the_profilers(tmp_path):
    profile = tmp_path / "tiny.yaml"
    made = hw("profile", "--model", "tiny-llama", "--out", str(profile), "--quick",
              "--gpu-device", "cpu", "--box", "ci-box", "--cpu-cores", "1", "--quiet",
              "--no-calibration")
    assert made.returncode == 0, made.stderr[-2000:]
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "served-attention", "profile": str(profile), "policies": ["dualpace"],
        "scheduler": {"gpu_kv_blocks": 10, "host_kv_blocks": 400, "gpu_token_limit": 16,
                      "cpu_batch_limit": 4, "route_p": 0, "route_f": 0},
        "workload": {"source": "default", "num_requests": 8, "rate": 5000.0, "seed": 2,
                     "max_prompt_tokens": 40, "max_output_tokens": 16}}))
    real = tmp_path / "real"
    served = hw("run", str(scenario), "--out", str(real), "--device", "cpu", "--cpu-cores", "1",
                "--no-cpu-check")
    assert served.returncode == 0, served.stderr[-2000:]

    out = tmp_path / "served.json"
    run = subprocess.run([sys.executable, "-m", "benchmarks.kernels.served_attention",
                          "--scenario", str(scenario), "--real", str(real), "--steps", "5",
                          "--cpu-cores", "1", "--repeats", "1", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["steps"] and all(set(s) >= COLUMNS for s in report["steps"])
    assert all(s[c] > 0 for s in report["steps"] for c in COLUMNS)
    assert "over the table" in report["summary"][0]


def test_a_run_without_cpu_step_records_is_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "benchmarks.kernels.served_attention",
                          "--scenario", "scenarios/quickstart.yaml", "--real", str(tmp_path),
                          "--out", str(tmp_path / "x.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2 and "cpu-steps" in run.stderr and "Traceback" not in run.stderr
