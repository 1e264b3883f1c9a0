"""The real dual-engine runtime: the core's schedulers driving the executors on a real box.

Design: two processes. The main process holds the shared core state and three threads: the GPU
engine, the CPU engine's scheduler, and the load generator. The GPU engine thread and the CPU
engine thread each loop schedule -> commit -> execute -> apply with no iteration barrier; they
take one lock only for the core's calls (microseconds), never while executing. The CPU engine's
execution runs in its own process (`cpu_worker`), over the host KV pool in shared memory, so
its per-layer Python never waits for the GIL behind the GPU engine's kernel launches. Dense
Assist goes CPU-Ready -> GPU-Running -> GPU-Done through a control block in shared memory,
which the GPU thread polls at stage boundaries only (and continuously when it is idle).

Every core call is recorded, in lock order, in a `Journal`: `dualpace_sim.results.replay` replays it
through fresh schedulers and must reproduce every plan.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dualpace_hw.executors.cpu_executor import CpuStep
from dualpace_hw.executors.gpu import Forward, GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.executors.sampling import Sampler, SamplingParams
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.runtime.cpu_worker import AssistBlock, CpuEngineProcess, WorkerFailed
from dualpace_hw.runtime.gpu_ranks import LeadExecutor
from dualpace_hw.runtime.processes import cores_off, on_cores
from dualpace_sim.core import (
    CpuResult,
    CpuScheduler,
    EngineState,
    GpuResult,
    GpuScheduler,
    Request,
    SchedulerConfig,
    assist_reachable,
)
from dualpace_sim.core.journal import Journal, describe_cpu, describe_gpu
from dualpace_sim.core.routing import Route
from dualpace_sim.core.vllm import VllmConfig, VllmScheduler
from dualpace_sim.costs.calibrate import AssistCall
from dualpace_sim.costs.cpu_step_records import CpuStepRecord
from dualpace_sim.costs.shapes import ModelShape
from dualpace_sim.results.node_series import Busy, NodeSeries, StateLog, state_reader
from dualpace_sim.results.trace_events import (
    CPU_ENGINE,
    DENSE_ASSIST,
    GPU_ENGINE,
    PCIE_D2H,
    PCIE_H2D,
    TraceRecorder,
)


class _StagePace:
    """Bounds how far the GPU engine's host thread runs ahead of the GPU, stage by stage.

    Kernel launches are asynchronous: left alone, the host enqueues a whole round and then
    blocks until the GPU finishes it, and a Dense Assist published meanwhile waits for the
    whole round. Recording an event per stage and waiting for the one before lets the host serve
    assists at real stage boundaries while the GPU always has the next stage queued."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.events: list[torch.cuda.Event] = []

    def stage_done(self) -> None:
        if not self.cuda:
            return
        ev = torch.cuda.Event()
        ev.record()
        self.events.append(ev)
        if len(self.events) >= 2:
            self.events[-2].synchronize()

    def drain(self, serve) -> None:
        """Wait for the round's last stage, serving assists meanwhile."""
        if not self.events:
            return
        last = self.events[-1]
        while not last.query():
            if not serve():
                time.sleep(50e-6)


@dataclass
class GpuEngine:
    """What the GPU engine's executor is built from: the full model's weights on the first
    GPU and its HBM pool's size; with `tensor_parallel` > 1, rank 0 of that many GPU ranks."""

    shape: ModelShape
    weights: ModelWeights
    gpu_blocks: int
    block_size: int
    dtype: torch.dtype
    tensor_parallel: int = 1

    def build(self, tokens: TokenStore, cpu_engine: CpuEngineProcess | None = None
              ) -> GpuExecutor:
        host_pool = cpu_engine.host_pool if cpu_engine is not None else None
        if self.tensor_parallel == 1:
            pool = PagedKVPool(self.shape, self.gpu_blocks, self.block_size,
                               device=self.weights.embed.device, dtype=self.dtype)
            return GpuExecutor(Model(self.shape, self.weights), pool, tokens, host_pool)
        return LeadExecutor(self.shape, self.weights, self.tensor_parallel, self.gpu_blocks,
                            self.block_size, tokens, self.dtype, host_pool,
                            cpu_engine.share if cpu_engine is not None else None,
                            cpu_engine.cores if cpu_engine is not None else None)


class EngineFailure(RuntimeError):
    """An engine thread failed; the message names it and the others stopped."""


