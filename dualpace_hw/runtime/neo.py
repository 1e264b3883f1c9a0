"""NEO on the real runtime: the shared core's NEO scheduler driving the runtime's executors.

One engine thread, as NEO has one engine loop (swiftllm/server/engine.py): schedule (its driver,
`rounds.NeoDriver`: the core's `NeoScheduler.schedule`, which commits too) -> swaps and the
forward of its one or two sub-batches (`neo_executor.NeoExecutor`) -> apply, every request of
the iteration getting one token. CPU-resident requests advance only inside GPU iterations,
their attention run on a thread of this process (NEO's CPU attention is in its engine's process
too), never in an independent CPU engine. The predictor it decides with is `NeoTables` over
the scenario's profile, as in the simulator, so the journal replays through a fresh
`NeoScheduler` to the same plans.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model
from dualpace_hw.executors.neo_executor import IterationTimes, NeoExecutor
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.runtime.engines import Engines, RunStats, trace_swaps
from dualpace_hw.runtime.gpu_engine import GpuEngine
from dualpace_hw.runtime.processes import on_cores
from dualpace_sim.core.neo import NeoConfig, NeoPlan, NeoPredictor
from dualpace_sim.core.policies import neo_schedulers
from dualpace_sim.costs import CostModel
from dualpace_sim.costs.neo_tables import NeoTables
from dualpace_sim.results.node_series import StateLog, state_reader
from dualpace_sim.results.trace_events import CPU_ENGINE, GPU_ENGINE


@dataclass
class NeoRunStats(RunStats):
    launch_s: float = 0.0  # the lnch_T NEO's predictor decided with (per layer)
    pipelined_iterations: int = 0  # iterations of two sub-batches (the rest: GPU-only)
    swap_outs: int = 0  # requests moved GPU -> host
    swap_ins: int = 0  # requests moved host -> GPU
    prefills_to_cpu: int = 0  # prompts computed on the GPU, their KV written to the host
    cpu_decode_tokens: int = 0  # tokens decoded with CPU attention
    activations_to_host_bytes: int = 0  # CPU decodes' q/k/v, every layer
    activations_to_gpu_bytes: int = 0  # their attention outputs back
    swap_issue_s: float = 0.0  # issuing swaps (the GPU waits for them on its stream)
    copies_wait_s: float = 0.0  # after the forward, until CPU prefills' pages landed


class NeoRuntime(Engines):
    """NEO's one engine loop over an HBM pool, a pinned host pool and a CPU attention thread
    (on `cores` when given)."""

    uses_cpu_tier = True

    def __init__(self, specs: Sequence, config: NeoConfig, predictor: NeoPredictor,
                 gpu: GpuEngine, cores: list[int] | None = None) -> None:
        if gpu.tensor_parallel != 1:
            raise ValueError("--gpu-tp: the real NEO runs on one GPU (NEO's pipeline is "
                             "written for one); run it with --gpu-tp 1")
        super().__init__(specs, config.block_size, gpu.shape.vocab_size)
        self.core = neo_schedulers(config, predictor, self.journal)
        self.sched, self.driver = self.core.state, self.core.drivers["gpu"]
        self.states = StateLog(state_reader(self.sched))
        self.stats = NeoRunStats(launch_s=predictor.lnch_T)
        device = gpu.weights.embed.device
        pool = PagedKVPool(gpu.shape, config.gpu_kv_blocks, config.block_size, device=device,
                           dtype=gpu.dtype)
        host = PagedKVPool(gpu.shape, config.host_kv_blocks, config.block_size, device="cpu",
                           pin_memory=True, dtype=gpu.dtype)
        # eager, as SwiftLLM runs (no CUDA graphs)
        self.gpu = GpuExecutor(Model(gpu.shape, gpu.weights), pool, self.tokens, host,
                               cuda_graphs=False)
        self.neo = NeoExecutor(self.gpu, cores)
        self.cores = cores

    @classmethod
    def for_run(cls, specs: Sequence, config: NeoConfig, gpu: GpuEngine, cost: CostModel,
                cores: list[int] | None, cpu_tp: int) -> NeoRuntime:
        """The runtime deciding with NEO's tables over `cost` (as the simulator's NEO does),
        its CPU attention on `cores` (`cpu_tp`: DualPace's CPU engine's only)."""
        return cls(specs, config, NeoTables(cost, config.launch_s), gpu, cores)

    def serve(self):
        """Run the workload; the engine's own threads keep off the CPU attention's cores."""
        try:
            with on_cores(self._own_cores(set(self.cores) if self.cores else None)):
                return self.run({"GPU": self._loop}, self.core.submit,
                                lambda: self.core.finished)
        finally:
            self.stats.cpu_busy_s = self.neo.cpu.busy_s
            self.stats.activations_to_host_bytes = self.neo.link.to_host_bytes
            self.stats.activations_to_gpu_bytes = self.neo.link.to_gpu_bytes
            self.neo.close()

    def queue_lengths(self) -> dict[str, int]:
        """NEO's queues (the caller holds the lock)."""
        s = self.sched
        return {"waiting": len(s.waiting), "gpu_decoding": len(s.gpu_q),
                "cpu_decoding": len(s.cpu_q)}

    def pool_occupancy(self) -> dict[str, tuple[int, int]]:
        """(used, capacity) blocks of each KV pool (the caller holds the lock)."""
        s = self.sched
        return {"hbm": (s.hbm.used, s.hbm.capacity), "host": (s.host.used, s.host.capacity)}

    def _loop(self) -> None:
        while not self.stop.is_set():
            with self.work:
                rnd = self.driver.begin(self.call_time())
                if rnd.idle:  # (the scenario's check refused what could stall here)
                    self.work.wait(0.01)
                    continue
            plan = rnd.plan
            start, t0 = time.perf_counter(), self.now()
            tokens, times = self.neo.iterate(plan)
            self.stats.gpu_busy_s += time.perf_counter() - start
            self._count(plan, times)
            self._trace(plan, times, t0, self.now())
            if not rnd.forward:
                continue
            with self.work:
                self.driver.end(rnd, self.call_time(), tokens)
                for req_id, tok in tokens.items():
                    self.tokens.append(req_id, tok)

    def _count(self, plan: NeoPlan, times: IterationTimes) -> None:
        st = self.stats
        st.swap_outs += len(plan.swap_outs)
        st.swap_ins += len(plan.swap_ins)
        st.swap_issue_s += times.swap_s
        st.copies_wait_s += times.copies_s
        if not plan.batches:
            return
        st.gpu_rounds += 1
        st.pipelined_iterations += plan.pipelined
        st.prefills_to_cpu += sum(len(b.cpu_prefills) for b in plan.batches)
        n_cpu = sum(len(b.cpu_decodes) for b in plan.batches)
        st.cpu_decode_tokens += n_cpu
        st.cpu_rounds += n_cpu > 0

    def _trace(self, plan: NeoPlan, times: IterationTimes, start_s: float,
               end_s: float) -> None:
        """The iteration on the GPU engine's track, its CPU attention beside it (inside every
        layer, so one slice spans the forward), its swaps on the link's tracks (also the
        engines' busy intervals, traced or not)."""
        batches = plan.batches
        cpu = tuple(len(b.cpu_decodes) for b in batches)
        self.slice(GPU_ENGINE, "iteration" if batches else "swaps", start_s, end_s,
                   pipelined=plan.pipelined, rows=tuple(times.sub_batches), cpu_decodes=cpu,
                   cpu_prefills=[r.req_id for b in batches for r in b.cpu_prefills])
        if any(cpu):
            forward_end = start_s + times.swap_s + times.forward_s
            self.slice(CPU_ENGINE, "CPU attention", start_s + times.swap_s, forward_end,
                       decodes=cpu, requests=[r.req_id for b in batches for r in b.cpu_decodes])
        trace_swaps(self, plan, start_s, end_s)
