"""`dualpace-sim validate --max-rel-error`: a validation as a pass/fail check, for a user's CI.

``--max-rel-error FRACTION`` bounds the headline metrics' relative error (simulated − real) /
real: throughput and mean normalized latency at FRACTION, and P99 TTFT, P99 ITL and P99 TPOT at
twice it, because a 99th percentile of a few hundred requests rests on a handful of them and
moves more from run to run (FRACTION 0.1 gives the project's targets, 10 % and 20 %).
``--limit METRIC=FRACTION`` (repeatable) sets one metric's limit instead, and may name any
metric of the validation table (``--limit cpu_token_fraction=0.1``); given alone, only the
metrics it names are checked. Every policy of the real run is checked against the same limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from dualpace_sim.validation.validate import METRICS, ValidateError

# metric -> its limit as a multiple of --max-rel-error
HEADLINE = {
    "throughput_tok_s": 1.0,
    "normalized_latency_s": 1.0,
    "p99_ttft_s": 2.0,
    "p99_itl_s": 2.0,
    "p99_tpot_s": 2.0,
}


@dataclass(frozen=True)
class Miss:
    """One (policy, metric) whose relative error is outside its limit, or undefined."""

    policy: str
    metric: str
    simulated: float
    real: float
    relative_error: float  # NaN where a side's metric is undefined
    limit: float  # the largest |relative error| allowed

    def line(self) -> str:
        """One line for the terminal, e.g. ``miss: dualpace normalized_latency_s -34.7% ...``."""
        error = ("undefined" if math.isnan(self.relative_error)
                 else f"{self.relative_error:+.1%}")
        return (f"miss: {self.policy} {self.metric} {error} (simulated {self.simulated:.4g}, "
                f"real {self.real:.4g}; limit {plus_minus(self.limit)})")


def parse_fraction(text: str, option: str) -> float:
    """A finite fraction >= 0 given to `option`; ValidateError (one line) otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise ValidateError(f"{option}: {text!r} is not a number; give a fraction such as 0.1 "
                            "(10 %)") from None
    if not math.isfinite(value) or value < 0:
        raise ValidateError(f"{option}: {text!r} must be a finite fraction >= 0, such as 0.1 "
                            "(10 %)")
    return value


def parse_limits(max_rel_error: str | None, limits: list[str]) -> dict[str, float]:
    """metric -> the largest |relative error| allowed: the headline metrics' from
    ``--max-rel-error``, replaced or extended by each ``--limit METRIC=FRACTION``. Empty when
    neither is given (nothing is checked). ValidateError (one line) on a bad value, an unknown
    metric or a metric given twice."""
    checked: dict[str, float] = {}
    if max_rel_error is not None:
        fraction = parse_fraction(max_rel_error, "--max-rel-error")
        checked = {metric: factor * fraction for metric, factor in HEADLINE.items()}
    given: set[str] = set()
    for item in limits:
        metric, sep, value = item.partition("=")
        metric = metric.strip()
        if not sep:
            raise ValidateError(f"--limit {item!r}: expected METRIC=FRACTION, such as "
                                "p99_ttft_s=0.3")
        if metric not in METRICS:
            raise ValidateError(f"--limit {item!r}: unknown metric {metric!r}; one of "
                                f"{', '.join(METRICS)}")
        if metric in given:
            raise ValidateError(f"--limit {item!r}: {metric} is limited twice; give it once")
        given.add(metric)
        checked[metric] = parse_fraction(value.strip(), f"--limit {metric}")
    return checked


def find_misses(table: pd.DataFrame, limits: dict[str, float]) -> list[Miss]:
    """Every (policy, metric) of the validation table with a limit whose relative error is
    beyond it, in the table's order. An undefined error (NaN: a side has no value) is a miss,
    because a check that cannot be made must not pass."""
    misses = []
    for row in table.itertuples(index=False):
        limit = limits.get(str(row.metric))
        if limit is None:
            continue
        error = float(row.relative_error)
        if not abs(error) <= limit:  # NaN compares False: a miss
            misses.append(Miss(str(row.policy), str(row.metric), float(row.simulated),
                               float(row.real), error, limit))
    return misses


def describe(limits: dict[str, float]) -> str:
    """The limits in one phrase, metrics grouped by limit: ``throughput_tok_s,
    normalized_latency_s ±10%; p99_ttft_s, p99_itl_s, p99_tpot_s ±20%``."""
    by_limit: dict[float, list[str]] = {}
    for metric, limit in limits.items():
        by_limit.setdefault(limit, []).append(metric)
    return "; ".join(f"{', '.join(metrics)} {plus_minus(limit)}"
                     for limit, metrics in by_limit.items())


def plus_minus(limit: float) -> str:
    """A limit as a percentage band: 0.1 -> ``±10%``, 0.125 -> ``±12.5%``."""
    return f"±{limit * 100:g}%"
