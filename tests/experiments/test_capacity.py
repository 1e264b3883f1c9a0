"""`dualpace-sim capacity`: the highest rate meeting every target, by bisection."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.experiments.capacity import bisect_rate, capacity, missed_targets
from dualpace_sim.experiments.study import rate_sweep

runner = CliRunner()


def test_bisection_brackets_the_threshold_within_tol():
    tried = []

    def meets(rate):
        tried.append(rate)
        return rate <= 3.3

    low, high, bound = bisect_rate(meets, 0.5, 8.0, 0.01)
    assert bound == "=" and low <= 3.3 < high and high - low <= 0.01
    assert len(tried) < 15
    assert bisect_rate(lambda r: True, 1, 8, 0.1) == (8, float("inf"), ">=")
    assert bisect_rate(lambda r: False, 1, 8, 0.1) == (1, 1, "<")


def test_missed_targets_counts_nan_as_a_miss():
    targets = {"normalized_latency_s": 1.0, "p99_ttft_s": 5.0}
    summary = {"normalized_latency_s": float("nan"), "p99_ttft_s": 4.0, "p99_itl_s": 9.0}
    assert missed_targets(summary, targets) == ["normalized_latency_s"]


def test_capacity_agrees_with_the_simulator_on_both_sides(write_scenario, tmp_path):
    path = write_scenario(workload={"num_requests": 60}, targets={"p99_ttft_s": 2.0})
    table = capacity(path, low=1.0, high=24.0, tol=0.5)
    row = table.iloc[0]
    assert row.policy == "dualpace" and row.bound == "=" and row.upper - row.rate <= 0.5
    assert "p99_ttft_s" in row.limited_by
    check = rate_sweep(path, [row.rate, row.upper])
    assert check["p99_ttft_s"].iloc[0] <= 2.0 < check["p99_ttft_s"].iloc[1]


def test_capacity_cli_runs_and_writes_csv(write_scenario, tmp_path):
    path = write_scenario(workload={"num_requests": 40})
    result = runner.invoke(app, ["capacity", str(path), "--low", "1", "--high", "4", "--tol",
                                 "1", "-o", str(tmp_path / "c"), "--set",
                                 "targets.p99_ttft_s=100"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("dualpace: at least 4 req/s")
    assert list(pd.read_csv(tmp_path / "c" / "capacity.csv")["policy"]) == ["dualpace"]
    bad = runner.invoke(app, ["capacity", str(path), "--low", "5", "--high", "4"])
    assert bad.exit_code == 2 and "need 0 < --low < --high" in bad.output


@pytest.mark.parametrize("item", ["targets.p99_ttft=1"])
def test_capacity_bad_set_exits_2(write_scenario, item):
    result = runner.invoke(app, ["capacity", str(write_scenario()), "--set", item])
    assert result.exit_code == 2 and "targets.p99_ttft: unknown key" in result.output
