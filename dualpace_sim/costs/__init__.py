"""Costs: calibration profiles, the interpolating cost model and the roofline synthesizer."""

from typing import Any

from dualpace_sim.costs.model import CostExtrapolationWarning, CostModel
from dualpace_sim.costs.profile import Profile, ProfileError, load_profile
from dualpace_sim.costs.shapes import ModelShape

_ROOFLINE = {"HardwareSpec", "load_spec", "synthesize"}

__all__ = [
    "CostExtrapolationWarning",
    "CostModel",
    "HardwareSpec",
    "ModelShape",
    "Profile",
    "ProfileError",
    "load_profile",
    "load_spec",
    "synthesize",
]


def __getattr__(name: str) -> Any:
    # Imported on first use so `python -m dualpace_sim.costs.roofline` does not find its own
    # module already imported by the package (runpy warns about that).
    if name in _ROOFLINE:
        from dualpace_sim.costs import roofline

        return getattr(roofline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
