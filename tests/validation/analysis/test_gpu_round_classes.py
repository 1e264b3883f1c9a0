"""`python -m dualpace_sim.validation.analysis.gpu_round_classes` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

import re

from tests.validation.analysis.running import run


def test_gpu_round_classes_are_the_documented_ones(azure_dir):
    env = {"DUALPACE_AZURE_DIR": str(azure_dir)}
    out = run("gpu_round_classes", "8", env=env)
    assert re.search(r"8  vllm +prefill, >= 1,024 +54 +5\.33 +5\.51 +0\.98", out)
    two = run("gpu_round_classes", "--scenario",
              "scenarios/h200x2/validation/qwen3-14b-r4.yaml", "--real",
              "docs/validation/h200x2/r4/real", env=env)
    assert re.search(r"-  vllm +decode only +2086 +16\.53 +14\.36 +1\.15", two)
    assert re.search(r"-  dualpace +decode only +1988 +16\.44 +13\.69 +1\.19", two)
    # priced with the re-profile that has gpu.rank_round at the model's depth
    costed = run("gpu_round_classes", "--scenario",
                 "scenarios/h200x2/validation/qwen3-14b-r4.yaml", "--real",
                 "docs/validation/h200x2/r4/real", "--costs",
                 "calibration/h200x2-xeon32/qwen3-14b.yaml", env=env)
    assert re.search(r"-  vllm +decode only +2086 +16\.53 +16\.09 +1\.03", costed)
    # the CPU-busy run: DualPace's slow prefill rounds are the Prefill-to-CPU ones
    busy = run("gpu_round_classes", "--scenario",
               "scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml", "--real",
               "docs/validation/cpu-busy/session9/r3/real", env=env)
    assert re.search(r"-  dualpace >= 1,024, to CPU +50 +5\.45 +2\.09 +2\.50", busy)
    assert re.search(r"-  dualpace >= 1,024, GPU only +26 +1\.23 +1\.07 +1\.13", busy)
