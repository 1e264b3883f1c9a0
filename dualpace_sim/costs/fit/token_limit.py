"""The GPU batched-token limit (paper §4.3).

Single-layer prefill throughput over a (B, L) grid, grouped by n = B·L and averaged, fitted
with a non-decreasing least-squares (isotonic) fit; the plateau is the mean of the last K
fitted points and the limit is the earliest n within δ of it. The generic pieces
(:func:`isotonic_increasing`, :func:`token_limit_from_curve`) take plain numbers so that they
can be tested on hand-made curves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dualpace_sim.costs.fit.grid import FitError, check_batch_sizes
from dualpace_sim.costs.model import CostModel

DEFAULT_PREFILL_BATCHES = tuple(2**i for i in range(7))  # 1..64
DEFAULT_PREFILL_LENGTHS = tuple(2**i for i in range(4, 13))  # 16..4096


def pool_adjacent_violators(y: Sequence[float], w: Sequence[float] | None = None) -> np.ndarray:
    """Pool-adjacent-violators: the weighted least-squares non-decreasing fit of y."""
    ys = [float(v) for v in y]
    ws = [1.0] * len(ys) if w is None else [float(v) for v in w]
    # blocks of (mean, weight, count)
    means: list[float] = []
    weights: list[float] = []
    counts: list[int] = []
    for v, wt in zip(ys, ws, strict=True):
        means.append(v)
        weights.append(wt)
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m2, w2, c2 = means.pop(), weights.pop(), counts.pop()
            m1, w1, c1 = means.pop(), weights.pop(), counts.pop()
            wt_sum = w1 + w2
            means.append((m1 * w1 + m2 * w2) / wt_sum)
            weights.append(wt_sum)
            counts.append(c1 + c2)
    return np.repeat(np.array(means), counts)


def isotonic_increasing(y: Sequence[float], weights: Sequence[float] | None = None) -> np.ndarray:
    """Non-decreasing least-squares fit (scipy's isotonic_regression when present, else PAV)."""
    arr = np.asarray(y, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("need a non-empty 1-D sequence")
    try:
        from scipy.optimize import isotonic_regression  # scipy >= 1.12
    except ImportError:  # pragma: no cover - depends on the installed scipy
        return pool_adjacent_violators(arr, weights)
    w = None if weights is None else np.asarray(weights, dtype=float)
    return np.asarray(isotonic_regression(arr, weights=w, increasing=True).x, dtype=float)


@dataclass
class PlateauFit:
    tokens: list[int]
    mean: list[float]
    fitted: list[float]
    plateau: float
    limit: int
    k: int
    delta: float


def token_limit_from_curve(
    tokens: Sequence[int], mean_throughput: Sequence[float], k: int = 5, delta: float = 0.01
) -> PlateauFit:
    """Isotonic fit of throughput over n; plateau = mean of the last K fitted points; the limit is
    the earliest n whose fitted throughput is at least (1 − δ)·plateau."""
    n = [int(v) for v in tokens]
    y = [float(v) for v in mean_throughput]
    if len(n) != len(y):
        raise ValueError(f"{len(n)} token counts but {len(y)} throughputs")
    if any(b <= a for a, b in zip(n, n[1:], strict=False)):
        raise ValueError("token counts must be strictly increasing")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    if len(n) < k:
        raise FitError(f"need at least k={k} token counts for the plateau, got {len(n)}")
    fitted = isotonic_increasing(y)
    plateau = float(np.mean(fitted[-k:]))
    limit = next(t for t, v in zip(n, fitted, strict=True) if v >= (1.0 - delta) * plateau)
    return PlateauFit(n, y, [float(v) for v in fitted], plateau, limit, k, delta)


@dataclass
class PrefillThroughput:
    """GPU single-layer prefill throughput (tokens/s) on the (B, L) grid and its plateau fit."""

    batches: list[int]
    lengths: list[int]
    throughput: list[list[float]]  # [i_B][j_L]; NaN where B·L lies beyond the profiled tokens
    max_tokens: int
    fit: PlateauFit

    @property
    def limit(self) -> int:
        return self.fit.limit


def prefill_throughput(
    costs: CostModel,
    batches: Sequence[int] = DEFAULT_PREFILL_BATCHES,
    lengths: Sequence[int] = DEFAULT_PREFILL_LENGTHS,
    k: int = 5,
    delta: float = 0.01,
    max_tokens: int | None = None,
) -> PrefillThroughput:
    """Prefill B requests of L tokens through one layer: gpu_layer(B·L, [(L, L)]·B, 0, 0).

    Shapes with B·L beyond ``max_tokens`` (default: the largest token count the profile's GPU
    linear tables cover) are left out, so the fit never rests on extrapolated costs.
    """
    g = costs.profile.gpu
    if max_tokens is None:
        max_tokens = int(min(g.pre_attn.x[-1], g.post_attn.x[-1]))
    bs, ls = check_batch_sizes(batches), check_batch_sizes(lengths)
    grid = [[math.nan] * len(ls) for _ in bs]
    by_n: dict[int, list[float]] = {}
    for i, b in enumerate(bs):
        for j, length in enumerate(ls):
            n = b * length
            if n > max_tokens:
                continue
            t = costs.gpu_layer(n, [(length, length)] * b, 0, 0)
            if t <= 0:
                raise FitError(f"a GPU layer over {b} prompts of {length} tokens costs {t:g} s "
                                 "in this profile; its gpu tables need costs > 0 to be fitted")
            thr = n / t
            grid[i][j] = thr
            by_n.setdefault(n, []).append(thr)
    tokens = sorted(by_n)
    means = [float(np.mean(by_n[n])) for n in tokens]
    return PrefillThroughput(bs, ls, grid, max_tokens, token_limit_from_curve(tokens, means, k,
                                                                               delta))
