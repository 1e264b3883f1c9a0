"""`python -m dualpace_sim.validation.analysis.prefill_grid` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

from tests.validation.analysis.running import run


def test_prefill_grid_error_is_the_documented_one():
    out = run("prefill_grid", "docs/validation/h200x2/r4/real/profile.yaml")
    assert "chunk  2048, context   2048: old grid +43%" in out
    assert "chunk  1024, context   1024: old grid +48%" in out
    assert out.strip().endswith("largest error +48% over 22 points")
