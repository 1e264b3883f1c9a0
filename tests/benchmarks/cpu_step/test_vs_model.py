"""The CPU-step-vs-model benchmark runs end to end (tiny model, CPU device): it must keep
working between the sessions that run it on the accelerator machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_cpu_step_benchmark_prints_measured_against_the_model(tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.cpu_step.vs_model", "--roofline",
         "rtx4090-xeon4510-12c", "--model", "tiny-llama", "--device", "cpu", "--batches", "1",
         "2", "--context", "32", "--steps", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Fused-Assist step, measured / model: median" in run.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {(r["route"], r["batch"]) for r in rows} == {
        (route, b) for route in ("Full-CPU", "Split-Final", "Fused-Assist") for b in (1, 2)}
    for r in rows:
        assert r["step_s"] > 0 and r["model_step_s"] > 0 and 0 < r["local_s"] <= r["step_s"]
        # every assisted step waited on its assists; Full-CPU on none
        assert (r["per_assist_s"] > 0) == (r["route"] != "Full-CPU")
        # the GPU side served each assist
        assert (r["service_per_assist_s"] > 0) == (r["route"] != "Full-CPU")
        assert r["cuda_per_assist_s"] == 0  # no CUDA here


def test_cpu_step_benchmark_times_only_the_routes_asked_for(tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.cpu_step.vs_model", "--roofline",
         "rtx4090-xeon4510-12c", "--model", "tiny-llama", "--device", "cpu", "--batches", "1",
         "--context", "32", "--steps", "1", "--routes", "Fused-Assist", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert [r["route"] for r in json.loads(out.read_text())["rows"]] == ["Fused-Assist"]
    assert "Full-CPU step" not in run.stdout
