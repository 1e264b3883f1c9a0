"""Post-attention routing π_{P,F} (paper Eq. 5) and when Dense Assist is reachable at all."""

from __future__ import annotations

from enum import Enum


class Route(str, Enum):
    """Where a CPU decode batch runs its post-attention stages and its post-layer."""

    FULL_CPU = "Full-CPU"  # everything on the CPU
    SPLIT_FINAL = "Split-Final"  # all layers on the CPU, one GPU assist for the post-layer
    FUSED_ASSIST = "Fused-Assist"  # every post-attention stage on the GPU; last one fused


def legal_thresholds(p: int, f: int) -> bool:
    """Legal settings are (0, 0) or 0 <= F < P: the one copy of the rule (the profile's
    controls and the fit read it here)."""
    return (p == 0 and f == 0) or 0 <= f < p


def check_thresholds(p: int, f: int) -> None:
    if not legal_thresholds(p, f):
        raise ValueError(f"illegal routing thresholds (P={p}, F={f}): need (0, 0) or 0 <= F < P")


def route_for(batch: int, p: int, f: int) -> Route:
    """π_{P,F}(b), paper Eq. 5: up to F rows Full-CPU, up to P Split-Final, above Fused-Assist."""
    if batch <= f:
        return Route.FULL_CPU
    if batch <= p:
        return Route.SPLIT_FINAL
    return Route.FUSED_ASSIST


def assist_reachable(largest_cpu_batch: int, f: int) -> bool:
    """With C <= F every reachable batch is Full-CPU, so the GPU may run whole forwards."""
    return largest_cpu_batch > f
