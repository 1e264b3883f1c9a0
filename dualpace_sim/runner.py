"""`dualpace-sim run`: simulate every policy of a scenario and write records, summary, plots
and, when asked, a timeline trace.

Results are written after each policy finishes, so an interrupted multi-policy run keeps what
it finished.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from .budgets import BUDGET_KEYS
from .metrics import longest_cpu_stall, summarize
from .node_series import UTILISATION_KEYS, record_series_counters, write_series
from .outputs import write_json
from .plots import plot_timeline
from .progress import progress_bar
from .provenance import parquet_metadata, provenance, scenario_hash
from .records import PolicyRecords, write_policy_records
from .scenario import LoadedScenario, load_scenario
from .sim import make_node
from .token_spans import TokenSpans
from .trace_events import TraceRecorder, write_trace


def simulate(
    loaded: LoadedScenario, policy: str, progress: bool = False,
    trace: TraceRecorder | None = None,
) -> tuple[PolicyRecords, dict]:
    """Run one policy; returns its records and its summary object. `trace`, if given,
    receives the run's timeline.

    The summary is the same object in `run`'s summary.json and a sweep point's; the caller adds
    ``scenario_hash`` and ``provenance`` (:func:`stamp`), which need the files and the git
    checkout, so that a worker (a Ray task on another machine) never looks for them."""
    n = len(loaded.requests)
    # delay=1: the bar appears only for runs that take more than a second.
    with progress_bar(progress, total=n, desc=f"{loaded.spec.name}/{policy}", unit="req",
                      delay=1.0, leave=False) as bar:
        node = make_node(loaded.requests, loaded.cost, loaded.policy_config(policy),
                         loaded.neo_launch_s, on_finish=bar.update, trace=trace)
        output = node.run()
    records = PolicyRecords.from_requests(output.requests, policy, output.series)
    summary = {**policy_summary(loaded, policy, records.requests, records.tokens),
               **utilisation(output.stats, loaded), "engine": asdict(output.stats)}
    return records, summary


def policy_summary(loaded: LoadedScenario, policy: str, frame: pd.DataFrame,
                   tokens: TokenSpans | None = None) -> dict:
    """The summary keys a simulated and a real run of `policy` share, in that order: the
    metrics of its records `frame` (the scenario's percentiles and SLOs), the controls,
    pools and profile it ran with. The caller adds the utilisations and the engine's
    counters, which a simulator and a runtime count differently."""
    return {
        "scenario": loaded.spec.name,
        "policy": policy,
        "rate": loaded.spec.workload.rate,
        **summarize(frame, percentiles=loaded.spec.metrics.percentiles,
                    slos=loaded.spec.targets.model_dump(), tokens=tokens),
        "longest_cpu_stall_s": longest_cpu_stall(frame, tokens),
        "controls": policy_controls(loaded, policy),
        "capacities": {"gpu_kv_blocks": loaded.config.gpu_kv_blocks,
                       "host_kv_blocks": loaded.config.host_kv_blocks,
                       "block_size": loaded.config.block_size},
        "profile": {"source": loaded.profile_source,
                    "method": loaded.profile.provenance.method},
    }


def utilisation(stats, loaded: LoadedScenario) -> dict[str, float]:
    """Busy share of each engine over the run (0 to 1): the GPU worker (batches and assists),
    the CPU engine, and each PCIe direction (bytes moved over what the profile's bandwidth
    could move in the run's time)."""
    end, link = stats.end_s, loaded.profile.link
    if end <= 0:
        return dict.fromkeys(UTILISATION_KEYS, math.nan)
    return dict(zip(UTILISATION_KEYS, (
        (stats.gpu_busy_s + stats.gpu_assist_s) / end, stats.cpu_busy_s / end,
        stats.h2d_bytes / (link.h2d_bytes_per_s * end),
        stats.d2h_bytes / (link.d2h_bytes_per_s * end)), strict=True))


def policy_controls(loaded: LoadedScenario, policy: str) -> dict:
    """The knobs this policy ran with and where each value came from."""
    if policy == "dualpace":
        return {k: {"value": c.value, "source": c.source} for k, c in loaded.controls.items()}
    config = asdict(loaded.policy_config(policy))
    shared = loaded.spec.shared_gpu_budget
    from_shared = ({key.split(".")[1] for key in BUDGET_KEYS[policy]}
                   if shared not in (None, policy) else set())
    out = {}
    for k, v in config.items():
        if k not in ("gpu_kv_blocks", "host_kv_blocks", "block_size"):
            source = f"shared_gpu_budget: {shared}" if k in from_shared else "scenario"
            out[k] = {"value": v, "source": source}
    if policy == "neo":
        given = loaded.spec.neo.launch_s is not None
        out["launch_s"] = {"value": loaded.neo_launch_s, "source": "scenario" if given else
                           f"profile ({loaded.profile.provenance.method})"}
    return out


def stamp(summary: dict, digest: str, record: dict) -> dict:
    """A summary with the scenario hash (:func:`provenance.scenario_hash`) and provenance
    (:func:`provenance.provenance`) it was made under."""
    return {**summary, "scenario_hash": digest, "provenance": record}


@dataclass
class RunResult:
    summaries: list[dict]  # one per policy, as in summary.json
    notes: list[str] = field(default_factory=list)  # one-line notes for the reader


def run_scenario(
    path: Path, out: Path, progress: bool = True, trace_events: Path | None = None,
    changes: Mapping | None = None,
) -> RunResult:
    """Simulate each policy of the scenario at `path` (with `changes` laid over its fields, as
    :func:`scenario.read_scenario` describes); write results under `out`, and the policies'
    timelines to `trace_events` (one process per policy) when given. The notes say what the
    reader of the figures should know (:meth:`LoadedScenario.budget_note`)."""
    loaded = load_scenario(path, changes=changes)
    record = provenance(loaded)
    digest = scenario_hash(path, changes)
    out.mkdir(parents=True, exist_ok=True)
    records: dict[str, PolicyRecords] = {}
    summaries: list[dict] = []
    traces: list[TraceRecorder] = []
    for policy in loaded.spec.policies:
        trace = None if trace_events is None else TraceRecorder(f"{loaded.spec.name}: {policy}")
        records[policy], summary = simulate(loaded, policy, progress, trace)
        if trace is not None:
            record_series_counters(trace, records[policy].series)
        summaries.append(stamp(summary, digest, record))
        write_policy_records(list(records.values()), out / "requests.parquet",
                             parquet_metadata(record))
        write_series({p: r.series for p, r in records.items()}, out, parquet_metadata(record))
        write_json(out / "summary.json", summaries)
        if trace is not None:
            traces.append(trace)
            write_trace(trace_events, traces)
    plot_timeline({p: r.requests for p, r in records.items()}, out / "timeline",
                  tokens={p: r.tokens for p, r in records.items()})
    return RunResult(summaries, [n for n in [loaded.budget_note()] if n is not None])
