"""A minimal backend for core tests: drives both engines in a chosen interleaving.

Engine rounds are split into their observable phases (begin, migrations landing, end), so a
test can interleave the GPU and CPU engines the way two independent event loops would; each
phase is the engine's driver's (`core.rounds`), as in every backend.
"""

from __future__ import annotations

import random
from itertools import chain

from dualpace_sim.core import BlockMoves, GpuPlan, Request, SchedulerConfig
from dualpace_sim.core.policies import dualpace_schedulers
from dualpace_sim.core.rounds import RoundKind


class Driver:
    def __init__(self, config: SchedulerConfig, lengths: list[tuple[int, int]]) -> None:
        core = dualpace_schedulers(config)
        self.state = core.state
        self.gpu, self.cpu = core.drivers["gpu"], core.drivers["cpu"]
        self.pending = [
            Request.create(i, float(i), p, m, config.block_size) for i, (p, m) in enumerate(lengths)
        ]
        self.requests = list(self.pending)
        self.t = 0.0
        self.gpu_round = None  # committed GPU round not yet ended
        self.gpu_migrated = False
        self.cpu_round = None  # committed CPU round not yet ended
        self.gpu_plans = []
        self.cpu_plans = []

    def now(self) -> float:
        self.t += 1.0
        return self.t

    def actions(self) -> list[str]:
        acts = []
        if self.pending:
            acts.append("arrive")
        if self.gpu_round is None:
            acts.append("gpu_start")
        elif not self.gpu_migrated:
            acts.append("gpu_migrated")
        else:
            acts.append("gpu_finish")
        acts.append("cpu_finish" if self.cpu_round is not None else "cpu_start")
        return acts

    def do(self, action: str) -> None:
        st = self.state
        if action == "arrive":
            st.submit(self.pending.pop(0))
        elif action == "gpu_start":
            before = {id(r): list(r.blocks) for r in chain(st.gpu_running, st.cpu_waiting)}
            rnd = self.gpu.begin(self.t)
            if rnd.kind is RoundKind.WAIT_FOR_COPIES:
                self.gpu.landed(rnd, self.now())
                return
            if rnd.idle:
                return
            check_moves(rnd.plan, rnd.moves, before)
            self.gpu_plans.append(rnd.plan)
            self.gpu_round, self.gpu_migrated = rnd, False
        elif action == "gpu_migrated":
            rnd, t = self.gpu_round, self.now()
            if rnd.lands:
                self.gpu.landed(rnd, t)
            self.gpu_migrated = True
            if not rnd.forward:
                self.gpu_round = None
        elif action == "gpu_finish":
            self.gpu.end(self.gpu_round, self.now())
            self.gpu_round = None
        elif action == "cpu_start":
            rnd = self.cpu.begin(self.t)
            if not rnd.idle:
                self.cpu_plans.append(rnd.plan)
                self.cpu_round = rnd
        elif action == "cpu_finish":
            self.cpu.end(self.cpu_round, self.now())
            self.cpu_round = None
        st.check_invariants()

    def run(self, rng: random.Random, max_steps: int = 200_000) -> int:
        """Random interleaving until every request finished; returns the steps taken."""
        for step in range(max_steps):
            if not self.pending and len(self.state.finished) == len(self.requests):
                return step
            self.do(rng.choice(self.actions()))
        raise AssertionError(f"not finished after {max_steps} steps: {self.describe()}")

    def describe(self) -> str:
        st = self.state
        return (f"finished {len(st.finished)}/{len(self.requests)}, gpu_waiting "
                f"{len(st.gpu_waiting)}, gpu_prefilling {len(st.gpu_prefilling)}, gpu_running "
                f"{len(st.gpu_running)}, cpu_waiting {len(st.cpu_waiting)}, cpu_running "
                f"{len(st.cpu_running)}, hbm free {st.hbm.free}, host free {st.host.free}, "
                f"B_migration {st.b_migration}, copies {len(st.copy_group)}, marked "
                f"{len(st.marked)}")


def check_moves(plan: GpuPlan, moves: BlockMoves, before: dict[int, list[int]]) -> None:
    """The commit's block moves pair each swapped request's blocks before the commit with the
    first as many of its blocks after it, swap-outs first, in the plan's order."""
    for reqs, (src, dst) in ((plan.swap_outs, moves.swap_out), (plan.swap_ins, moves.swap_in)):
        assert src == [b for r in reqs for b in before[id(r)]]
        assert dst == [b for r in reqs for b in r.blocks[: len(before[id(r)])]]
    assert moves.any == plan.has_migrations
