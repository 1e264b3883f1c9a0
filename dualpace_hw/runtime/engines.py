"""What every real runtime shares: the harness its engine threads run in.

A runtime's engine threads each loop through their engine's driver (`dualpace_sim.core.rounds`)
with no iteration barrier; they take one lock only for the core's calls (microseconds), never
while executing. The harness holds that lock, the clock, the wake-ups, stopping and failure
propagation, the load generator, the requests arriving from a server, and what a run leaves
beside its records: the journal of every core call, in lock order (the drivers write it), which
`dualpace_sim.results.replay` replays through fresh schedulers and must reproduce plan for plan;
the state series and the engines' busy intervals; and the timeline's slices.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dualpace_hw.executors.sampling import Sampler, SamplingParams
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.runtime.collector import ServingCollector
from dualpace_hw.runtime.cpu_worker import WorkerFailed
from dualpace_hw.runtime.gpu_ranks import LeadExecutor
from dualpace_hw.runtime.processes import cores_off
from dualpace_sim.core import Request
from dualpace_sim.core.journal import Journal
from dualpace_sim.results.node_series import Busy, NodeSeries, StateLog
from dualpace_sim.results.trace_events import (
    CPU_ENGINE,
    DENSE_ASSIST,
    GPU_ENGINE,
    PCIE_D2H,
    PCIE_H2D,
    TraceRecorder,
)


class EngineFailure(RuntimeError):
    """An engine thread failed; the message names it and the others stopped."""



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
    # The GPU engine's process's garbage collections while serving (`ServingCollector`).
    gc_collections: list[int] = field(default_factory=lambda: [0, 0, 0])  # per generation
    gc_pause_s: float = 0.0
    gc_longest_pause_s: float = 0.0


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

    # Whether the policy runs stages on the host's cores (a CPU engine, NEO's CPU attention):
    # `dualpace-hw run` then checks the CPU's speed against the profile around it.
    uses_cpu_tier = False

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

    def call_time(self) -> float:
        """The clock time to pass to a core call about to be made (the caller holds the lock;
        the call's driver journals it), noted for the state series."""
        t = self.now()
        self.note_call(t)
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
                self.journal.record(self.call_time(), "load", "submit", req=r.req_id)
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
            self.journal.record(self.call_time(), "load", "submit", req=r.req_id)
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

    def describe_engines(self) -> str | None:
        """Where the runtime's engines beside the GPU engine run, for the run's first lines
        (None: none to tell)."""
        return None

    def write_extras(self, out: Path) -> None:
        """The files a runtime leaves beside its journal: none, unless it has its own."""

    def close_gpu(self) -> None:
        if isinstance(self.gpu, LeadExecutor):
            self.gpu.close()

    def _serve(self, threads: list[threading.Thread], submit, finished) -> None:
        """Start the clock and the engines' threads, and wait until every request finished,
        the run is stopped or a rank is lost."""
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
        collector = ServingCollector()
        try:
            with collector:  # no full collections while serving
                self._serve(threads, submit, finished)
        finally:  # a stopped run's summary keeps its figures too
            sys.setswitchinterval(interval)
            self.stats.gc_collections = collector.seen.counts
            self.stats.gc_pause_s = collector.seen.pause_s
            self.stats.gc_longest_pause_s = collector.seen.longest_s
            self.stats.wall_s = self.now() if self.started.is_set() else 0.0
            self.stats.graph_captures = self.gpu.graph_captures
        if self.error is not None:
            raise self.error
        return self.requests


def trace_gpu_round(engines: Engines, plan, start_s: float, end_s: float) -> None:
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


