"""`python -m dualpace_sim.validation.analysis.assist_costs` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

from tests.validation.analysis.running import run


def test_assist_costs_are_the_documented_ones(azure_dir, tmp_path):
    out = run("assist_costs", "--scenario", "scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml",
              "--real", "docs/validation/cpu-busy/session9/r3/real", "--write-profile",
              str(tmp_path / "served.yaml"), env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "17536 assists over 548 CPU steps (median batch 21)" in out
    assert ("served, per assist: stage-boundary wait 0.234 ms, service 0.738 ms, CUDA 0.532 ms,"
            " host part 0.205 ms") in out
    assert "(served CUDA / g = 1.60)" in out
    assert "q = o + wait = 0.440 ms, o = 0.205 ms, g x 1.60" in out
    assert (tmp_path / "served.yaml").exists()
