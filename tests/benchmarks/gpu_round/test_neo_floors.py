"""The NEO floors benchmark runs end to end (tiny model, CPU device) and writes a profile with
the floor it measured: it must keep working between the sessions that run it on the box."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dualpace_sim.costs import load_profile

ROOT = Path(__file__).resolve().parents[3]


def test_neo_floors_benchmark_measures_the_decode_floor_and_prices_rounds(tmp_path):
    out = tmp_path / "neo.yaml"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_round.neo_floors", "--roofline",
         "rtx4090-xeon4510-12c", "--model", "tiny-llama", "--device", "cpu", "--samples", "1",
         "--rounds", "1", "--batches", "1", "2", "--context", "32", "--write-profile", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    floor = load_profile(out).neo.eager_decode_layer_s
    assert floor > 0 and f"neo.eager_decode_layer_s = {floor * 1e3:.3f} ms" in run.stdout
    assert "neo_floors.py" in load_profile(out).provenance.notes
    assert "1 x 32 tokens" in run.stdout and "2 x 32 tokens" in run.stdout
