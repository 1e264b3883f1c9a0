"""What-if studies from Python: a scenario with some fields changed, run in memory, its metrics
back as a table.

`dualpace-sim run` and `sweep` write result directories worth keeping. A study (a notebook, a
script) asks many small questions instead ("and with 30 GiB of host KV?"), each a handful of
simulations whose per-request records nobody keeps, so these functions return one row of
metrics per (policy, offered rate): the columns of sweep.csv plus the pool sizes and engine
counters that explain them. Changes use the scenario's own YAML keys, nested like the file
(``{"scheduler": {"host_kv_blocks": 15360}}``), and are validated as if written there; a profile
built in code (say, synthesized from a changed hardware spec) can stand in for the scenario's.

    table = rate_sweep("scenarios/quickstart.yaml", [2.0, 3.0, 4.0],
                       changes={"workload": {"num_requests": 500}})
    sustainable(table)  # per policy and target: the highest rate that meets it
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ValidationError

from dualpace_sim.config.scenario import ScenarioError, SweepSpec, Targets, load_scenario
from dualpace_sim.costs import CostExtrapolationWarning, Profile
from dualpace_sim.experiments.runner import simulate
from dualpace_sim.experiments.sweep import ABOVE_SWEEP, BELOW_SWEEP, format_rate, metric_columns
from dualpace_sim.results.metrics import sustainable_rate
from dualpace_sim.results.sweep_dir import SWEEP_COLUMNS, TARGET_METRICS

# Engine counters worth a column: where the time went and what crossed PCIe.
ENGINE_COLUMNS = (
    "gpu_busy_s", "gpu_assist_s", "cpu_busy_s", "h2d_bytes", "d2h_bytes", "swap_outs",
    "swap_ins", "prefills_to_cpu", "preemptions",
)
COLUMNS = (*SWEEP_COLUMNS, "gpu_kv_blocks", "host_kv_blocks", *ENGINE_COLUMNS)

# The metric name of "every target at once" in sustainable()'s table.
ALL_TARGETS = "all_targets"

# The target metrics as sentences name them.
METRIC_NAMES = {"normalized_latency_s": "normalized latency", "p99_ttft_s": "P99 TTFT",
                "p99_itl_s": "P99 ITL", "p99_tpot_s": "P99 TPOT"}


def run_policies(
    scenario: Path | str,
    changes: Mapping | None = None,
    *,
    rate: float | None = None,
    profile: Profile | None = None,
) -> pd.DataFrame:
    """Simulate every policy of the (changed) scenario at one offered rate (default: its own);
    one row per policy with :data:`COLUMNS`, then the rest of the serving-benchmark metrics
    sweep.csv has (:func:`sweep.metric_columns`). Raises ScenarioError for a bad change and
    SimulationStalled for a configuration that cannot serve its load."""
    loaded = load_scenario(scenario, rate=rate, changes=changes, profile=profile)
    rows = []
    for policy in loaded.spec.policies:
        _, summary = simulate(loaded, policy)
        row = {c: summary.get(c) for c in SWEEP_COLUMNS}
        row["gpu_kv_blocks"] = summary["capacities"]["gpu_kv_blocks"]
        row["host_kv_blocks"] = summary["capacities"]["host_kv_blocks"]
        row.update({c: summary["engine"][c] for c in ENGINE_COLUMNS})
        row.update({c: summary[c] for c in metric_columns(summary) if c not in row})
        rows.append(row)
    return pd.DataFrame(rows, columns=[*COLUMNS, *(c for c in rows[0] if c not in COLUMNS)])


def rate_sweep(
    scenario: Path | str,
    rates: Sequence[float],
    changes: Mapping | None = None,
    *,
    profile: Profile | None = None,
) -> pd.DataFrame:
    """:func:`run_policies` at each offered rate, sorted by policy then rate like sweep.csv."""
    try:
        rates = SweepSpec(rates=list(rates)).rates
    except ValidationError as e:
        raise ScenarioError(f"{scenario}: rates {list(rates)}: {e.errors()[0]['msg']} (give "
                            f"two or more offered rates in req/s)") from None
    table = pd.concat([run_policies(scenario, changes, rate=r, profile=profile) for r in rates],
                      ignore_index=True)
    return table.sort_values(["policy", "rate"], kind="stable", ignore_index=True)


def sustainable(table: pd.DataFrame, targets: Mapping[str, float] | None = None) -> pd.DataFrame:
    """The sustainable request rate of each policy of a :func:`rate_sweep` table, per target
    metric and for all of them at once (:data:`ALL_TARGETS`: the lowest of the per-target
    rates), in a form that plots: columns ``policy, metric, target, rate, bound, text,
    limited_by``.

    ``rate`` is the interpolated crossing (:func:`metrics.sustainable_rate`) with ``bound``
    ``"="``; when the target holds over the whole sweep it is the highest swept rate with
    ``bound`` ``">="``, when even the lowest rate misses it, the lowest with ``bound`` ``"<"``.
    ``text`` is how `dualpace-sim sweep` prints it (``3.42``, ``> 6``, ``< 1``); ``limited_by``
    names the metric whose target sets the rate (empty when every target held over the sweep).
    ``targets`` defaults to the paper's (:class:`scenario.Targets`).
    """
    targets = Targets().model_dump() if targets is None else dict(targets)
    rows = []
    for policy, points in table.groupby("policy", sort=False):
        points = points.sort_values("rate")
        rates = points["rate"].to_numpy(float)
        own = []
        for metric in (m for m in TARGET_METRICS if m in targets):
            found = sustainable_rate(rates, points[metric].to_numpy(float), targets[metric])
            if found == ABOVE_SWEEP:
                rate, bound = rates[-1], ">="
            elif found == BELOW_SWEEP:
                rate, bound = rates[0], "<"
            else:
                rate, bound = found, "="
            own.append({"policy": policy, "metric": metric, "target": targets[metric],
                        "rate": float(rate), "bound": bound, "text": format_rate(found, rates),
                        "limited_by": "" if bound == ">=" else metric})
        # The lowest rate wins; at a tie, a target that fails below the sweep or crosses inside
        # it says more than one that holds over it.
        worst = min(own, key=lambda r: (r["rate"], r["bound"] == ">="))
        rows += [*own, {**worst, "metric": ALL_TARGETS, "target": np.nan}]
    return pd.DataFrame(rows, columns=["policy", "metric", "target", "rate", "bound", "text",
                                       "limited_by"])


def rate_in_words(rate: float, bound: str) -> str:
    """A rate of :func:`sustainable` for a sentence, honest about the edges of the sweep:
    ``3.42 req/s``, ``at least 6.00 req/s``, ``below 1.00 req/s``."""
    prefix = {"=": "", ">=": "at least ", "<": "below "}[bound]
    return f"{prefix}{rate:.2f} req/s"


@contextmanager
def extrapolated_tables() -> Iterator[list[str]]:
    """Collect, rather than print, the cost model's warnings about lookups outside a profile's
    tables: a study runs dozens of simulations, each of which would warn anew. The yielded
    list holds the names of the tables that were extended (sorted) once the block ends; other
    warnings pass through."""
    tables: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CostExtrapolationWarning)
        yield tables
    for w in caught:
        if issubclass(w.category, CostExtrapolationWarning):
            tables.append(w.message.table)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    tables[:] = sorted(set(tables))
