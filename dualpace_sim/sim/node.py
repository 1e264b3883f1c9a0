"""What every simulated serving node shares: the clock, arrivals, the PCIe link, the GPU
worker, wake-ups between engine loops, the end-of-run check and engine counters.

Policies differ only in their engine loops (subclasses); nothing here decides anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import simpy
from simpy.events import NORMAL

from dualpace_sim.results.node_series import Busy, Intervals, NodeSeries, StateLog, state_reader
from dualpace_sim.results.trace_events import GPU_ENGINE, PCIE_D2H, PCIE_H2D, TraceRecorder

from ..core import GpuPlan, Request
from ..core.policies import Schedulers
from ..core.rounds import Round
from ..costs import CostModel
from .gpu import GpuDevice
from .links import Link


def ids(reqs: Iterable[Request]) -> tuple[int, ...]:
    """Request ids for a trace slice's args: a tuple, not a list, because the garbage collector
    stops tracking tuples of ints, while hundreds of thousands of lists would slow it down."""
    return tuple(r.req_id for r in reqs)


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules: the simulator's unit of work,
    which the speed benchmarks report per request."""

    def __init__(self) -> None:
        super().__init__()
        self.events = 0

    def schedule(self, event: simpy.Event, priority: int = NORMAL, delay: float = 0) -> None:
        self.events += 1
        super().schedule(event, priority, delay)


class SimulationStalled(RuntimeError):
    """Every engine is idle with unfinished requests: the configuration cannot serve them."""


@dataclass
class SimStats:
    """Engine-level counters a run reports beside the per-request records."""

    gpu_rounds: int = 0
    migration_only_rounds: int = 0
    cpu_rounds: int = 0
    routes: dict[str, int] = field(default_factory=dict)  # route name -> CPU rounds
    swap_outs: int = 0
    swap_ins: int = 0
    prefills_to_cpu: int = 0
    preemptions: int = 0  # vLLM recompute preemptions
    pipelined_iterations: int = 0  # NEO iterations that ran two sub-batches
    assist_calls: int = 0
    gpu_busy_s: float = 0.0
    gpu_assist_s: float = 0.0
    cpu_busy_s: float = 0.0
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    stage_mode: bool = False
    end_s: float = 0.0


@dataclass
class SimOutput:
    requests: list[Request]  # in submission order
    stats: SimStats
    series: NodeSeries  # queues, KV and utilisation over time


