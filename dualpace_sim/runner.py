"""`dualpace-sim run`: simulate every policy of a scenario and write records, summary, plots
and, when asked, a timeline trace.

Results are written after each policy finishes, so an interrupted multi-policy run keeps what
it finished.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from .metrics import summarize
from .outputs import write_json
from .plots import plot_timeline
from .records import records_frame, write_records
from .scenario import LoadedScenario, load_scenario
from .sim import make_node
from .trace_events import TraceRecorder, write_trace


def simulate(
    loaded: LoadedScenario, policy: str, progress: bool = False,
    trace: TraceRecorder | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Run one policy; returns its records frame and its summary object. `trace`, if given,
    receives the run's timeline."""
    n = len(loaded.requests)
    # delay=1: the bar appears only for runs that take more than a second.
    with tqdm(total=n, desc=f"{loaded.spec.name}/{policy}", unit="req", delay=1.0,
              disable=not progress, leave=False) as bar:
        node = make_node(loaded.requests, loaded.cost, loaded.policy_config(policy),
                         loaded.neo_launch_s, on_finish=bar.update, trace=trace)
        output = node.run()
    frame = records_frame(output.requests, policy)
    summary = {
        "scenario": loaded.spec.name,
        "policy": policy,
        "rate": loaded.spec.workload.rate,
        **summarize(frame),
        "controls": _controls(loaded, policy),
        "capacities": {"gpu_kv_blocks": loaded.config.gpu_kv_blocks,
                       "host_kv_blocks": loaded.config.host_kv_blocks,
                       "block_size": loaded.config.block_size},
        "profile": {"source": loaded.profile_source,
                    "method": loaded.profile.provenance.method},
        "engine": asdict(output.stats),
    }
    return frame, summary


def _controls(loaded: LoadedScenario, policy: str) -> dict:
    """The knobs this policy ran with and where each value came from."""
    if policy == "dualpace":
        return {k: {"value": c.value, "source": c.source} for k, c in loaded.controls.items()}
    config = asdict(loaded.policy_config(policy))
    out = {k: {"value": v, "source": "scenario"} for k, v in config.items()
           if k not in ("gpu_kv_blocks", "host_kv_blocks", "block_size")}
    if policy == "neo":
        given = loaded.spec.neo.launch_s is not None
        out["launch_s"] = {"value": loaded.neo_launch_s, "source": "scenario" if given else
                           f"profile ({loaded.profile.provenance.method})"}
    return out


def run_scenario(
    path: Path, out: Path, progress: bool = True, trace_events: Path | None = None
) -> list[dict]:
    """Simulate each policy of the scenario at `path`; write results under `out`, and the
    policies' timelines to `trace_events` (one process per policy) when given."""
    loaded = load_scenario(path)
    out.mkdir(parents=True, exist_ok=True)
    frames: dict[str, pd.DataFrame] = {}
    summaries: list[dict] = []
    traces: list[TraceRecorder] = []
    for policy in loaded.spec.policies:
        trace = None if trace_events is None else TraceRecorder(f"{loaded.spec.name}: {policy}")
        frame, summary = simulate(loaded, policy, progress, trace)
        frames[policy] = frame
        summaries.append(summary)
        write_records(pd.concat(frames.values(), ignore_index=True), out / "requests.parquet")
        write_json(out / "summary.json", summaries)
        if trace is not None:
            traces.append(trace)
            write_trace(trace_events, traces)
    plot_timeline(frames, out / "timeline")
    return summaries
