"""`python -m dualpace_sim.validation.analysis.sim_vs_real_rounds` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

import re

from tests.validation.analysis.running import run


def test_sim_vs_real_rounds_are_the_documented_ones(azure_dir):
    """The session-12 tables, simulated and priced with the run's own profile: w2-r3's prefill
    rounds (simulated 30.6 ms, real 66.1 ms, model 27.5 ms for 256-1,023-token rounds with a
    Prefill-to-CPU chunk; 30.9 ms simulated with the log-log attention reading before session
    24) and their excess."""
    out = run("sim_vs_real_rounds", "--scenario",
              "scenarios/h200/cpu-busy/llama-3.1-8b-w2-r3.yaml", "--real",
              "docs/validation/cpu-busy/w2-r3/real", "--costs",
              "docs/validation/cpu-busy/w2-r3/real/profile.yaml",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert re.search(r"256-1,023, to CPU\s+42\s+30\.6\s+38\s+66\.1\s+27\.5", out), out
    assert re.search(r"CPU busy, to CPU\s+129\s+1\.00", out), out
    assert re.search(r"16-63\s+367\s+0\.185\s+360\s+0\.189", out), out
