"""The sampling-cost benchmark runs end to end (tiny model, CPU device): it must keep working
between the sessions that run it on the accelerator machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_sampling_cost_benchmark_prints_each_kind_beside_its_round(tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.kernels.sampling", "--roofline",
         "rtx4090-xeon4510-12c", "--model", "tiny-llama", "--device", "cpu", "--batches", "1",
         "3", "--rounds", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "worst ratio" in run.stdout
    report = json.loads(out.read_text())
    assert set(report["figures"]) == {f"{b} {kind}" for b in (1, 3) for kind in (
        "temperature 1", "top-p 0.9, top-k 50", "top-p 0.9", "top-p 0.9, flat")}
    assert all(f["sampling_s"] > 0 and f["round_s"] > 0 for f in report["figures"].values())
    assert report["worst_ratio"] == max(f["ratio"] for f in report["figures"].values())