_ASSIST_NAMES = {"p": "post-attention", "lA": "fused final", "lS": "post-layer"}


class AssistServer:
    """The GPU engine's side of Dense Assist: polls the shared control block at stage
    boundaries; a CPU-Ready request becomes GPU-Running, runs, and is published GPU-Done."""

    _METHODS = {"p": "assist_post_attn", "lA": "assist_fused_final", "lS": "assist_post_layer"}

    def __init__(self, block: AssistBlock, engines: Engines) -> None:
        self.block = block
        self.engines = engines  # for the clock and the timeline trace
        self.calls = 0
        self.wait_s = 0.0  # CPU-Ready -> GPU-Running, summed: the stage-boundary wait
        self.service_s = 0.0  # GPU-Running -> GPU-Done, summed
        self.gpu_s = 0.0  # the assists' own GPU time (CUDA events), summed: the service less
        # the GPU stage each one queued behind and the host's part
        self.expecting = False  # the CPU engine is in a step that needs Dense Assist
        self.records: list[AssistCall] = []  # one per call, for Appendix B's calibration

    def serve(self, ex: GpuExecutor) -> bool:
        """Run a ready request, if any; True when one was served."""
        b = self.block
        if not b.ready():
            return False
        start, t0 = time.perf_counter(), self.engines.now()
        kind, layer, rows, waited = b.take()
        began = _timing_event(ex)
        # Results go straight into the shared buffers (one DMA on CUDA, no CPU copy).
        if kind == "lS":
            ex.assist_post_layer(b.residual[:rows], out=b.tokens[:rows])
        else:
            out = b.hidden[:rows] if kind == "p" else b.tokens[:rows]
            getattr(ex, self._METHODS[kind])(layer, b.attn[:rows], b.residual[:rows], out=out)
        cuda_s = 0.0
        if began is not None:
            ended = _timing_event(ex)
            ended.synchronize()  # the assist synchronized already: this returns at once
            cuda_s = began.elapsed_time(ended) / 1e3
        b.done()
        service = time.perf_counter() - start
        self.calls += 1
        self.wait_s += waited
        self.service_s += service
        self.gpu_s += cuda_s
        # W: CPU-Ready -> GPU-Done; L + F: the service the CUDA interval does not cover
        self.records.append(AssistCall(kind, rows, waited + service, cuda_s,
                                       max(service - cuda_s, 0.0)))
        self.engines.slice(DENSE_ASSIST, _ASSIST_NAMES[kind], t0, self.engines.now(), rows=rows,
                           layer=layer, queued_us=round(waited * 1e6, 1))
        return True


def _timing_event(ex: GpuExecutor) -> torch.cuda.Event | None:
    """A timing event recorded now on the stream the executor's assists run on (None off
    CUDA)."""
    if not ex.cuda:
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record(ex.assist_stream)
    return event


def run_forward(ex: GpuExecutor, fw: Forward, channel: AssistServer, paced: bool
                ) -> dict[int, int]:
    """A round's forward as the GPU engine serves it; returns its tokens. With `paced` (the
    CPU engine's steps may need Dense Assist), a ready assist goes first at every stage
    boundary and, while the CPU engine is in such a step, the host stays at most one stage
    ahead of the GPU, so an assist waits for one stage, not the whole round."""
    pace = _StagePace(ex.device) if paced else None
    for stage in fw:
        stage()
        if pace is not None:
            if channel.expecting:
                pace.stage_done()
            channel.serve(ex)
    if pace is not None:
        pace.drain(lambda: channel.serve(ex))
    return fw.result()


@dataclass
class RunStats:
    gpu_rounds: int = 0
    cpu_rounds: int = 0
    assist_calls: int = 0
    assist_wait_s: float = 0.0  # Dense Assists: CPU-Ready -> GPU-Running (stage boundaries)
    assist_service_s: float = 0.0  # GPU-Running -> GPU-Done (inputs in, stage, outputs out)
    assist_gpu_s: float = 0.0  # of which the assists' own GPU work (CUDA; 0 on the CPU)
    cpu_assist_s: float = 0.0  # the CPU engine's process, waiting on its assists end to end
    cpu_busy_s: float = 0.0
    gpu_busy_s: float = 0.0
    wall_s: float = 0.0
    warm_up_s: float = 0.0  # before the clock started
    graphs_warmed: int = 0  # decode graphs captured in the warm-up
    chunked_buckets_warmed: int = 0  # chunked rounds' token buckets captured in the warm-up
    graph_captures: int = 0  # decode graphs captured on first use, on the clock (rounds paid)
    routes: dict[str, int] = field(default_factory=dict)


