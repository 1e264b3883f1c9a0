"""`python -m dualpace_sim.validation.analysis.prefill_excess` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

import re

from tests.validation.analysis.running import run


def test_prefill_excess_is_the_documented_one(azure_dir):
    """sustained-r5's eager prefill rounds: a step of about 20 ms once assists flow, not a cost
    a assist; its decode rounds' excess grows with the assists inside them."""
    out = run("prefill_excess", "--scenario",
              "scenarios/h200/cpu-busy/llama-3.1-8b-sustained-r5.yaml", "--real",
              "docs/validation/cpu-busy/sustained-r5/real", "--costs",
              "docs/validation/cpu-busy/sustained-r5/real/profile.yaml",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "prefill rounds (eager): 448; excess = 9.22 ms + 0.661 ms a assist" in out, out
    assert re.search(r"0-0\.5\s+50\s+0\.00\s+1\.48", out), out
    assert re.search(r"2-5\s+210\s+3\.48\s+21\.03", out), out
    assert re.search(r"0\.5-2\s+10196\s+0\.89\s+0\.75", out), out
