"""Arrival processes: normalized Poisson arrivals at an offered rate, or a trace's own times."""

from __future__ import annotations

import math

import numpy as np

from dualpace_sim.workload.spec import WorkloadError


def poisson_arrivals(n: int, rate: float, seed: int | np.random.SeedSequence) -> np.ndarray:
    """Arrival times (s) of ``n`` requests offered at ``rate`` req/s; the first arrives at 0.

    This is the paper's method: draw ``n - 1`` exponential gaps from a fixed seed and rescale them
    so that their mean is exactly ``1 / rate``. The offered rate is then exact rather than a sample
    estimate, and the arrivals for one seed at different rates are scaled copies of each other, so
    a load sweep varies only the load.
    """
    if not _positive_finite(rate):
        raise WorkloadError(f"arrival rate {rate!r} req/s: set workload.rate to a number > 0")
    if n < 0:
        raise WorkloadError(f"asked for {n} arrivals; ask for 0 or more")
    if n <= 1:
        return np.zeros(n)
    gaps = np.random.default_rng(seed).exponential(1.0, size=n - 1)
    gaps *= 1.0 / (rate * gaps.mean())
    return np.concatenate(([0.0], np.cumsum(gaps)))


def trace_arrivals(timestamps_s: np.ndarray, time_scale: float = 1.0) -> np.ndarray:
    """A trace's arrival times relative to its first row, with every gap multiplied by
    ``time_scale`` (0.5 replays the trace twice as fast, i.e. at twice its request rate)."""
    if not _positive_finite(time_scale):
        raise WorkloadError(f"time_scale {time_scale!r}: set workload.time_scale to a number > 0")
    times = np.asarray(timestamps_s, dtype=float)
    if times.size == 0:
        return times.copy()
    return (times - times[0]) * time_scale


def _positive_finite(value: object) -> bool:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number > 0