def prompt_ids(req_id: int, n: int, vocab: int) -> list[int]:
    """Deterministic synthetic prompt token ids (timing does not depend on values)."""
    g = torch.Generator().manual_seed(req_id)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


# The engine of `node_series.Busy` each trace track's slices are work of; on the GPU engine's
# track only forwards and NEO iterations are (not its waits), on the CPU engine's not its waits.
BUSY_TRACKS = {GPU_ENGINE: "gpu", DENSE_ASSIST: "gpu", CPU_ENGINE: "cpu", PCIE_H2D: "pcie_h2d",
               PCIE_D2H: "pcie_d2h"}
GPU_WORK = ("forward", "iteration")


class Engines:
    """Shared plumbing: clock, lock, wake-ups, stop, failure propagation, arrivals, journal."""

    def __init__(self, specs: Sequence, block_size: int, vocab: int) -> None:
        self.requests = [Request.create(i, s.arrival_s, s.prompt_tokens, s.max_tokens,
                                        block_size) for i, s in enumerate(specs)]
        self.tokens = TokenStore()
        self.vocab = vocab
        self.lock = threading.Lock()
        # One lock, two wake-up channels: an engine is woken only by events that concern it.
        # Each needless wake-up costs the GPU thread a GIL hand-off (up to the switch interval).
        self.work = threading.Condition(self.lock)  # the GPU engine's
        self.cpu_work = threading.Condition(self.lock)  # the CPU engine's
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.t0 = 0.0
        self.stats = RunStats()
        self.journal = Journal()  # appended to under self.lock only
        self.trace: TraceRecorder | None = None  # the timeline, when asked for
        # Queues and KV over time (set by each subclass over its scheduler) and when each
        # engine worked: the series `dualpace-sim run` records, from the same core state.
        self.states: StateLog | None = None
        self.busy = Busy()
        self._last_call_s = 0.0
        self.block_size = block_size
        # Serving (`accept_requests`): requests come from `submit_now` while the run lasts,
        # and the run ends only when stopped, not when the requests so far are finished.
        self.accepting = False
        self.scheduled = len(self.requests)  # the scenario's arrivals (the load generator's)
        self.warm_for: tuple[int, int] | None = None  # (rows, context) to warm up for, serving
        self.round_tokens = 0  # the most tokens a GPU round carries (the chunked graphs' warm-up)
        self.started = threading.Event()  # the clock runs and `submit_now` may be called
        self._submit = None  # the core's submit, once the run has started
        self.sampler = Sampler()  # served requests that sample (the rest are greedy)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def record(self, engine: str, call: str, **data) -> float:
        """Journal a core call (the caller holds the lock, and makes the call after this);
        returns the clock time to pass."""
        t = self.now()
        self.note_call(t)
        self.journal.record(t, engine, call, **data)
        return t

    def note_call(self, t: float) -> None:
        """A core call is about to be made at `t` (the caller holds the lock): the state now
        is what the previous call left, which held from that call's time until this one."""
        if self.states is not None:
            self.states.sample(self._last_call_s)
        self._last_call_s = t

    def series(self) -> NodeSeries:
        """Queues, KV and utilisation over the run (`dualpace_sim.results.node_series`), the state
        the
        last core call left included; called once the engines have stopped (or were given
        up on: then without their lock, which a stuck one may hold)."""
        self.states.sample(self._last_call_s)
        return NodeSeries.of(self.states, self.busy, max(self.stats.wall_s, self._last_call_s))

    def slice(self, track: str, name: str, start_s: float, end_s: float, **args) -> None:
        """A stretch of an engine's work or wait: in the engines' busy intervals (forwards
        and assists of the GPU, the CPU engine's rounds, each link direction's copies) and, when
        asked for, a timeline slice in the format `dualpace-sim run --trace-events` writes."""
        worked = BUSY_TRACKS.get(track)
        if worked is not None and not (track == GPU_ENGINE and name not in GPU_WORK) and not (
                track == CPU_ENGINE and name.startswith("wait")):
            getattr(self.busy, worked).add(start_s, end_s)
        if self.trace is not None:
            self.trace.complete(track, name, start_s, end_s, **args)

    def wake(self) -> None:
        with self.work:
            self.work.notify_all()
            self.cpu_work.notify_all()

    def _guard(self, name: str, body) -> None:
        try:
            body()
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            if self.error is None and not self.stop.is_set():
                lost = self._dead_rank(wait_s=2.0) if name == "GPU" else None
                self.error = EngineFailure(
                    f"{name} engine failed: {lost or e}" if lost or isinstance(e, WorkerFailed)
                    else f"{name} engine failed: {type(e).__name__}: {e}")
                self.error.__cause__ = e
            self.stop.set()
            self.wake()

    def _arrivals(self, submit) -> None:
        for r in self.requests[: self.scheduled]:
            delay = r.arrival_s - self.now()
            if delay > 0 and self.stop.wait(delay):
                return
            self.tokens.add(r.req_id, prompt_ids(r.req_id, r.prompt_tokens, self.vocab))
            with self.work:
                self.record("load", "submit", req=r.req_id)
                submit(r)
                self.work.notify_all()
                self.cpu_work.notify_all()

    # --- requests arriving from a server (dualpace_hw.serving.service) --------------------------

    def accept_requests(self, max_rows: int, max_context: int) -> None:
        """Before `serve`: take requests from `submit_now` until `stop` is set, beside (or
        instead of) the scenario's own arrivals; warm up for batches of up to `max_rows`
        requests of up to `max_context` tokens (the scenario's workload cannot say)."""
        self.accepting = True
        self.warm_for = (max_rows, max_context)

    def submit_now(self, prompt_ids: list[int], max_tokens: int,
                   sampling: SamplingParams | None = None) -> Request:
        """A request arriving now (any thread, once `started` is set): journaled and handed to
        the core exactly as a load-generator arrival is. Its id is the next free one."""
        if not self.started.is_set():
            raise RuntimeError("the runtime has not started: call serve() first")
        with self.work:
            if self.stop.is_set():
                raise RuntimeError("the runtime is stopping")
            r = Request.create(len(self.requests), self.now(), len(prompt_ids), max_tokens,
                               self.block_size)
            self.tokens.add(r.req_id, prompt_ids)
            if sampling is not None:
                self.sampler.add(r.req_id, sampling)
            self.requests.append(r)
            self.record("load", "submit", req=r.req_id)
            self._submit(r)
            self.work.notify_all()
            self.cpu_work.notify_all()
        return r

    def finish_early(self, r: Request) -> None:
        """End a request after at most one more token (a stop string, EOS, a cancelled client):
        its cap drops to the next token, so the core finishes it in its own apply, wherever it
        is, with no other change to the round protocol."""
        with self.lock:
            r.max_tokens = max(1, min(r.max_tokens, r.generated + 1))

    def _dead_rank(self, wait_s: float = 0.0) -> str | None:
        """A GPU tensor-parallel rank that died, if any. A collective with a dead rank fails
        with the transport's words (or never returns): waiting `wait_s` for the process to be
        seen dead names the real cause instead."""
        if not isinstance(self.gpu, LeadExecutor):
            return None
        deadline = time.perf_counter() + wait_s
        while (lost := self.gpu.failure()) is None and time.perf_counter() < deadline:
            time.sleep(0.05)
        return lost

    def _lost_rank(self, threads: list[threading.Thread]) -> bool:
        """Whether a GPU tensor-parallel rank died: the engine thread may be blocked for good
        in a collective with it, so the run ends without waiting for that thread (a daemon)."""
        lost = self._dead_rank()
        if lost is None:
            return False
        if self.error is None:
            self.error = EngineFailure(f"GPU engine failed: {lost}")
        self.stop.set()
        self.wake()
        for t in threads:
            t.join(1.0)
        return True

    def _own_cores(self, cpu_engine: set[int] | None) -> set[int] | None:
        """The cores this process keeps: off the CPU engine's and off the other GPU ranks'."""
        if isinstance(self.gpu, LeadExecutor):
            return set(self.gpu.host_cores) if self.gpu.host_cores else None
        return cores_off(cpu_engine)

    def close_gpu(self) -> None:
        if isinstance(self.gpu, LeadExecutor):
            self.gpu.close()

    def run(self, loops: dict[str, object], submit, finished) -> list[Request]:
        threads = [threading.Thread(target=self._guard, args=(n, f), name=n, daemon=True)
                   for n, f in loops.items()]
        threads.append(threading.Thread(target=self._guard, name="arrivals", daemon=True,
                                        args=("load generator", lambda: self._arrivals(submit))))
        # First-use compiles and graph captures, off the clock.
        self.stats.warm_up_s, self.stats.graphs_warmed = self.gpu.warm_up(*self.warm_for or (
            min(len(self.requests), self.gpu.pool.n_blocks),  # a decoding request holds a block
            max((r.prompt_tokens + r.max_tokens for r in self.requests), default=0)),
            self.round_tokens)
        self.stats.chunked_buckets_warmed = self.gpu.chunked_buckets
        interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0005)  # bound a GIL hand-off to 0.5 ms instead of 5 ms
        self.t0 = time.perf_counter()
        self._submit = submit
        self.started.set()
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                drained = not self.accepting and len(finished()) == len(self.requests)
                if drained or self.stop.is_set():
                    self.stop.set()
                    self.wake()
                if self._lost_rank(threads):
                    break
                for t in threads:
                    t.join(0.05)
        except KeyboardInterrupt:
            self.stop.set()
            self.wake()
            for t in threads:
                t.join(5)
            raise
        finally:
            sys.setswitchinterval(interval)
        self.stats.wall_s = self.now()
        self.stats.graph_captures = self.gpu.graph_captures
        if self.error is not None:
            raise self.error
        return self.requests


