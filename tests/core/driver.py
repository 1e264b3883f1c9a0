"""A minimal backend for core tests: drives both schedulers in a chosen interleaving.

Engine rounds are split into their observable phases (commit, migrations landing, apply), so a
test can interleave the GPU and CPU engines the way two independent event loops would.
"""

from __future__ import annotations

import random

from dualpace_sim.core import (
    BlockMoves,
    CpuResult,
    CpuScheduler,
    EngineState,
    GpuPlan,
    GpuResult,
    GpuScheduler,
    Request,
    SchedulerConfig,
)


class Driver:
    def __init__(self, config: SchedulerConfig, lengths: list[tuple[int, int]]) -> None:
        self.state = EngineState(config)
        self.gpu = GpuScheduler(self.state)
        self.cpu = CpuScheduler(self.state)
        self.pending = [
            Request.create(i, float(i), p, m, config.block_size) for i, (p, m) in enumerate(lengths)
        ]
        self.requests = list(self.pending)
        self.t = 0.0
        self.gpu_plan = None  # committed GPU plan not yet applied
        self.gpu_migrated = False
        self.cpu_plan = None  # committed CPU plan not yet applied
        self.gpu_plans = []
        self.cpu_plans = []

    def now(self) -> float:
        self.t += 1.0
        return self.t

    def actions(self) -> list[str]:
        acts = []
        if self.pending:
            acts.append("arrive")
        if self.gpu_plan is None:
            acts.append("gpu_start")
        elif not self.gpu_migrated:
            acts.append("gpu_migrated")
        else:
            acts.append("gpu_finish")
        acts.append("cpu_finish" if self.cpu_plan is not None else "cpu_start")
        return acts

    def do(self, action: str) -> None:
        st = self.state
        if action == "arrive":
            st.submit(self.pending.pop(0))
        elif action == "gpu_start":
            plan = self.gpu.schedule()
            if plan.wait_for_copies:
                st.complete_copy_group(self.now())
                return
            if plan.is_empty:
                return
            before = {id(r): list(r.blocks) for r in (*plan.swap_outs, *plan.swap_ins)}
            check_moves(plan, self.gpu.commit(plan), before)
            self.gpu_plans.append(plan)
            self.gpu_plan, self.gpu_migrated = plan, False
        elif action == "gpu_migrated":
            plan = self.gpu_plan
            st.complete_migrations(plan.swap_outs, plan.swap_ins, self.now())
            self.gpu_migrated = True
            if not plan.has_forward:
                self.gpu_plan = None
        elif action == "gpu_finish":
            self.gpu.apply(self.gpu_plan, GpuResult(self.now()))
            self.gpu_plan = None
        elif action == "cpu_start":
            plan = self.cpu.schedule()
            self.cpu.commit(plan)
            if not plan.is_empty:
                self.cpu_plans.append(plan)
                self.cpu_plan = plan
        elif action == "cpu_finish":
            self.cpu.apply(self.cpu_plan, CpuResult(self.now()))
            self.cpu_plan = None
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