class Node:
    """Base of a simulated node; subclasses start their engine processes in `_start`.

    With a `trace` recorder attached, the engine loops also record their rounds, transfers and
    assists on it; without one (the default) every recording site costs one `is None` test.
    """

    gpu_beside_cpu = False  # whether the GPU engine's host shares the box with a CPU engine

    def __init__(
        self,
        specs: Sequence,
        cost: CostModel,
        block_size: int,
        stage_mode: bool = False,
        on_finish: Callable[[int], None] | None = None,
        trace: TraceRecorder | None = None,
    ) -> None:
        self.env = CountingEnvironment()
        self.trace = trace
        self.cost = cost
        link = cost.profile.link
        self.link = Link(link.h2d_bytes_per_s, link.d2h_bytes_per_s, link.latency_s)
        self.gpu = GpuDevice(self.env, cost.poll_s, stage_mode)
        self.stats = SimStats(stage_mode=stage_mode)
        self.cpu_worked = Intervals()  # CPU rounds (DualPace) or CPU attention (NEO)
        self.requests = [
            Request.create(i, s.arrival_s, s.prompt_tokens, s.max_tokens, block_size)
            for i, s in enumerate(specs)
        ]
        self.core: Schedulers | None = None  # the policy's, set by each subclass (`_drive`)
        self.states: StateLog | None = None
        self._on_finish = on_finish
        self._events: dict[str, simpy.Event] = {}
        self._n_finished = 0
        self._n_layers = cost.n_layers

    # --- for subclasses ----------------------------------------------------------------

    def _start(self) -> None:
        raise NotImplementedError

    def _describe(self) -> str:
        raise NotImplementedError

    # --- plumbing ------------------------------------------------------------------------

    def _drive(self, core: Schedulers) -> None:
        """The policy's schedulers this node drives: arrivals enter them, and their state is
        what the node's series sample."""
        self.core = core
        self.states = StateLog(state_reader(core.state))

    def _submit(self, req: Request) -> None:
        self.core.submit(req)

    def _finished_count(self) -> int:
        return len(self.core.finished)

    def run(self) -> SimOutput:
        env = self.env
        env.process(self._arrivals())
        self._start()
        self._sample()  # empty at the start, before the first arrival
        env.run()
        unfinished = len(self.requests) - self._finished_count()
        if unfinished:
            raise SimulationStalled(
                f"simulation stalled at t={env.now:.3f}s with {unfinished} unfinished requests "
                f"({self._describe()})"
            )
        s = self.stats
        s.gpu_busy_s, s.gpu_assist_s, s.assist_calls = (
            self.gpu.busy_s, self.gpu.assist_s, self.gpu.assist_calls
        )
        s.h2d_bytes, s.d2h_bytes = self.link.h2d.bytes_moved, self.link.d2h.bytes_moved
        s.end_s = env.now
        return SimOutput(self.requests, s, NodeSeries.of(self.states, self._busy(), env.now))

    def _busy(self) -> Busy:
        """When each engine worked: the GPU worker's and the link's own logs, and the CPU
        engine's (:attr:`cpu_worked`, kept by the subclasses that have one)."""
        busy = Busy()
        busy.gpu, busy.cpu = self.gpu.worked, self.cpu_worked
        busy.pcie_h2d, busy.pcie_d2h = self.link.h2d.worked, self.link.d2h.worked
        return busy

    def _sample(self) -> None:
        """Log the scheduler's state after a core call (:class:`StateLog`)."""
        self.states.sample(self.env.now)

    def _done(self) -> bool:
        return self._finished_count() == len(self.requests)

    def _idle(self, engine: str) -> simpy.Event:
        """An event the named engine waits on until another process wakes it."""
        event = self.env.event()
        self._events[engine] = event
        return event

    def _sleeping(self, engine: str) -> bool:
        """Whether the named engine waits to be woken."""
        return engine in self._events

    def _wake(self, engine: str) -> None:
        event = self._events.pop(engine, None)
        if event is not None and not event.triggered:
            event.succeed()

    def _note_finished(self) -> None:
        """Report newly finished requests; at the end, let idle engines see it and exit."""
        now = self._finished_count()
        if now != self._n_finished:
            if self._on_finish is not None:
                self._on_finish(now - self._n_finished)
            self._n_finished = now
            if now == len(self.requests):
                for engine in list(self._events):
                    self._wake(engine)

    def _arrivals(self):
        env = self.env
        for r in self.requests:
            if r.arrival_s > env.now:
                yield env.timeout(r.arrival_s - env.now)
            self._submit(r)
            self._sample()
            self._wake("gpu")

    def _forward_times(self, plan: GpuPlan) -> tuple[float, float, float]:
        """Pre-layer, one transformer layer and post-layer (+ overhead) of a GPU-main batch."""
        cost = self.cost
        chunks = [(c.tokens, c.start + c.tokens) for c in plan.prefills]
        n_tokens = plan.n_tokens
        pre = cost.gpu_pre_layer(n_tokens)
        layer = cost.gpu_layer(n_tokens, chunks, len(plan.decodes), plan.decode_context,
                               beside_cpu=self.gpu_beside_cpu)
        post = (cost.gpu_post_layer(plan.n_sampled)
                + cost.gpu_round_overhead(len(plan.prefills) + len(plan.decodes)))
        return pre, layer, post

    def _run_forward(self, plan: GpuPlan, **trace_args):
        """Execute a GPU-main batch on the GPU worker. `trace_args` go with the forward's trace
        slice."""
        pre, layer, post = self._forward_times(plan)
        start, _ = yield from self.gpu.run_batch(pre, layer, self._n_layers, post)
        if self.trace is not None:
            self._trace_forward(plan, start, **trace_args)

    def _book_swaps(self, rnd: Round) -> float:
        """Book a round's swap transfers (its block moves), both issued now (the link is full
        duplex); returns when the last one lands."""
        now, block_bytes, trace = self.env.now, self.cost.kv_block_bytes, self.trace
        plan, moves = rnd.plan, rnd.moves
        land = now
        for reqs, blocks, channel, track, name in (
            (plan.swap_outs, len(moves.swap_out[0]), self.link.d2h, PCIE_D2H, "swap-out"),
            (plan.swap_ins, len(moves.swap_in[0]), self.link.h2d, PCIE_H2D, "swap-in"),
        ):
            if not reqs:
                continue
            start, end = channel.transfer(now, blocks * block_bytes)
            land = max(land, end)
            if trace is not None:
                self._trace_transfer(track, name, start, end, blocks * block_bytes, ids(reqs),
                                     reqs)
        self.stats.swap_outs += len(plan.swap_outs)
        self.stats.swap_ins += len(plan.swap_ins)
        if trace is not None and land > now:
            trace.complete(GPU_ENGINE, "wait for swaps", now, land,
                           swap_outs=ids(plan.swap_outs), swap_ins=ids(plan.swap_ins))
        return land

    def _book_layer_copies(self, start: float, pre: float, layer: float, layer_bytes: int,
                           reqs: list[Request], landing: list[Request]) -> float:
        """Book the Prefill-to-CPU K/V copy of each layer of `reqs` as that layer ends; returns
        when the last one lands. `landing` are the requests whose whole prompt is then on the
        host (the trace's migration arrows start from their last copy)."""
        d2h, trace, n = self.link.d2h, self.trace, self._n_layers
        ends = self.gpu.planned_layer_ends(start, pre, layer, n)
        if trace is None:
            return d2h.transfer_each(ends, layer_bytes)
        req_ids = ids(reqs)
        for k, end in enumerate(ends):
            copy_start, landed = d2h.transfer(end, layer_bytes)
            self._trace_transfer(PCIE_D2H, "Prefill-to-CPU copy", copy_start, landed,
                                 layer_bytes, req_ids, landing if k == n - 1 else (), layer=k)
        return landed

    # --- trace recording (only with a recorder attached) ---------------------------------

    def _trace_transfer(self, track: str, name: str, start: float, end: float, nbytes: int,
                        req_ids: tuple[int, ...], migrating: Sequence[Request], **args) -> None:
        """A transfer slice; arrows start at it for the requests it completes a migration of."""
        trace = self.trace
        trace.complete(track, name, start, end, bytes=nbytes, req_ids=req_ids, **args)
        for r in migrating:
            trace.flow_from(r.req_id, track, (start + end) / 2)

    def _trace_forward(self, plan: GpuPlan, start: float, **args) -> None:
        """A GPU-main forward of the shared core's GpuPlan (DualPace, vLLM)."""
        trace, end = self.trace, self.env.now
        trace.complete(GPU_ENGINE, "forward", start, end, decodes=len(plan.decodes),
                       prefill_tokens=sum(c.tokens for c in plan.prefills),
                       prefills=tuple(c.req.req_id for c in plan.prefills), **args)
        for r in plan.swap_ins:  # swapped-in requests decode in the round that moved them
            trace.flow_to(r.req_id, GPU_ENGINE, (start + end) / 2)
