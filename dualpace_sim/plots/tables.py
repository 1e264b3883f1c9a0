"""What the figures plot, made from the tables they read: a sweep's series (one per grid setting,
seeds folded into a mean and its band), the rate a run's timeline is drawn at, and empirical CDFs
thinned to keep PDFs small."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dualpace_sim.results.sweep_dir import grid_columns

CDF_MAX_POINTS = 2000


def series_table(table: pd.DataFrame) -> pd.DataFrame:
    """A sweep.csv frame ready to plot: each grid setting a series of its own (``policy``
    becomes ``dualpace, scheduler.host_kv_blocks=1024``), and several seeds folded into their
    mean with ``<metric>_ci_low`` / ``_ci_high`` (:func:`variance.mean_ci`) columns."""
    from dualpace_sim.results.variance import SEED_KEY, mean_ci

    keys = grid_columns(table)
    grid = [k for k in keys if k != SEED_KEY]
    table = table.copy()
    if grid:
        table["policy"] = [", ".join([str(row["policy"]), *(f"{k}={row[k]}" for k in grid)])
                           for _, row in table.iterrows()]
    metrics = [c for c in table.columns if c not in ("policy", "rate", *keys)]
    if SEED_KEY not in keys:
        return table.drop(columns=grid)
    rows = []
    for (policy, rate), points in table.groupby(["policy", "rate"], sort=False):
        row = {"policy": policy, "rate": rate}
        for metric in metrics:
            row[metric], row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = mean_ci(
                points[metric].to_numpy(float))
        rows.append(row)
    return pd.DataFrame(rows)

def default_timeline_rate(table: pd.DataFrame, target: float) -> float:
    """The highest swept rate at which every policy meets the normalized-latency target, else
    the lowest swept rate."""
    rates = sorted(set(table["rate"].astype(float)))
    policies = set(table["policy"])
    best = None
    for rate in rates:
        rows = table[np.isclose(table["rate"].astype(float), rate)]
        ok = rows[rows["normalized_latency_s"].astype(float) <= target]
        if set(ok["policy"]) >= policies:
            best = rate
    return rates[0] if best is None else best

def empirical_cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF, sampled at most ``CDF_MAX_POINTS`` order statistics to keep PDFs small."""
    values = np.sort(values)
    fraction = np.arange(1, values.size + 1) / max(values.size, 1)
    if values.size > CDF_MAX_POINTS:
        pick = np.linspace(0, values.size - 1, CDF_MAX_POINTS).round().astype(int)
        values, fraction = values[pick], fraction[pick]
    return values, fraction
