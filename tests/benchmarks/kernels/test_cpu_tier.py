"""The CPU-tier report (`benchmarks/kernels/cpu_tier.py`) runs end to end on the CPU device with a
tiny model, so it keeps working between the sessions that run it on the accelerator machine:
here its prefill section, the flash path timed as the runtime issues it beside one synchronous
call."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_cpu_tier_report_prices_prefill_attention_against_the_roofline(tmp_path):
    out = tmp_path / "cpu_tier.md"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.kernels.cpu_tier", "--model", "tiny-llama",
         "--device", "cpu", "--quick", "--sections", "prefill", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads(out.with_suffix(".json").read_text())
    rows = res["prefill"]
    assert [(r["chunk"], r["context"]) for r in rows] == [(512, 2048), (2048, 2048)]
    for r in rows:
        assert r["flash_ms"] > 0 and r["flash_synchronous_ms"] > 0 and r["sdpa_ms"] > 0
        assert math.isclose(r["over_roofline"], r["flash_ms"] / r["roofline_ms"])
    assert res["summary"]["prefill_attn_max_over_roofline"] == max(
        r["over_roofline"] for r in rows)
    assert "one call ms" in out.read_text()
