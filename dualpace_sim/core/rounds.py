"""The round protocol, written once: one driver per engine, for every backend.

Each engine loops schedule -> commit -> execute -> apply. A backend (the simulator, the real
runtime, journal replay, the core's test driver) drives an engine through its driver and does
nothing else of the protocol:

* `begin(now)` decides and commits a round and returns what to execute (a :class:`Round`);
* the backend executes it: nothing (idle), a wait for the previous copy group, the round's block
  moves, its forward;
* `landed(round, t)` once the transfers the round waits on have landed (`round.lands`);
* `end(round, t, tokens)` once its forward's tokens are out.

DualPace's special cases are the round's kind, decided here: a round behind an in-flight
Prefill-to-CPU copy group waits for it and then hands the group to the CPU; an empty plan is an
idle round; migrations land before the forward runs.

Given a `Journal`, a driver records each call it makes into the core, with the time it passed
and the plan it got: the real runtime's journal, which replay feeds back through fresh drivers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .cpu_round import CpuScheduler
from .gpu_round import GpuScheduler
from .journal import Journal, describe_cpu, describe_gpu, describe_neo
from .neo import NeoPlan, NeoScheduler
from .plans import BlockMoves, CpuPlan, CpuResult, GpuPlan, GpuResult
from .vllm import VllmScheduler


class RoundKind(Enum):
    """What a backend executes for a round."""

    IDLE = "idle"  # nothing: wait for new work (an arrival, the other engine's round)
    WAIT_FOR_COPIES = "wait for copies"  # A.1 step 1: wait for the copy group, then `landed`
    MIGRATE = "migrate"  # no forward: the round's moves only (none when it only places marks)
    FORWARD = "forward"  # one batch, after the round's moves


NO_MOVES = BlockMoves()  # a round's moves where it makes none (shared: BlockMoves is frozen)


@dataclass(slots=True)
class Round:
    """One committed (or idle) round, as the backend executes it (made every round: a plain
    dataclass, since a frozen one's constructor costs twice as much)."""

    kind: RoundKind
    plan: GpuPlan | CpuPlan | NeoPlan
    moves: BlockMoves = NO_MOVES  # KV copies before the forward
    lands: bool = False  # the backend calls `landed` when its transfers land

    @property
    def idle(self) -> bool:
        return self.kind is RoundKind.IDLE

    @property
    def forward(self) -> bool:
        return self.kind is RoundKind.FORWARD


class Driver:
    """What every engine's driver shares: its engine's name in the journal, and the journal."""

    engine = "gpu"

    def __init__(self, journal: Journal | None = None) -> None:
        self.journal = journal

    def record(self, t: float, call: str, **data) -> None:
        if self.journal is not None:
            self.journal.record(t, self.engine, call, **data)

    def record_schedule(self, t: float, describe: Callable[[Any], dict], plan: Any,
                        **data) -> None:
        """The schedule call and its plan, described only where a journal keeps it (the
        simulator runs without one, and describing walks every row of the plan)."""
        if self.journal is not None:
            self.journal.record(t, self.engine, "schedule", plan=describe(plan), **data)

    def landed(self, rnd: Round, t: float) -> None:
        """The transfers `rnd` waited on landed at `t` (only rounds that `lands`)."""
        raise ValueError(f"a {self.engine} round of {type(self).__name__} lands nothing")


class GpuDriver(Driver):
    """DualPace's GPU engine (Appendix A.1)."""

    def __init__(self, sched: GpuScheduler, journal: Journal | None = None) -> None:
        super().__init__(journal)
        self.sched = sched

    def begin(self, now: float) -> Round:
        plan = self.sched.schedule()
        committed = not (plan.wait_for_copies or plan.is_empty)
        self.record_schedule(now, describe_gpu, plan, committed=committed)
        if plan.wait_for_copies:
            return Round(RoundKind.WAIT_FOR_COPIES, plan, lands=True)
        if not committed:
            return Round(RoundKind.IDLE, plan)
        moves = self.sched.commit(plan)
        kind = RoundKind.FORWARD if plan.has_forward else RoundKind.MIGRATE
        return Round(kind, plan, moves, lands=plan.has_migrations)

    def landed(self, rnd: Round, t: float) -> None:
        """A wait round's copy group is on the host (its requests become the CPU's), or a
        round's swaps landed (ownership flips, the source copies are released)."""
        state = self.sched.state
        if rnd.kind is RoundKind.WAIT_FOR_COPIES:
            self.record(t, "copies_done")
            state.complete_copy_group(t)
        elif rnd.lands:
            self.record(t, "migrations_done")
            state.complete_migrations(rnd.plan.swap_outs, rnd.plan.swap_ins, t)
        else:
            super().landed(rnd, t)

    def end(self, rnd: Round, t: float, tokens: dict[int, int] | None = None) -> None:
        tokens = {} if tokens is None else tokens
        self.record(t, "apply", tokens=tokens)
        self.sched.apply(rnd.plan, GpuResult(t, tokens))


class CpuDriver(Driver):
    """DualPace's CPU engine (Appendix A.2): every round commits, an empty one too (it may
    yield marked requests to the waiting queue)."""

    engine = "cpu"

    def __init__(self, sched: CpuScheduler, journal: Journal | None = None) -> None:
        super().__init__(journal)
        self.sched = sched

    def begin(self, now: float) -> Round:
        plan = self.sched.schedule()
        self.record_schedule(now, describe_cpu, plan)
        self.sched.commit(plan)
        return Round(RoundKind.IDLE if plan.is_empty else RoundKind.FORWARD, plan)

    def preview(self) -> CpuPlan:
        """The plan the next round would run, decided and not committed: whether an idle
        engine has work yet, and which head it waits on."""
        return self.sched.schedule()

    def end(self, rnd: Round, t: float, tokens: dict[int, int] | None = None) -> None:
        tokens = {} if tokens is None else tokens
        self.record(t, "apply", tokens=tokens)
        self.sched.apply(rnd.plan, CpuResult(t, tokens))


class VllmDriver(Driver):
    """vLLM's one GPU engine: its schedule allocates, so it commits too."""

    def __init__(self, sched: VllmScheduler, journal: Journal | None = None) -> None:
        super().__init__(journal)
        self.sched = sched

    def begin(self, now: float) -> Round:
        plan = self.sched.schedule(now)
        self.record_schedule(now, describe_gpu, plan)
        return Round(RoundKind.FORWARD if plan.has_forward else RoundKind.IDLE, plan)

    def end(self, rnd: Round, t: float, tokens: dict[int, int] | None = None) -> None:
        tokens = {} if tokens is None else tokens
        self.record(t, "apply", tokens=tokens)
        self.sched.apply(rnd.plan, GpuResult(t, tokens))


class NeoDriver(Driver):
    """NEO's one engine loop: its schedule commits too, and its swaps move ownership at once,
    so nothing lands; a round that only swaps (nothing on the GPU after them) has no forward."""

    def __init__(self, sched: NeoScheduler, journal: Journal | None = None) -> None:
        super().__init__(journal)
        self.sched = sched

    def begin(self, now: float) -> Round:
        plan = self.sched.schedule(now)  # NeoHostFull when the host cannot take the round
        self.record_schedule(now, describe_neo, plan)
        if plan.is_empty:
            return Round(RoundKind.IDLE, plan)
        return Round(RoundKind.FORWARD if plan.batches else RoundKind.MIGRATE, plan, plan.moves)

    def end(self, rnd: Round, t: float, tokens: dict[int, int] | None = None) -> None:
        self.record(t, "apply", tokens={} if tokens is None else tokens)
        self.sched.apply(rnd.plan, t)
