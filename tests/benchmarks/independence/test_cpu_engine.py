"""The independence benchmark runs end to end (tiny model, CPU device): it must keep working
between the sessions that run it on the accelerator machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_cpu_independence_benchmark_prints_its_ratio(tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.independence.cpu_engine", "--model",
         "tiny-llama", "--device", "cpu", "--steps", "2", "--batch", "2", "--context", "32",
         "--gpu-chunk", "16", "--gpu-decodes", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "CPU engine decode rate kept while the GPU engine is saturated" in run.stdout
    assert "served-round rate kept beside Fused-Assist steps" in run.stdout
    figures = json.loads(out.read_text())
    for key in ("cpu_process_steps_per_s_alone", "cpu_process_steps_per_s_gpu_busy",
                "cpu_thread_steps_per_s_alone", "gpu_rounds_per_s_alone",
                "gpu_served_rounds_per_s_alone", "gpu_served_rounds_per_s_beside_fused",
                "gpu_served_rounds_per_s_beside_fused_compute_stream",
                "cpu_fused_steps_per_s_alone", "cpu_fused_steps_per_s_gpu_busy"):
        assert figures[key] > 0, key
