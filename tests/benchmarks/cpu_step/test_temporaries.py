"""The allocator benchmark runs end to end on a tiny model and prints the ratio it is judged by."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_cpu_temporaries_benchmark_prints_its_ratio(tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.cpu_step.temporaries", "--model",
         "tiny-llama", "--rows", "1", "64", "--calls", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "defaults / kept at >= 64 rows: median" in run.stdout
    figures = json.loads(out.read_text())["figures"]
    assert set(figures) == {"glibc defaults", "freed memory kept"}
    for mode in figures.values():
        assert mode["64"]["pre_attn"][0] > 0 and mode["64"]["rope"][0] > 0
