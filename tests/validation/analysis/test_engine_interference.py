"""`python -m dualpace_sim.validation.analysis.engine_interference` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

import re

from tests.validation.analysis.running import run


def test_engine_interference_is_the_documented_one(azure_dir):
    out = run("engine_interference", "--scenario",
              "scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml", "--real",
              "docs/validation/cpu-busy/session9/r3/real",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert re.search(r"r3 GPU rounds CPU engine idle  : n= +2942 .* median real/model 0\.981",
                     out)
    assert re.search(r"r3 GPU rounds beside a CPU step: n= +10904 .* median real/model 1\.163",
                     out)
    assert ("r3 excess beside a CPU step 11.61 s; the run's 17536 assists were served in "
            "12.94 s: within what the assists cost") in out
