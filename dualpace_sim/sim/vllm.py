"""The vLLM node: one GPU engine loop, whole forwards, no host tier."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dualpace_sim.results.node_series import StateLog, state_reader
from dualpace_sim.results.trace_events import TraceRecorder

from ..core import Request
from ..core.vllm import VllmConfig, VllmScheduler
from ..costs import CostModel
from .node import Node


class VllmNode(Node):
    def __init__(
        self,
        specs: Sequence,
        cost: CostModel,
        config: VllmConfig,
        on_finish: Callable[[int], None] | None = None,
        trace: TraceRecorder | None = None,
    ) -> None:
        super().__init__(specs, cost, config.block_size, stage_mode=False, on_finish=on_finish,
                         trace=trace)
        self.sched = VllmScheduler(config)
        self.states = StateLog(state_reader(self.sched))

    def _start(self) -> None:
        self.env.process(self._loop())

    def _submit(self, req: Request) -> None:
        self.sched.submit(req)

    def _finished_count(self) -> int:
        return len(self.sched.finished)

    def _describe(self) -> str:
        s = self.sched
        return (f"waiting {len(s.waiting)}, running {len(s.running)}, "
                f"HBM free {s.hbm.free}/{s.hbm.capacity}")

    def _loop(self):
        sched = self.sched
        while not self._done():
            preempted = sched.preemptions
            plan = sched.schedule(self.env.now)
            self._sample()
            if not plan.has_forward:
                yield self._idle("gpu")
                continue
            self.stats.gpu_rounds += 1
            result = yield from self._run_forward(plan, preempted=sched.preemptions - preempted)
            sched.apply(plan, result)
            self._sample()
            self.stats.preemptions = sched.preemptions
            self._note_finished()
