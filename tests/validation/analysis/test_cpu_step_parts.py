"""`python -m dualpace_sim.validation.analysis.cpu_step_parts` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

import re

from tests.validation.analysis.running import run


def test_cpu_step_parts_are_the_documented_ones(azure_dir):
    """Session 19's sustained-r3 against the profile it ran with (its CPU tables are the
    ones it was calibrated into): the CPU engine's own work 1.19-1.24x its model (1.14-1.20x
    with the log-log attention reading before session 24), the excess in attention from 64
    rows (1.28x; 1.22x then) and in
    pre-attention at few rows (1.20x)."""
    out = run("cpu_step_parts", "--scenario",
              "scenarios/h200/cpu-busy/llama-3.1-8b-sustained-r3.yaml", "--real",
              "docs/validation/cpu-busy/session19/sustained-r3/real", "--costs",
              "docs/validation/cpu-busy/session19/sustained-r3/real/profile.yaml",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "1053 Fused-Assist steps" in out, out
    assert re.search(r"64-127\s+321\s+313\.4\s+29\.2\s+24\.1\s+11\.6\s+2\.07\s+284\.1\s+230\.0"
                     r"\s+1\.24", out), out
    assert re.search(r"1-15\s+265\s+36\.2\s+30\.2\s+1\.20\s+21\.1\s+20\.6\s+1\.02", out), out
    assert re.search(r"64-127\s+321\s+80\.1\s+75\.1\s+1\.07\s+195\.9\s+153\.6\s+1\.28", out), out
