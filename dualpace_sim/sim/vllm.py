"""The vLLM node: one GPU engine loop, whole forwards, no host tier."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dualpace_sim.results.trace_events import TraceRecorder

from ..core.policies import vllm_schedulers
from ..core.vllm import VllmConfig
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
        self._drive(vllm_schedulers(config))
        self.sched, self.driver = self.core.state, self.core.drivers["gpu"]

    def _start(self) -> None:
        self.env.process(self._loop())

    def _describe(self) -> str:
        s = self.sched
        return (f"waiting {len(s.waiting)}, running {len(s.running)}, "
                f"HBM free {s.hbm.free}/{s.hbm.capacity}")

    def _loop(self):
        sched = self.sched
        while not self._done():
            preempted = sched.preemptions
            rnd = self.driver.begin(self.env.now)
            self._sample()
            if rnd.idle:
                yield self._idle("gpu")
                continue
            self.stats.gpu_rounds += 1
            yield from self._run_forward(rnd.plan, preempted=sched.preemptions - preempted)
            self.driver.end(rnd, self.env.now)
            self._sample()
            self.stats.preemptions = sched.preemptions
            self._note_finished()
