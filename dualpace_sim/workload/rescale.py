"""Rescaling a trace's lengths to a target mean while keeping the trace's shape.

A trace is one sample of a workload; a paper may describe the same kind of workload with other
means (the DualPace paper's Azure-Conversation has prompt and output means of 1599 and 114 where
the 2023 trace's first 2,000 requests have 1105 and 265). Multiplying every length by one factor
keeps everything relative: the order of the requests, the rank correlation of prompt and output,
and each quantile over the mean. Lengths are whole tokens of at least 1, so the factor is found by
bisection on the rounded lengths' mean rather than taken as the ratio of the means.
"""

from __future__ import annotations

import numpy as np


def scaled(lengths: np.ndarray, factor: float) -> np.ndarray:
    """``lengths`` times ``factor``, rounded to whole tokens, at least 1."""
    return np.maximum(np.rint(lengths * factor), 1).astype(np.int64)


def rescale_to_mean(lengths: np.ndarray, target: float) -> np.ndarray:
    """``lengths`` scaled by the one factor whose rounded result has mean closest to
    ``target`` (within half a token, or as near as the floor of 1 token allows)."""
    lengths = np.asarray(lengths, dtype=float)
    lo, hi = 0.0, 2.0 * target / lengths.mean() + 1.0
    for _ in range(60):  # the rounded mean never falls as the factor grows
        mid = (lo + hi) / 2
        if scaled(lengths, mid).mean() < target:
            lo = mid
        else:
            hi = mid
    below, above = scaled(lengths, lo), scaled(lengths, hi)
    return below if target - below.mean() < above.mean() - target else above
