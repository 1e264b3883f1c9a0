"""The GPU-host floor benchmark runs end to end (tiny model, CPU device): it must keep working
between the sessions that run it on the accelerator machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for each engine")
def test_gpu_host_floor_benchmark_prints_each_way_of_running_the_round(tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_round.host_floor", "--roofline",
         "rtx4090-xeon4510-12c", "--model", "tiny-llama", "--device", "cpu", "--cpu-cores", "1",
         "--rounds", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    figures = json.loads(out.read_text())["per_layer_s"]
    assert list(figures) == ["layer, back to back (the profile's)", "round, all cores (vLLM)",
                             "round, cores left",
                             "DualPace's loop, cores left, CPU engine idle"]
    assert all(v > 0 for v in figures.values())
    assert "DualPace's loop, cores left, CPU engine idle" in run.stdout
