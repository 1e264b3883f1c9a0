"""The CPU attention benchmark (benchmarks/kernels/cpu_attention.py) runs end to end in its quick
mode: it must keep working between the sessions that run it on the accelerator machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_cpu_kernels_benchmark_sets_attention_beside_the_read_bandwidth(tmp_path):
    out = tmp_path / "cpu_kernels.md"
    run = subprocess.run([sys.executable, "-m", "benchmarks.kernels.cpu_attention", "--quick",
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.with_suffix(".json").read_text())
    summary = report["summary"]
    assert 0 < summary["attention_pct_read_bw_min"] <= summary["attention_pct_read_bw_max"]
    assert "attention_target_75pct_met" in summary
    assert "Made by `python -m benchmarks.kernels.cpu_attention`" in out.read_text()
