"""The replay check: a real run's journal, fed back through fresh schedulers, must reproduce the
run's scheduling decisions exactly.

The runtime journals every call it makes into the core (`dualpace_sim.core.journal`), with the
clock time it passed and the plan it got. Here a SimPy process advances the simulator's clock
to each recorded time — the runtime's own measured batch durations and arrival times — and makes
the same call on a fresh `EngineState` (or `VllmScheduler`); every plan it gets back must equal
the recorded one (same batches, same migrations, same order), and the requests must end with the
runtime's token times. A mismatch means the runtime decided something outside the shared core.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import simpy

from dualpace_sim.config.scenario import LoadedScenario
from dualpace_sim.core import CpuResult, CpuScheduler, EngineState, GpuResult, GpuScheduler, Request
from dualpace_sim.core.journal import (
    JOURNAL_FILE,
    Entry,
    Journal,
    JournalError,
    describe_cpu,
    describe_gpu,
    describe_neo,
)
from dualpace_sim.core.neo import NeoScheduler
from dualpace_sim.core.vllm import VllmScheduler
from dualpace_sim.costs.neo_tables import NeoTables
from dualpace_sim.results.node_series import StateLog, state_reader
from dualpace_sim.results.records import read_records, records_frame

REPLAYED_POLICIES = ("dualpace", "vllm", "neo")


@dataclass
class ReplayReport:
    policy: str
    calls: int = 0
    plans: int = 0
    mismatches: list[str] = field(default_factory=list)  # the first few, in journal order
    records_match: bool | None = None  # None: no records to compare with

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.records_match is not False

    def line(self) -> str:
        verdict = "reproduced exactly" if self.ok else "DIVERGED"
        text = f"{self.policy}: replayed {self.calls} core calls, {self.plans} plans: {verdict}"
        return text + "".join(f"\n  {m}" for m in self.mismatches)


class _DualPaceCalls:
    def __init__(self, loaded: LoadedScenario, requests: list[Request]) -> None:
        self.requests = requests
        self.state = EngineState(loaded.policy_config("dualpace"))
        self.gpu, self.cpu = GpuScheduler(self.state), CpuScheduler(self.state)
        self.gpu_plan = self.cpu_plan = None

    def __call__(self, e: Entry) -> dict | None:
        """Make the entry's call; return (recorded, replayed) plan summaries for a schedule."""
        st, d = self.state, e.data
        match e.engine, e.call:
            case "load", "submit":
                st.submit(self.requests[d["req"]])
            case "gpu", "schedule":
                plan = self.gpu.schedule()
                if d["committed"]:
                    self.gpu.commit(plan)
                    self.gpu_plan = plan
                return describe_gpu(plan)
            case "gpu", "copies_done":
                st.complete_copy_group(e.t)
            case "gpu", "migrations_done":
                st.complete_migrations(self.gpu_plan.swap_outs, self.gpu_plan.swap_ins, e.t)
            case "gpu", "apply":
                self.gpu.apply(self.gpu_plan, GpuResult(e.t, d["tokens"]))
            case "cpu", "schedule":
                plan = self.cpu.schedule()
                self.cpu.commit(plan)
                self.cpu_plan = plan
                return describe_cpu(plan)
            case "cpu", "apply":
                self.cpu.apply(self.cpu_plan, CpuResult(e.t, d["tokens"]))
            case _:
                raise ValueError(f"unknown journal call {e.engine}/{e.call}")
        return None


class _OneEngineCalls(ABC):
    """A policy of one engine loop (vLLM, NEO): submit, schedule at the recorded time, apply."""

    def __init__(self, sched, requests: list[Request]) -> None:
        self.sched = sched
        self.requests = requests
        self.plan = None

    @abstractmethod
    def describe(self, plan) -> dict:
        """The plan as the journal records it."""

    @abstractmethod
    def result(self, e: Entry):
        """The apply entry as the scheduler's apply takes it."""

    def __call__(self, e: Entry) -> dict | None:
        match e.engine, e.call:
            case "load", "submit":
                self.sched.submit(self.requests[e.data["req"]])
            case "gpu", "schedule":
                self.plan = self.sched.schedule(e.t)
                return self.describe(self.plan)
            case "gpu", "apply":
                self.sched.apply(self.plan, self.result(e))
            case _:
                raise ValueError(f"unknown journal call {e.engine}/{e.call}")
        return None


class _VllmCalls(_OneEngineCalls):
    def __init__(self, loaded: LoadedScenario, requests: list[Request]) -> None:
        super().__init__(VllmScheduler(loaded.policy_config("vllm")), requests)

    def describe(self, plan) -> dict:
        return describe_gpu(plan)

    def result(self, e: Entry) -> GpuResult:
        return GpuResult(e.t, e.data["tokens"])


