"""Bootstrap intervals over seeds: they bound the mean and shrink as seeds are added."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dualpace_sim.experiments.sweep import run_sweep
from dualpace_sim.results.variance import mean_ci, sustainable_ci


def test_metric_interval_holds_the_mean_and_shrinks_with_more_seeds():
    rng = np.random.default_rng(3)
    draws = rng.normal(10.0, 1.0, size=64)
    widths = []
    for n in (4, 16, 64):
        mean, low, high = mean_ci(draws[:n])
        assert low < mean < high and mean == pytest.approx(draws[:n].mean())
        widths.append(high - low)
    assert widths[0] > widths[1] > widths[2]
    assert mean_ci(draws[:4]) == mean_ci(draws[:4])  # seeded resampling: reproducible
    assert math.isnan(mean_ci([1.0])[1]) and mean_ci([2.0, 2.0]) == (2.0, 2.0, 2.0)


def test_sustainable_rate_interval_shrinks_with_more_seeds():
    """Latency grows linearly with the rate, with a per-seed slope; the target crossing moves
    with the slope, and its interval narrows as more seeds pin the mean slope."""
    rng = np.random.default_rng(5)
    rates = np.array([1.0, 2.0, 4.0, 8.0])
    slopes = rng.normal(0.25, 0.05, size=48)
    widths = []
    for n in (4, 12, 48):
        values = np.outer(rates, slopes[:n])
        rate, low, high = sustainable_ci(rates, values, 1.0)
        assert low <= rate <= high
        widths.append(high - low)
    assert widths[0] > widths[1] > widths[2]


def test_a_seeded_sweep_writes_intervals(write_scenario, tmp_path):
    path = write_scenario(workload={"num_requests": 30},
                          sweep={"rates": [2.0, 8.0], "seeds": [1, 2, 3]})
    result = run_sweep(path, tmp_path / "sw", workers=1, progress=False)
    assert not result.failed and len(result.points) == 6
    assert result.table["workload.seed"].tolist() == [1, 1, 2, 2, 3, 3]
    ci = pd.read_csv(tmp_path / "sw" / "sweep_ci.csv")
    row = ci[(ci["rate"] == 8.0) & (ci["metric"] == "p99_ttft_s")].iloc[0]
    values = result.table[result.table["rate"] == 8.0]["p99_ttft_s"]
    assert row["n_seeds"] == 3 and row["mean"] == pytest.approx(values.mean())
    assert row["ci_low"] <= row["mean"] <= row["ci_high"]
    assert set(ci["metric"]) >= {"goodput_req_s", "p90_e2el_s", "throughput_tok_s"}
    sustainable = pd.read_csv(tmp_path / "sw" / "sustainable.csv")
    assert list(sustainable.columns) == ["policy", "metric", "target", "rate", "rate_ci_low",
                                         "rate_ci_high"]