class DualPaceRuntime(Engines):
    """GPU engine + CPU engine over the shared core state.

    The runtime owns `cpu_engine` (the CPU engine's process and the shared host KV pool) from
    here on: `serve` stops it and frees its memory however the run ends."""

    def __init__(self, specs: Sequence, config: SchedulerConfig, gpu: GpuEngine,
                 cpu_engine: CpuEngineProcess) -> None:
        super().__init__(specs, config.block_size, gpu.shape.vocab_size)
        self.state = EngineState(config)
        self.states = StateLog(state_reader(self.state))
        self.gpu_sched, self.cpu_sched = GpuScheduler(self.state), CpuScheduler(self.state)
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

    def serve(self) -> list[Request]:
        cores = self.cpu_engine.cores
        try:
            with on_cores(self._own_cores(set(cores) if cores else None)):
                return self.run({"GPU": self._gpu_loop, "CPU": self._cpu_loop},
                                self.state.submit, lambda: self.state.finished)
        finally:
            ch = self.channel
            self.stats.assist_calls, self.stats.assist_wait_s = ch.calls, ch.wait_s
            self.stats.assist_service_s, self.stats.assist_gpu_s = ch.service_s, ch.gpu_s
            self.cpu_engine.close()
            self.close_gpu()

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

    def _gpu_loop(self) -> None:
        st, sched, ex = self.state, self.gpu_sched, self.gpu
        while not self.stop.is_set():
            self.channel.serve(ex)
            with self.lock:
                plan = sched.schedule()
                committed = not (plan.wait_for_copies or plan.is_empty)
                self.record("gpu", "schedule", plan=describe_gpu(plan), committed=committed)
                moves = sched.commit(plan) if committed else None
            if plan.wait_for_copies:
                waited_from = self.now()
                while not ex.copies_done():
                    self.channel.serve(ex)
                    time.sleep(0.0002)
                with self.work:
                    done = self.record("gpu", "copies_done")
                    st.complete_copy_group(done)
                    self.cpu_work.notify_all()
                self.slice(GPU_ENGINE, "wait for Prefill-to-CPU copies", waited_from, done)
                continue
            if plan.is_empty:
                self._idle_wait()
                continue
            self.stats.gpu_rounds += 1
            start, t0 = time.perf_counter(), self.now()
            tokens: dict[int, int] = {}
            if plan.has_forward:
                tokens = run_forward(ex, ex.stages(plan, moves), self.channel, self.stage_mode)
            elif plan.has_migrations:
                ex.migrate(moves)
            if ex.swap_handle is not None and plan.has_migrations:
                ex.swap_handle.wait()
            self.stats.gpu_busy_s += time.perf_counter() - start
            _trace_gpu_round(self, plan, t0, self.now())
            with self.work:
                if plan.has_migrations:
                    st.complete_migrations(plan.swap_outs, plan.swap_ins,
                                           self.record("gpu", "migrations_done"))
                if plan.has_forward:
                    sched.apply(plan, GpuResult(self.record("gpu", "apply", tokens=tokens),
                                                tokens))
                    for req_id, tok in tokens.items():
                        self.tokens.append(req_id, tok)
                if plan.has_migrations or plan.marks or any(c.to_cpu for c in plan.prefills):
                    self.cpu_work.notify_all()  # new CPU work, or marks to yield

    def _cpu_loop(self) -> None:
        sched, bs = self.cpu_sched, self.state.config.block_size
        while not self.stop.is_set():
            with self.work:
                plan = sched.schedule()
                self.record("cpu", "schedule", plan=describe_cpu(plan))
                sched.commit(plan)
                if plan.held_back or plan.admitted:
                    self.work.notify_all()
                if plan.is_empty:
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
            tokens, ph = done.tokens, done.phases
            self.stats.cpu_busy_s += done.busy_s
            self.stats.cpu_assist_s += done.assist_s
            self.cpu_steps.append(CpuStepRecord(
                plan.route.value, len(plan.batch), plan.context, done.busy_s, ph.setup_s,
                ph.pre_layer_s, ph.pre_attn_s, ph.kv_write_s, ph.attention_s, ph.assists_s,
                ph.post_s))
            self.slice(CPU_ENGINE, plan.route.value, t0, self.now(), batch=len(plan.batch),
                       context=plan.context, assist_ms=round(done.assist_s * 1e3, 3),
                       requests=[r.req_id for r in plan.batch])
            with self.work:
                sched.apply(plan, CpuResult(self.record("cpu", "apply", tokens=tokens), tokens))
                for req_id, tok in tokens.items():
                    self.tokens.append(req_id, tok)
                self.work.notify_all()

