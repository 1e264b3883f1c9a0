"""The replay check: a real run's journal, fed back through fresh schedulers, must reproduce the
run's scheduling decisions exactly.

The runtime journals every call it makes into the core (`dualpace_sim.core.journal`), with the
clock time it passed and the plan it got. Here a SimPy process advances the simulator's clock
to each recorded time — the runtime's own measured batch durations and arrival times — and makes
the same call through fresh drivers of the same policy (`dualpace_sim.core.rounds`, the protocol
the runtime's engines run); every plan it gets back must equal
the recorded one (same batches, same migrations, same order), and the requests must end with the
runtime's token times. A mismatch means the runtime decided something outside the shared core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import simpy

from dualpace_sim.config.scenario import LoadedScenario
from dualpace_sim.core import Request
from dualpace_sim.core.journal import JOURNAL_FILE, Entry, Journal, JournalError
from dualpace_sim.core.neo import NeoPlan
from dualpace_sim.core.plans import CpuPlan, GpuPlan
from dualpace_sim.core.policies import POLICY_NAMES, Schedulers, policy_named
from dualpace_sim.core.rounds import Round
from dualpace_sim.costs.neo_tables import NeoTables
from dualpace_sim.results.node_series import StateLog, state_reader
from dualpace_sim.results.records import read_records, records_frame

REPLAYED_POLICIES = POLICY_NAMES  # every registered policy has a real runtime and journals


@dataclass
class ReplayReport:
    policy: str
    calls: int = 0
    plans: int = 0
    mismatches: list[str] = field(default_factory=list)  # the first few, in journal order
    records_match: bool | None = None  # None: no records to compare with
    plans_match: bool = True  # every plan the replay made is the journal's

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.records_match is not False

    def line(self) -> str:
        verdict = "reproduced exactly" if self.ok else "DIVERGED"
        text = f"{self.policy}: replayed {self.calls} core calls, {self.plans} plans: {verdict}"
        return text + "".join(f"\n  {m}" for m in self.mismatches)


class JournalCalls:
    """A journal's calls made again, one entry at a time, through fresh drivers of one policy
    (`core.rounds`), which journal what they got: a schedule returns the plan its driver
    recorded, for comparison with the runtime's. :meth:`plan` is the plan of an engine's
    last round, which is how analyses price a real run's rounds (served_rounds.py)."""

    def __init__(self, core: Schedulers, requests: list[Request], journal: Journal) -> None:
        self.core = core
        self.requests = requests
        self.journal = journal  # what the fresh drivers recorded
        self.rounds: dict[str, Round | None] = dict.fromkeys(core.drivers)

    @property
    def state(self):
        """The fresh schedulers' state (DualPace's EngineState, or the baseline's scheduler)."""
        return self.core.state

    def plan(self, engine: str) -> GpuPlan | CpuPlan | NeoPlan | None:
        rnd = self.rounds.get(engine)
        return None if rnd is None else rnd.plan

    def __call__(self, e: Entry) -> dict | None:
        """Make the entry's call; return the replayed plan's summary for a schedule."""
        if (e.engine, e.call) == ("load", "submit"):
            self.core.submit(self.requests[e.data["req"]])
            return None
        driver = self.core.drivers.get(e.engine)
        if driver is None:
            raise ValueError(f"unknown journal call {e.engine}/{e.call}")
        match e.call:
            case "schedule":
                self.rounds[e.engine] = driver.begin(e.t)
                return self.journal.entries[-1].data["plan"]
            case "copies_done" | "migrations_done":
                driver.landed(self.rounds[e.engine], e.t)
            case "apply":
                driver.end(self.rounds[e.engine], e.t, e.data["tokens"])
            case _:
                raise ValueError(f"unknown journal call {e.engine}/{e.call}")
        return None


def journal_calls(loaded: LoadedScenario, policy: str) -> tuple[list[Request], JournalCalls]:
    """Fresh requests of `loaded`'s workload and the :class:`JournalCalls` that make a journal
    entry's call into fresh schedulers of `policy` (NEO's decide with its tables over the
    scenario's profile, as the run's did)."""
    if policy not in REPLAYED_POLICIES:
        raise ValueError(f"no replay for policy {policy!r}; the runtime runs "
                         f"{', '.join(REPLAYED_POLICIES)}")
    config = loaded.policy_config(policy)
    requests = [Request.create(i, s.arrival_s, s.prompt_tokens, s.max_tokens, config.block_size)
                for i, s in enumerate(loaded.requests)]
    journal = Journal("replay")
    core = policy_named(policy).schedulers(config, NeoTables(loaded.cost, loaded.neo_launch_s),
                                           journal)
    return requests, JournalCalls(core, requests, journal)


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
            if got != e.data["plan"]:
                report.plans_match = False
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
    states = StateLog(state_reader(calls.state))
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