class _NeoCalls(_OneEngineCalls):
    """NEO decides with the same tables over the same profile as the run did."""

    def __init__(self, loaded: LoadedScenario, requests: list[Request]) -> None:
        super().__init__(NeoScheduler(loaded.policy_config("neo"),
                                      NeoTables(loaded.cost, loaded.neo_launch_s)), requests)

    def describe(self, plan) -> dict:
        return describe_neo(plan)

    def result(self, e: Entry) -> float:
        return e.t


_CALLS = {"dualpace": _DualPaceCalls, "vllm": _VllmCalls, "neo": _NeoCalls}


def journal_calls(loaded: LoadedScenario, policy: str) -> tuple[list[Request], Callable]:
    """Fresh requests of `loaded`'s workload and a callable that makes a journal entry's call
    into fresh schedulers of `policy` (returning the plan's summary for a schedule); its
    `gpu_plan`/`cpu_plan` (DualPace) or `plan` (vLLM, NEO) is the plan the last schedule
    got, which is how analyses price a real run's rounds (served_rounds.py)."""
    if policy not in REPLAYED_POLICIES:
        raise ValueError(f"no replay for policy {policy!r}; the runtime runs "
                         f"{', '.join(REPLAYED_POLICIES)}")
    block_size = loaded.policy_config(policy).block_size
    requests = [Request.create(i, s.arrival_s, s.prompt_tokens, s.max_tokens, block_size)
                for i, s in enumerate(loaded.requests)]
    return requests, _CALLS[policy](loaded, requests)


def replay(journal: Journal, loaded: LoadedScenario, policy: str,
           records: pd.DataFrame | None = None, max_reported: int = 5) -> ReplayReport:
    """Replay `journal` (a real run of `policy` on `loaded`'s workload); compare every plan and,
    given the run's records, every request's token times and owners."""
    requests, calls = journal_calls(loaded, policy)
    report = ReplayReport(policy)
    env = simpy.Environment()

    def driver():
        for i, e in enumerate(journal.entries):
            if e.t > env.now:
                yield env.timeout(e.t - env.now)  # the runtime's measured durations
            try:
                got = calls(e)
            except (KeyError, TypeError, IndexError) as exc:  # an entry lacking what it needs
                raise JournalError(f"{journal.source}: line {i + 1}: {e.engine}/{e.call} lacks "
                                   f"or mistypes {exc}") from None
            report.calls += 1
            if got is None:
                continue
            report.plans += 1
            if got != e.data["plan"] and len(report.mismatches) < max_reported:
                report.mismatches.append(f"call {i} ({e.engine} schedule at {e.t:.6f} s): "
                                         f"runtime {e.data['plan']} != replay {got}")

    env.process(driver())
    env.run()
    if records is not None:
        report.records_match = _outcomes(records_frame(requests, policy)) == _outcomes(
            records[records["policy"] == policy])
        if not report.records_match:
            report.mismatches.append("replayed token times or owners differ from requests.parquet")
    return report


def replay_states(journal: Journal, loaded: LoadedScenario, policy: str) -> pd.DataFrame:
    """The scheduler state after each call of `journal`, recomputed by making its calls on
    fresh schedulers (no clock needed: each call takes its recorded time), as
    :meth:`node_series.StateLog.frame`: what a real run's ``state.parquet`` must hold."""
    _, calls = journal_calls(loaded, policy)
    states = StateLog(state_reader(calls.state if policy == "dualpace" else calls.sched))
    states.sample(0.0)  # empty at the clock's start, as the runtime samples it
    for e in journal.entries:
        calls(e)
        states.sample(e.t)
    return states.frame()


def _outcomes(df: pd.DataFrame) -> list[tuple]:
    """What the runtime's clients saw of each request, comparable exactly."""
    return [(int(r.request_id), r.token_owners, list(r.token_times_s), list(r.migration_kinds))
            for r in df.sort_values("request_id").itertuples()]


def replay_run(real_dir: Path | str, loaded: LoadedScenario) -> list[ReplayReport]:
    """Replay every policy journal a real run directory holds."""
    real_dir = Path(real_dir)
    records = read_records(real_dir / "requests.parquet")
    reports = []
    for policy in REPLAYED_POLICIES:
        path = real_dir / JOURNAL_FILE.format(policy=policy)
        if path.exists():
            reports.append(replay(Journal.read(path), loaded, policy, records))
    return reports
