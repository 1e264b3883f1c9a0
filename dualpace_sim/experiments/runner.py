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

from dualpace_sim.common.progress import progress_bar
from dualpace_sim.config.scenario import LoadedScenario, load_scenario
from dualpace_sim.plots.runs import plot_timeline
from dualpace_sim.results.node_series import UTILISATION_KEYS, record_series_counters, write_series
from dualpace_sim.results.outputs import write_json
from dualpace_sim.results.provenance import parquet_metadata, provenance, scenario_hash
from dualpace_sim.results.records import PolicyRecords, write_policy_records
from dualpace_sim.results.summary import policy_summary, stamp
from dualpace_sim.results.trace_events import TraceRecorder, write_trace
from dualpace_sim.sim import make_node


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
        node = make_node(policy, loaded.requests, loaded.cost, loaded.policy_config(policy),
                         on_finish=bar.update, trace=trace)
        output = node.run()
    # The node (its queues, pools and raw state log) and its requests go before the summary,
    # which needs the room: at 200k requests and 1.5 req/s that took 51 MB off the peak.
    del node
    stats = output.stats
    records = PolicyRecords.from_requests(output.requests, policy, output.series)
    del output
    summary = {**policy_summary(loaded, policy, records.requests, records.tokens),
               **utilisation(stats, loaded), "engine": asdict(stats)}
    return records, summary


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
