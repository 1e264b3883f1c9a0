"""The real dual-engine runtime: DualPace's GPU and CPU engines driving the executors on a box.

Two processes. This one holds the shared core state and three threads: the GPU engine, the CPU
engine's scheduler, and the load generator; each engine thread loops through its driver
(`dualpace_sim.core.rounds`) with no iteration barrier. The CPU engine's execution runs in its
own process (`cpu_worker`), over the host KV pool in shared memory, so its per-layer Python never
waits for the GIL behind the GPU engine's kernel launches. The GPU engine serves Dense Assist at
its stage boundaries (`assist_server`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from dualpace_hw.executors.cpu_executor import CpuStep
from dualpace_hw.runtime.assist_server import AssistServer, run_forward
from dualpace_hw.runtime.cpu_worker import CpuEngineProcess
from dualpace_hw.runtime.engines import Engines, trace_gpu_round
from dualpace_hw.runtime.gpu_engine import GpuEngine
from dualpace_hw.runtime.processes import on_cores
from dualpace_sim.core import Request, SchedulerConfig, assist_reachable
from dualpace_sim.core.policies import dualpace_schedulers
from dualpace_sim.core.rounds import Round, RoundKind
from dualpace_sim.core.routing import Route
from dualpace_sim.costs import CostModel
from dualpace_sim.costs.calibrate import ASSISTS_FILE, write_assist_calls
from dualpace_sim.costs.cpu_step_records import CPU_STEPS_FILE, CpuStepRecord, write_cpu_steps
from dualpace_sim.results.node_series import StateLog, state_reader
from dualpace_sim.results.trace_events import CPU_ENGINE, GPU_ENGINE


class DualPaceRuntime(Engines):
    """GPU engine + CPU engine over the shared core state.

    The runtime owns `cpu_engine` (the CPU engine's process and the shared host KV pool) from
    here on: `serve` stops it and frees its memory however the run ends."""

    uses_cpu_tier = True

    def __init__(self, specs: Sequence, config: SchedulerConfig, gpu: GpuEngine,
                 cpu_engine: CpuEngineProcess) -> None:
        super().__init__(specs, config.block_size, gpu.shape.vocab_size)
        self.core = dualpace_schedulers(config, journal=self.journal)
        self.state = self.core.state
        self.states = StateLog(state_reader(self.state))
        self.gpu_driver, self.cpu_driver = self.core.drivers["gpu"], self.core.drivers["cpu"]
        self.round_tokens = config.gpu_batch_tokens
        self.stage_mode = assist_reachable(config.largest_cpu_batch, config.route_f)
        self.channel = AssistServer(cpu_engine.assist, self)
        self.cpu_engine = cpu_engine
        self.cpu_steps: list[CpuStepRecord] = []  # one per step, phase by phase
        try:
            self.gpu = gpu.build(self.tokens, cpu_engine)
        except BaseException:
            cpu_engine.close()
            raise
        self.gpu.sampler = cpu_engine.sampler = self.sampler

    @classmethod
    def for_run(cls, specs: Sequence, config: SchedulerConfig, gpu: GpuEngine, cost: CostModel,
                cores: list[int] | None, cpu_tp: int) -> DualPaceRuntime:
        """The runtime with its CPU engine's process started, on `cores` with `cpu_tp` ranks,
        over a host pool of the config's size (`cost`: NEO's only)."""
        cpu_engine = CpuEngineProcess(gpu.weights, gpu.shape, config.host_kv_blocks,
                                      config.block_size, max_rows=config.largest_cpu_batch,
                                      cores=cores, tp=cpu_tp, dtype=gpu.dtype)
        return cls(specs, config, gpu, cpu_engine)

    def serve(self) -> list[Request]:
        cores = self.cpu_engine.cores
        try:
            with on_cores(self._own_cores(set(cores) if cores else None)):
                return self.run({"GPU": self._gpu_loop, "CPU": self._cpu_loop},
                                self.core.submit, lambda: self.core.finished)
        finally:
            ch = self.channel
            self.stats.assist_calls, self.stats.assist_wait_s = ch.calls, ch.wait_s
            self.stats.assist_service_s, self.stats.assist_gpu_s = ch.service_s, ch.gpu_s
            self.cpu_engine.close()
            self.close_gpu()

    def describe_engines(self) -> str:
        """Where the CPU engine runs, for the run's first lines."""
        engine = self.cpu_engine
        ranks = f" ({engine.tp} tensor-parallel ranks: {engine.pids})" if engine.tp > 1 else ""
        cores = "cores " + str(list(engine.cores)) if engine.cores else "all cores"
        return f"CPU engine process {engine.pid} on {cores}{ranks}"

    def queue_lengths(self) -> dict[str, int]:
        """The core's queues (the caller holds the lock), for the server's /metrics."""
        st = self.state
        return {"gpu_waiting": len(st.gpu_waiting), "gpu_prefilling": len(st.gpu_prefilling),
                "gpu_running": len(st.gpu_running), "cpu_waiting": len(st.cpu_waiting),
                "cpu_running": len(st.cpu_running), "copy_group": len(st.copy_group)}

    def pool_occupancy(self) -> dict[str, tuple[int, int]]:
        """(used, capacity) blocks of each KV pool (the caller holds the lock)."""
        st = self.state
        return {"hbm": (st.hbm.used, st.hbm.capacity), "host": (st.host.used, st.host.capacity)}

    def _idle_wait(self) -> None:
        if self.channel.expecting:  # an assist may come any moment: poll the block a while
            deadline = time.perf_counter() + 0.001
            while self.channel.expecting and time.perf_counter() < deadline:
                if self.channel.serve(self.gpu):
                    return
                time.sleep(20e-6)
            return
        with self.work:
            if not self.stop.is_set():
                self.work.wait(0.01)

    # ---------------------------------------------------------------------- GPU engine

    def _gpu_loop(self) -> None:
        while not self.stop.is_set():
            self.channel.serve(self.gpu)
            with self.lock:
                rnd = self.gpu_driver.begin(self.call_time())
            if rnd.kind is RoundKind.WAIT_FOR_COPIES:
                self._wait_for_copies(rnd)
            elif rnd.idle:
                self._idle_wait()
            else:
                self._gpu_round(rnd)

    def _wait_for_copies(self, rnd: Round) -> None:
        ex, waited_from = self.gpu, self.now()
        while not ex.copies_done():
            self.channel.serve(ex)
            time.sleep(0.0002)
        with self.work:
            done = self.call_time()
            self.gpu_driver.landed(rnd, done)
            self.cpu_work.notify_all()
        self.slice(GPU_ENGINE, "wait for Prefill-to-CPU copies", waited_from, done)

    def _gpu_round(self, rnd: Round) -> None:
        """The round's moves (issued first) and forward; then its swaps landed and its
        tokens, as one core call each."""
        ex, plan = self.gpu, rnd.plan
        self.stats.gpu_rounds += 1
        start, t0 = time.perf_counter(), self.now()
        tokens: dict[int, int] = {}
        if rnd.forward:
            tokens = run_forward(ex, ex.stages(plan, rnd.moves), self.channel, self.stage_mode)
        elif rnd.moves.any:
            ex.migrate(rnd.moves)
        if ex.swap_handle is not None and rnd.moves.any:
            ex.swap_handle.wait()
        self.stats.gpu_busy_s += time.perf_counter() - start
        trace_gpu_round(self, plan, t0, self.now())
        with self.work:
            if rnd.lands:
                self.gpu_driver.landed(rnd, self.call_time())
            if rnd.forward:
                self.gpu_driver.end(rnd, self.call_time(), tokens)
                for req_id, tok in tokens.items():
                    self.tokens.append(req_id, tok)
            if rnd.moves.any or plan.marks or plan.copy_chunks:
                self.cpu_work.notify_all()  # new CPU work, or marks to yield

    # ---------------------------------------------------------------------- CPU engine

    def _cpu_loop(self) -> None:
        bs = self.state.config.block_size
        while not self.stop.is_set():
            with self.work:
                rnd = self.cpu_driver.begin(self.call_time())
                plan = rnd.plan
                if plan.held_back or plan.admitted:
                    self.work.notify_all()
                if rnd.idle:
                    self.cpu_work.wait(0.1)
                    continue
                step = CpuStep.from_plan(plan, self.tokens, bs)
            self.stats.cpu_rounds += 1
            routes = self.stats.routes
            routes[plan.route.value] = routes.get(plan.route.value, 0) + 1
            self.channel.expecting = plan.route != Route.FULL_CPU
            t0 = self.now()
            try:
                done = self.cpu_engine.step(step, self.stop.is_set)
            finally:
                self.channel.expecting = False
            self._record_step(rnd, done, t0)
            with self.work:
                self.cpu_driver.end(rnd, self.call_time(), done.tokens)
                for req_id, tok in done.tokens.items():
                    self.tokens.append(req_id, tok)
                self.work.notify_all()

    def _record_step(self, rnd: Round, done, t0: float) -> None:
        """A CPU step's counters, its phases and its timeline slice."""
        plan, ph = rnd.plan, done.phases
        self.stats.cpu_busy_s += done.busy_s
        self.stats.cpu_assist_s += done.assist_s
        self.cpu_steps.append(CpuStepRecord(
            plan.route.value, len(plan.batch), plan.context, done.busy_s, ph.setup_s,
            ph.pre_layer_s, ph.pre_attn_s, ph.kv_write_s, ph.attention_s, ph.assists_s,
            ph.post_s))
        self.slice(CPU_ENGINE, plan.route.value, t0, self.now(), batch=len(plan.batch),
                   context=plan.context, assist_ms=round(done.assist_s * 1e3, 3),
                   requests=[r.req_id for r in plan.batch])

    def write_extras(self, out: Path) -> None:
        """Beside the journal: each Dense Assist, for the Appendix B calibration, and each CPU
        step, phase by phase."""
        write_assist_calls(self.channel.records, out / ASSISTS_FILE.format(policy="dualpace"))
        write_cpu_steps(self.cpu_steps, out / CPU_STEPS_FILE.format(policy="dualpace"))
