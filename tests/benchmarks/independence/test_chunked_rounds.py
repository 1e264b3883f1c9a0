"""The chunked-rounds benchmark runs end to end (tiny model, CPU device), so it keeps working
between the sessions that run it on the accelerator machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_chunked_rounds_benchmark_prints_its_ratio(tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.independence.chunked_rounds", "--model", "tiny-llama",
         "--device", "cpu", "--smoke", "--batch", "2", "--context", "32", "--steps", "2",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "graphs over eager" in run.stdout
    figures = json.loads(out.read_text())
    assert sorted(figures) == ["16+2@32 eager", "16+2@32 graphs"]
    for r in figures.values():
        assert r["round_ms_alone"] > 0 and r["gpu_served_rounds_per_s_beside_fused"] > 0
