"""The summary of one policy's run that a simulated and a real run share (summary.json): the
metrics of its records, the controls, pools and profile it ran with, and the scenario hash and
provenance it was made under. `dualpace-sim run`, a sweep point and `dualpace-hw run`/`serve`
all write it, so it lives apart from the simulator's run driver."""

from __future__ import annotations

from dataclasses import asdict

import pandas as pd

from dualpace_sim.config.budgets import BUDGET_KEYS
from dualpace_sim.config.scenario import LoadedScenario
from dualpace_sim.results.metrics import longest_cpu_stall, summarize
from dualpace_sim.results.token_spans import TokenSpans


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
        if k not in ("gpu_kv_blocks", "host_kv_blocks", "block_size", "launch_s"):
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