def _trace_gpu_round(engines: Engines, plan, start_s: float, end_s: float) -> None:
    """A GPU round's slices (:meth:`Engines.slice`: busy intervals, and the trace when asked
    for): the forward (or migration-only round) on the GPU engine's track, and its swaps on
    the link's tracks (issue to completion, as the engine waited on them)."""
    if plan.has_forward:
        engines.slice(GPU_ENGINE, "forward", start_s, end_s, decodes=len(plan.decodes),
                      prefill_tokens=sum(c.tokens for c in plan.prefills),
                      prefill_to_cpu=[c.req.req_id for c in plan.prefills if c.to_cpu],
                      prefills=[c.req.req_id for c in plan.prefills if not c.to_cpu])
    else:
        engines.slice(GPU_ENGINE, "wait for swaps", start_s, end_s)
    trace_swaps(engines, plan, start_s, end_s)


def trace_swaps(engines: Engines, plan, start_s: float, end_s: float) -> None:
    """A round's swaps (a GpuPlan's or a NeoPlan's) on the link's tracks, issue to
    completion."""
    if plan.swap_outs:
        engines.slice(PCIE_D2H, "swap-out", start_s, end_s, blocks=plan.swap_out_blocks,
                      requests=[r.req_id for r in plan.swap_outs])
    if plan.swap_ins:
        engines.slice(PCIE_H2D, "swap-in", start_s, end_s, blocks=plan.swap_in_blocks,
                      requests=[r.req_id for r in plan.swap_ins])


