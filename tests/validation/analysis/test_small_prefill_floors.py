"""`python -m dualpace_sim.validation.analysis.small_prefill_floors` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

from tests.validation.analysis.running import run


def test_small_prefill_floors_are_the_documented_ones(azure_dir):
    out = run("small_prefill_floors", "4", env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "4 req/s dualpace CPU step in flight: False n= 45 median 1.45 ms" in out
    assert "4 req/s vllm     CPU step in flight: False n= 44 median 1.55 ms" in out
    two = run("small_prefill_floors", "--scenario",
              "scenarios/h200x2/validation/qwen3-14b-r8.yaml", "--real",
              "docs/validation/h200x2/r8/real", "--costs",
              "calibration/h200x2-xeon32/qwen3-14b.yaml",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "r8 vllm     CPU step in flight: False n= 20 median 2.32 ms" in two
