"""`dualpace-sim capacity`: the highest offered rate at which a policy meets every target.

A sweep reads the sustainable rate off a fixed set of rates by interpolation; capacity finds it
by bisection instead, to a tolerance the user picks, simulating only the rates the search
needs. A rate "meets" when every target of the scenario's ``targets:`` holds there; a rate the
configuration cannot serve (the simulation stalls, or nothing completes) misses. The search
assumes, as the sustainable rate does, that latency grows with the offered load.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dualpace_sim.config.scenario import ScenarioError, load_scenario
from dualpace_sim.experiments.runner import simulate
from dualpace_sim.results.sweep_dir import TARGET_METRICS
from dualpace_sim.sim import SimulationStalled

COLUMNS = ("policy", "rate", "bound", "upper", "limited_by", "evaluations")


@dataclass
class Search:
    """One policy's bisection: the rates tried and which targets each missed."""

    policy: str
    tried: dict[float, list[str]] = field(default_factory=dict)  # rate -> missed targets

    def meets(self, rate: float) -> bool:
        return not self.tried[rate]


def missed_targets(summary: Mapping, targets: Mapping[str, float]) -> list[str]:
    """The target metrics a summary misses; NaN (nothing completed) misses."""
    return [m for m in TARGET_METRICS if m in targets and not summary[m] <= targets[m]]


def bisect_rate(meets: Callable[[float], bool], low: float, high: float,
                tol: float) -> tuple[float, float, str]:
    """(highest meeting rate found, lowest missing rate found, bound): bound ``=`` when the
    answer lies in between, within ``tol``; ``>=`` when ``high`` meets (the answer is at least
    it), ``<`` when even ``low`` misses."""
    if not meets(low):
        return low, low, "<"
    if meets(high):
        return high, math.inf, ">="
    while high - low > tol:
        mid = (low + high) / 2
        if meets(mid):
            low = mid
        else:
            high = mid
    return low, high, "="


def capacity(scenario: Path | str, changes: Mapping | None = None, *, low: float = 0.25,
             high: float = 32.0, tol: float = 0.05) -> pd.DataFrame:
    """Per policy of the scenario, the highest rate in [low, high] meeting every target, to
    within ``tol`` req/s; one row per policy with :data:`COLUMNS` (``upper``: the lowest rate
    found to miss; ``limited_by``: the targets missed there). Raises ScenarioError for a bad
    scenario or search range."""
    if not 0 < low < high or tol <= 0:
        raise ScenarioError(f"capacity: need 0 < --low < --high and --tol > 0 (got low {low}, "
                            f"high {high}, tol {tol})")
    first = load_scenario(scenario, rate=low, changes=changes)
    targets = first.spec.targets.model_dump()
    rows = []
    for policy in first.spec.policies:
        search = Search(policy)

        def meets(rate: float, search: Search = search) -> bool:
            if rate not in search.tried:
                loaded = load_scenario(scenario, rate=rate, changes=changes)
                try:
                    _, summary = simulate(loaded, search.policy)
                except SimulationStalled:
                    search.tried[rate] = ["stalled"]
                else:
                    search.tried[rate] = missed_targets(summary, targets)
            return search.meets(rate)

        rate, upper, bound = bisect_rate(meets, low, high, tol)
        limited = search.tried.get(upper, []) if bound != ">=" else []
        rows.append({"policy": policy, "rate": rate, "bound": bound, "upper": upper,
                     "limited_by": " ".join(limited), "evaluations": len(search.tried)})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def format_capacity(table: pd.DataFrame, tol: float) -> str:
    """The capacity table for people: one line per policy."""
    lines = []
    for row in table.itertuples(index=False):
        if row.bound == "<":
            text = f"below {row.rate:g} req/s (misses {row.limited_by} there)"
        elif row.bound == ">=":
            text = f"at least {row.rate:g} req/s (every target holds up to the search's top)"
        else:
            text = (f"{row.rate:.3f} req/s (within {tol:g}; at {row.upper:.3f} it misses "
                    f"{row.limited_by})")
        lines.append(f"{row.policy}: {text}; {row.evaluations} simulations")
    return "\n".join(lines)
