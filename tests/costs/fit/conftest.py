"""The fits' shared profile: the RTX 4090 roofline, whose fitted controls are known."""

from pathlib import Path

import pytest

from dualpace_sim.costs import load_profile

ROOT = Path(__file__).resolve().parents[3]
RTX4090 = ROOT / "calibration/roofline/rtx4090-xeon4510-12c/llama-3.1-8b.yaml"


@pytest.fixture(scope="module")
def rtx():
    return load_profile(RTX4090)
