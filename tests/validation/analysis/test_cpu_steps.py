"""`python -m dualpace_sim.validation.analysis.cpu_steps` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

import re

from tests.validation.analysis.running import run


def test_cpu_step_figures_are_the_documented_ones(azure_dir):
    out = run("cpu_steps", "8", "12", env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert re.search(r"8  Fused-Assist +1-3 +4 +1\.27", out)
    assert re.search(r"12  Fused-Assist +4-15 +17 +1\.64", out)
