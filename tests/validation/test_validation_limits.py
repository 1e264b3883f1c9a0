"""`dualpace-sim validate --max-rel-error / --limit`: a validation as a pass/fail check.

The end-to-end tests use a committed real run of the reference box (docs/validation/r8/real,
inside every target), copied, and a tampered copy of it whose DualPace tokens came 1.5x later.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.results.records import read_records, write_records
from dualpace_sim.validation.limits import HEADLINE, describe, find_misses, parse_limits
from dualpace_sim.validation.validate import COLUMNS, ValidateError
from tests.conftest import REPO_ROOT

runner = CliRunner()

COMMITTED = REPO_ROOT / "docs/validation/r8/real"
SCENARIO = REPO_ROOT / "scenarios/h200/validation/llama-3.1-8b-r8.yaml"


def test_max_rel_error_limits_the_headline_metrics_and_doubles_for_the_tails():
    assert parse_limits("0.1", []) == pytest.approx({
        "throughput_tok_s": 0.1, "normalized_latency_s": 0.1,
        "p99_ttft_s": 0.2, "p99_itl_s": 0.2, "p99_tpot_s": 0.2})
    assert parse_limits(None, []) == {}  # nothing asked, nothing checked


def test_limit_replaces_or_adds_one_metric():
    limits = parse_limits("0.1", ["p99_ttft_s=0.5", "cpu_token_fraction = 0.1"])
    assert limits["p99_ttft_s"] == 0.5 and limits["cpu_token_fraction"] == 0.1
    assert limits["normalized_latency_s"] == 0.1 and len(limits) == len(HEADLINE) + 1
    assert parse_limits(None, ["makespan_s=0.05"]) == {"makespan_s": 0.05}  # alone: only these


@pytest.mark.parametrize(("max_rel_error", "limits", "message"), [
    ("-0.1", [], "--max-rel-error: '-0.1' must be a finite fraction >= 0"),
    ("ten", [], "--max-rel-error: 'ten' is not a number"),
    ("nan", [], "--max-rel-error: 'nan' must be a finite fraction"),
    (None, ["p99_ttft_s"], "--limit 'p99_ttft_s': expected METRIC=FRACTION"),
    (None, ["p99_ttfs=0.2"], "--limit 'p99_ttfs=0.2': unknown metric 'p99_ttfs'; one of"),
    (None, ["p99_ttft_s=x"], "--limit p99_ttft_s: 'x' is not a number"),
    (None, ["p99_ttft_s=-1"], "--limit p99_ttft_s: '-1' must be a finite fraction >= 0"),
    (None, ["p99_ttft_s=0.2", "p99_ttft_s=0.3"],
     "--limit 'p99_ttft_s=0.3': p99_ttft_s is limited twice"),
])
def test_bad_limits_are_refused(max_rel_error, limits, message):
    with pytest.raises(ValidateError) as info:
        parse_limits(max_rel_error, limits)
    assert str(info.value).startswith(message), str(info.value)


def table(*rows: tuple[str, str, float, float, float]) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(COLUMNS))


def test_misses_are_the_errors_beyond_their_limits_and_the_undefined_ones():
    t = table(("dualpace", "normalized_latency_s", 0.9, 1.0, -0.1),   # on the limit: passes
              ("dualpace", "p99_itl_s", 0.7, 1.0, -0.3),              # beyond: a miss
              ("dualpace", "makespan_s", 2.0, 1.0, 1.0),              # not limited
              ("vllm", "throughput_tok_s", math.nan, 1.0, math.nan),  # undefined: a miss
              ("vllm", "p99_ttft_s", 1.0, 0.0, math.inf))             # infinite: a miss
    limits = {"normalized_latency_s": 0.1, "p99_itl_s": 0.2, "throughput_tok_s": 0.1,
              "p99_ttft_s": 0.2}
    misses = find_misses(t, limits)
    assert [(m.policy, m.metric) for m in misses] == [
        ("dualpace", "p99_itl_s"), ("vllm", "throughput_tok_s"), ("vllm", "p99_ttft_s")]
    assert misses[0].line() == ("miss: dualpace p99_itl_s -30.0% (simulated 0.7, real 1; "
                                "limit ±20%)")
    assert "throughput_tok_s undefined" in misses[1].line()
    assert describe(limits) == ("normalized_latency_s, throughput_tok_s ±10%; "
                                "p99_itl_s, p99_ttft_s ±20%")


def invoke(*args):
    return runner.invoke(app, ["validate", *map(str, args)])


@pytest.mark.parametrize("args, message", [
    (["--max-rel-error", "-0.1"], "--max-rel-error: '-0.1' must be a finite fraction >= 0"),
    (["--max-rel-error", "0.1x"], "--max-rel-error: '0.1x' is not a number"),
    (["--limit", "p99_ttft_s=lots"], "--limit p99_ttft_s: 'lots' is not a number"),
])
def test_bad_values_exit_2_with_one_line_before_simulating(tmp_path, args, message):
    # The real directory does not exist: the value is refused before anything is read.
    result = invoke(SCENARIO, "--real", tmp_path / "no-run", *args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.output


def test_a_committed_run_inside_its_targets_passes(azure_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("DUALPACE_AZURE_DIR", str(azure_dir))
    real = tmp_path / "real"
    shutil.copytree(COMMITTED, real)
    result = invoke(SCENARIO, "--real", real, "--out", tmp_path / "v", "--max-rel-error", "0.1")
    assert result.exit_code == 0, result.output
    assert "miss:" not in result.output
    assert ("within limits: all 10 checks (throughput_tok_s, normalized_latency_s ±10%; "
            "p99_ttft_s, p99_itl_s, p99_tpot_s ±20%)") in result.output
    assert result.output.count("reproduced exactly") == 2  # the replay check ran and passed


def test_a_tampered_run_fails_even_when_quiet(azure_dir, monkeypatch, tmp_path):
    """DualPace's tokens 1.5x later after each arrival: its latencies are 1/1.5 - 1 = -33 % off
    (vLLM's untouched). The journals are left out, so the replay check (which would diverge
    from the tampered records) cannot be what fails."""
    monkeypatch.setenv("DUALPACE_AZURE_DIR", str(azure_dir))
    real = tmp_path / "real"
    shutil.copytree(COMMITTED, real, ignore=shutil.ignore_patterns("journal-*"))
    df = read_records(real / "requests.parquet")
    slow = df["policy"] == "dualpace"
    df.loc[slow, "token_times_s"] = pd.Series(
        [a + 1.5 * (np.asarray(t) - a)
         for a, t in zip(df.loc[slow, "arrival_s"], df.loc[slow, "token_times_s"], strict=True)],
        index=df.index[slow])
    df.loc[slow, "first_token_s"] = [t[0] for t in df.loc[slow, "token_times_s"]]
    df.loc[slow, "finish_s"] = [t[-1] for t in df.loc[slow, "token_times_s"]]
    write_records(df, real / "requests.parquet")

    result = invoke(SCENARIO, "--real", real, "--out", tmp_path / "v", "--max-rel-error", "0.1",
                    "--quiet")
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    v = pd.read_csv(tmp_path / "v" / "validation.csv")
    limits = parse_limits("0.1", [])
    beyond = v[v["metric"].isin(list(limits))
               & (v["relative_error"].abs() > v["metric"].map(limits))]
    assert set(beyond["policy"]) == {"dualpace"}
    assert {"normalized_latency_s", "p99_itl_s", "p99_tpot_s"} <= set(beyond["metric"])
    # --quiet: no table and no notes, one line per miss (in the CSV's order), then the verdict
    assert len(lines) == len(beyond) + 1, result.output
    for line, row in zip(lines, beyond.itertuples(), strict=False):
        assert line.startswith(f"miss: dualpace {row.metric} {row.relative_error:+.1%} "), line
    assert lines[-1] == (f"validation failed: {len(beyond)} of 10 checks outside their limits "
                         "(throughput_tok_s, normalized_latency_s ±10%; p99_ttft_s, p99_itl_s, "
                         "p99_tpot_s ±20%)")
