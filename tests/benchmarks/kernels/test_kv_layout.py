"""The KV-layout benchmark (benchmarks/kernels/kv_layout.py) runs end to end on a tiny model and
writes every layout's time, so that it keeps working between the sessions that run it on the box."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LAYOUTS = {"profiler", "private_contiguous", "shared_contiguous", "shared_scattered",
           "shared_scattered_varlen", "huge_scattered", "huge_contiguous"}


def test_kv_layout_benchmark_times_every_layout_against_the_profilers(tmp_path):
    out = tmp_path / "kv_layout.json"
    run = subprocess.run([sys.executable, "-m", "benchmarks.kernels.kv_layout", "--model",
                          "tiny-llama", "--blocks", "64", "--batches", "2", "--context", "40",
                          "--cpu-cores", "1", "--repeats", "1", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["per_layer_s"]["2"]) >= LAYOUTS
    assert all(t > 0 for t in report["per_layer_s"]["2"].values())
    assert report["over_profiler"]["2"]["profiler"] == 1.0
    assert report["host_read_bytes_per_s"] > 0


def test_kv_layout_benchmark_refuses_a_pool_too_small_for_the_batch(tmp_path):
    run = subprocess.run([sys.executable, "-m", "benchmarks.kernels.kv_layout", "--model",
                          "tiny-llama", "--blocks", "4", "--batches", "8", "--context", "64",
                          "--cpu-cores", "1", "--out", str(tmp_path / "x.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2 and "--blocks" in run.stderr and "Traceback" not in run.stderr