class VllmRuntime(Engines):
    """vLLM's single GPU engine on the same executor."""

    def __init__(self, specs: Sequence, config: VllmConfig, gpu: GpuEngine) -> None:
        super().__init__(specs, config.block_size, gpu.shape.vocab_size)
        self.sched = VllmScheduler(config)
        self.round_tokens = config.max_num_batched_tokens
        self.states = StateLog(state_reader(self.sched))
        self.gpu = gpu.build(self.tokens)
        self.gpu.sampler = self.sampler

    def serve(self) -> list[Request]:
        try:
            with on_cores(self._own_cores(None)):
                return self.run({"GPU": self._loop}, self.sched.submit,
                                lambda: self.sched.finished)
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
                now = self.now()
                self.note_call(now)
                plan = self.sched.schedule(now)
                self.journal.record(now, "gpu", "schedule", plan=describe_gpu(plan))
                if not plan.has_forward:
                    self.work.wait(0.01)
                    continue
            self.stats.gpu_rounds += 1
            start, t0 = time.perf_counter(), self.now()
            tokens = self.gpu.execute(plan)
            self.stats.gpu_busy_s += time.perf_counter() - start
            _trace_gpu_round(self, plan, t0, self.now())
            with self.work:
                self.sched.apply(plan, GpuResult(self.record("gpu", "apply", tokens=tokens),
                                                 tokens))
                for req_id, tok in tokens.items():
                    self.tokens.append(req_id, tok)
