"""vLLM on the real runtime: the core's vLLM scheduler driving the same GPU executor, one
engine thread, whole forwards, no host tier."""

from __future__ import annotations

import time
from collections.abc import Sequence

from dualpace_hw.runtime.engines import Engines, trace_gpu_round
from dualpace_hw.runtime.gpu_engine import GpuEngine
from dualpace_hw.runtime.processes import on_cores
from dualpace_sim.core import Request
from dualpace_sim.core.policies import vllm_schedulers
from dualpace_sim.core.vllm import VllmConfig
from dualpace_sim.costs import CostModel
from dualpace_sim.results.node_series import StateLog, state_reader


class VllmRuntime(Engines):
    """vLLM's single GPU engine on the same executor."""

    def __init__(self, specs: Sequence, config: VllmConfig, gpu: GpuEngine) -> None:
        super().__init__(specs, config.block_size, gpu.shape.vocab_size)
        self.core = vllm_schedulers(config, journal=self.journal)
        self.sched, self.driver = self.core.state, self.core.drivers["gpu"]
        self.round_tokens = config.max_num_batched_tokens
        self.states = StateLog(state_reader(self.sched))
        self.gpu = gpu.build(self.tokens)
        self.gpu.sampler = self.sampler

    @classmethod
    def for_run(cls, specs: Sequence, config: VllmConfig, gpu: GpuEngine, cost: CostModel,
                cores: list[int] | None, cpu_tp: int) -> VllmRuntime:
        """The runtime (`cost`, `cores` and `cpu_tp`: the host engines' of other policies)."""
        return cls(specs, config, gpu)

    def serve(self) -> list[Request]:
        try:
            with on_cores(self._own_cores(None)):
                return self.run({"GPU": self._loop}, self.core.submit,
                                lambda: self.core.finished)
        finally:
            self.close_gpu()

    def queue_lengths(self) -> dict[str, int]:
        """vLLM's queues (the caller holds the lock), for the server's /metrics."""
        return {"waiting": len(self.sched.waiting), "running": len(self.sched.running)}

    def pool_occupancy(self) -> dict[str, tuple[int, int]]:
        """(used, capacity) blocks of its one KV pool (the caller holds the lock)."""
        return {"hbm": (self.sched.hbm.used, self.sched.hbm.capacity)}

    def _loop(self) -> None:
        while not self.stop.is_set():
            with self.work:
                rnd = self.driver.begin(self.call_time())
                if rnd.idle:
                    self.work.wait(0.01)
                    continue
            self.stats.gpu_rounds += 1
            start, t0 = time.perf_counter(), self.now()
            tokens = self.gpu.execute(rnd.plan)
            self.stats.gpu_busy_s += time.perf_counter() - start
            trace_gpu_round(self, rnd.plan, t0, self.now())
            with self.work:
                self.driver.end(rnd, self.call_time(), tokens)
                for req_id, tok in tokens.items():
                    self.tokens.append(req_id, tok)
