"""What the three fits share: the batch-size grids they sweep and the error of a profile that
cannot be fitted."""

from __future__ import annotations

from collections.abc import Sequence

from dualpace_sim.costs.profile import Profile


class FitError(ValueError):
    """The profile cannot support a fit (too few points, an unreachable latency target ...)."""


def profile_batch_sizes(profile: Profile) -> list[int]:
    """B: the integer batch sizes of the profile's CPU post_attn table."""
    xs = profile.cpu.post_attn.x
    out = sorted({int(round(x)) for x in xs if x >= 1})
    if len(out) < 1:
        raise FitError("cpu.post_attn.x holds no batch size >= 1")
    return out


def check_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    """The sizes as ints, refused unless positive and strictly increasing."""
    bs = [int(b) for b in batch_sizes]
    if not bs:
        raise ValueError("need at least one batch size")
    if any(b < 1 for b in bs) or any(b2 <= b1 for b1, b2 in zip(bs, bs[1:], strict=False)):
        raise ValueError(f"batch sizes must be positive and strictly increasing, got {bs}")
    return bs
