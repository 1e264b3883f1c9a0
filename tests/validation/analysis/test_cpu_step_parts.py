"""`python -m dualpace_sim.validation.analysis.cpu_step_parts` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

import re

from tests.validation.analysis.running import run


def test_cpu_step_parts_are_the_documented_ones(azure_dir):
    """Session 16's sustained-r5: the assists' CUDA intervals as served run 1.25-1.85x the
    profile's idle-GPU g_x, and the CPU engine's own work 1.03-1.18x its model."""
    out = run("cpu_step_parts", "--scenario",
              "scenarios/h200/cpu-busy/llama-3.1-8b-sustained-r5.yaml", "--real",
              "docs/validation/cpu-busy/session16/sustained-r5/real", "--costs",
              "calibration/h200-spr16/llama-3.1-8b.yaml",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "670 Fused-Assist steps" in out, out
    assert re.search(r"64-127\s+133\s+356\.9\s+40\.1\s+32\.6\s+17\.6\s+1\.85\s+316\.8\s+271\.2"
                     r"\s+1\.17", out), out
    assert re.search(r">= 180\s+95\s+601\.9\s+36\.3\s+30\.6\s+23\.3\s+1\.31\s+565\.7\s+478\.7"
                     r"\s+1\.18", out), out
