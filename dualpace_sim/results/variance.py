"""Confidence intervals over a sweep's seeds: how much of a result is the workload's draw.

A sweep with ``seeds: [...]`` runs every point once per workload seed. Each metric's interval
is a percentile bootstrap (``scipy.stats.bootstrap``) of its mean over the seeds; the
sustainable rate's is a bootstrap of the rate read off the seed-mean latency curve, each
resample re-drawing which seeds make up the mean. The resampling is seeded, so the same sweep
gives the same intervals. Intervals are NaN with one seed, where there is nothing to resample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from dualpace_sim.results.metrics import sustainable_rate

SEED_KEY = "workload.seed"  # the grid key (and sweep.csv column) of a sweep's seeds
CONFIDENCE = 0.95
RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def _rng() -> np.random.Generator:
    return np.random.default_rng(BOOTSTRAP_SEED)


def mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """The mean of ``values`` (one per seed, NaN ones left out) and its bootstrap interval."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    if v.size == 1 or np.all(v == v[0]):
        low = high = math.nan if v.size == 1 else float(v[0])
        return float(v.mean()), low, high
    res = bootstrap((v,), np.mean, confidence_level=CONFIDENCE, n_resamples=RESAMPLES,
                    method="percentile", rng=_rng())
    interval = res.confidence_interval
    return float(v.mean()), float(interval.low), float(interval.high)


def _numeric_rate(found: float | str, rates: np.ndarray) -> float:
    """A sustainable rate as a number for resampling: beyond the sweep, its edge."""
    if found == "above_sweep":
        return float(rates[-1])
    if found == "below_sweep":
        return float(rates[0])
    return float(found)


def sustainable_ci(
    rates: np.ndarray, values: np.ndarray, target: float
) -> tuple[float | str, float, float]:
    """The sustainable rate of the seed-mean curve (``values[i, j]``: rate ``i``, seed ``j``)
    and its bootstrap interval over seeds; a rate beyond the sweep counts as its edge there."""
    with np.errstate(invalid="ignore"):
        found = sustainable_rate(rates, values.mean(axis=1), target)
    n_seeds = values.shape[1]
    if n_seeds < 2:
        return found, math.nan, math.nan

    def statistic(seeds: np.ndarray) -> float:
        picked = values[:, seeds.astype(int)]
        with np.errstate(invalid="ignore"):
            return _numeric_rate(sustainable_rate(rates, picked.mean(axis=1), target), rates)

    samples = np.array([statistic(s) for s in
                        _rng().integers(0, n_seeds, size=(RESAMPLES, n_seeds))])
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return found, float(low), float(high)


def ci_table(table: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """sweep_ci.csv's frame: for each point without its seed (policy, rate, grid setting) and
    each metric column of ``table`` (sweep.csv), the mean over seeds and its interval."""
    by = ["policy", "rate", *(k for k in keys if k != SEED_KEY)]
    metrics = [c for c in table.columns if c not in (*by, SEED_KEY)]
    rows = []
    for group, points in table.groupby(by, sort=True, dropna=False):
        labels = dict(zip(by, group, strict=True))
        for metric in metrics:
            mean, low, high = mean_ci(points[metric].to_numpy(float))
            rows.append({**labels, "metric": metric, "mean": mean, "ci_low": low,
                         "ci_high": high, "n_seeds": int(points[metric].notna().sum())})
    return pd.DataFrame(rows, columns=[*by, "metric", "mean", "ci_low", "ci_high", "n_seeds"])
