"""The simulated serving node: GPU and CPU engine loops as independent SimPy processes.

Each engine loops schedule -> commit -> execute -> apply over the shared core; nothing here
decides anything. The simulator's knowledge of hardware is the cost model alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

from ..core import (
    CpuPlan,
    CpuResult,
    CpuScheduler,
    EngineState,
    GpuPlan,
    GpuResult,
    GpuScheduler,
    Request,
    Route,
    SchedulerConfig,
    assist_reachable,
)
from ..costs import CostModel
from .gpu import GpuDevice
from .links import Link


class SimulationStalled(RuntimeError):
    """Both engines are idle with unfinished requests: the configuration cannot serve them."""


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


class Simulation:
    """One node serving a list of request specs under the DualPace rounds."""

    def __init__(
        self,
        specs: Sequence,
        cost: CostModel,
        config: SchedulerConfig,
        on_finish: Callable[[int], None] | None = None,
    ) -> None:
        self.env = simpy.Environment()
        self.cost = cost
        self.config = config
        self.state = EngineState(config)
        self.gpu_sched = GpuScheduler(self.state)
        self.cpu_sched = CpuScheduler(self.state)
        self.link = Link(cost.profile.link.h2d_bytes_per_s, cost.profile.link.d2h_bytes_per_s,
                         cost.profile.link.latency_s)
        stage_mode = assist_reachable(config.largest_cpu_batch, config.route_f)
        self.gpu = GpuDevice(self.env, cost.poll_s, stage_mode)
        self.stats = SimStats(stage_mode=stage_mode)
        self.requests = [
            Request.create(i, s.arrival_s, s.prompt_tokens, s.max_tokens, config.block_size)
            for i, s in enumerate(specs)
        ]
        self._on_finish = on_finish
        self._gpu_event: simpy.Event | None = None
        self._cpu_event: simpy.Event | None = None
        self._copies_land_s = 0.0
        self._n_layers = cost.n_layers

    # ------------------------------------------------------------------------ plumbing

    def run(self) -> SimOutput:
        env = self.env
        env.process(self._arrivals())
        env.process(self._gpu_loop())
        env.process(self._cpu_loop())
        env.run()
        unfinished = len(self.requests) - len(self.state.finished)
        if unfinished:
            st = self.state
            raise SimulationStalled(
                f"simulation stalled at t={env.now:.3f}s with {unfinished} unfinished requests "
                f"(GPU waiting {len(st.gpu_waiting)}, GPU running {len(st.gpu_running)}, CPU "
                f"waiting {len(st.cpu_waiting)}, HBM free {st.hbm.free}/{st.hbm.capacity}, "
                f"host free {st.host.free}/{st.host.capacity}, B_migration {st.b_migration})"
            )
        s = self.stats
        s.gpu_busy_s, s.gpu_assist_s, s.assist_calls = (
            self.gpu.busy_s, self.gpu.assist_s, self.gpu.assist_calls
        )
        s.h2d_bytes, s.d2h_bytes = self.link.h2d.bytes_moved, self.link.d2h.bytes_moved
        s.end_s = env.now
        return SimOutput(self.requests, s)

    def _done(self) -> bool:
        return len(self.state.finished) == len(self.requests)

    def _idle(self, which: str) -> simpy.Event:
        event = self.env.event()
        setattr(self, which, event)
        return event

    def _wake(self, which: str) -> None:
        event = getattr(self, which)
        if event is not None:
            setattr(self, which, None)
            if not event.triggered:
                event.succeed()

    def _finished_changed(self, before: int) -> None:
        after = len(self.state.finished)
        if after != before:
            if self._on_finish is not None:
                self._on_finish(after - before)
            if after == len(self.requests):  # let an idle peer notice the end
                self._wake("_gpu_event")
                self._wake("_cpu_event")

    def _arrivals(self):
        env, st = self.env, self.state
        for r in self.requests:
            if r.arrival_s > env.now:
                yield env.timeout(r.arrival_s - env.now)
            st.submit(r)
            self._wake("_gpu_event")

    # ---------------------------------------------------------------------- GPU engine

    def _gpu_loop(self):
        env, st, sched = self.env, self.state, self.gpu_sched
        while not self._done():
            plan = sched.schedule()
            if plan.wait_for_copies:
                if self._copies_land_s > env.now:
                    yield env.timeout(self._copies_land_s - env.now)
                before = len(st.finished)
                st.complete_copy_group(env.now)
                self._finished_changed(before)
                self._wake("_cpu_event")
                continue
            if plan.is_empty:
                yield self._idle("_gpu_event")
                continue
            sched.commit(plan)
            self._wake("_cpu_event")
            self.stats.gpu_rounds += 1
            if plan.has_migrations:
                yield from self._migrate(plan)
            if not plan.has_forward:
                self.stats.migration_only_rounds += plan.has_migrations
                continue
            yield from self._forward(plan)

    def _migrate(self, plan: GpuPlan):
        env, block_bytes = self.env, self.cost.kv_block_bytes
        land = env.now
        if plan.swap_outs:
            land = max(land, self.link.d2h.transfer(env.now, plan.swap_out_blocks * block_bytes))
            self.stats.swap_outs += len(plan.swap_outs)
        if plan.swap_ins:
            land = max(land, self.link.h2d.transfer(env.now, plan.swap_in_blocks * block_bytes))
            self.stats.swap_ins += len(plan.swap_ins)
        if land > env.now:
            yield env.timeout(land - env.now)
        self.state.complete_migrations(plan.swap_outs, plan.swap_ins, env.now)
        self._wake("_cpu_event")

    def _forward(self, plan: GpuPlan):
        env, cost, n = self.env, self.cost, self._n_layers
        n_tokens = plan.n_tokens
        chunks = [(c.tokens, c.start + c.tokens) for c in plan.prefills]
        pre = cost.gpu_pre_layer(n_tokens)
        layer = cost.gpu_layer(n_tokens, chunks, len(plan.decodes), plan.decode_context)
        post = cost.gpu_post_layer(plan.n_sampled) + cost.gpu_iteration_overhead
        copy_tokens = sum(c.tokens for c in plan.prefills if c.to_cpu)
        if copy_tokens:  # layer-by-layer Prefill-to-CPU copies, booked as each layer ends
            layer_bytes = copy_tokens * cost.kv_block_bytes_per_layer // self.config.block_size
            for end in self.gpu.planned_layer_ends(env.now, pre, layer, n):
                landed = self.link.d2h.transfer(end, layer_bytes)
            self.stats.prefills_to_cpu += sum(1 for c in plan.prefills if c.to_cpu and c.last)
        last_layer_end = yield from self.gpu.run_batch(pre, layer, n, post)
        if copy_tokens:
            last_copy = self.link.d2h.latency_s + layer_bytes / self.link.d2h.bytes_per_s
            self._copies_land_s = max(landed, last_layer_end + last_copy)
        before = len(self.state.finished)
        self.gpu_sched.apply(plan, GpuResult(env.now))
        self._finished_changed(before)

    # ---------------------------------------------------------------------- CPU engine

    def _cpu_loop(self):
        st, sched = self.state, self.cpu_sched
        while not self._done():
            plan = sched.schedule()
            sched.commit(plan)
            if plan.held_back or plan.admitted:
                self._wake("_gpu_event")
            if plan.is_empty:
                yield self._idle("_cpu_event")
                continue
            self.stats.cpu_rounds += 1
            routes = self.stats.routes
            routes[plan.route.value] = routes.get(plan.route.value, 0) + 1
            start = self.env.now
            yield from self._cpu_batch(plan)
            self.stats.cpu_busy_s += self.env.now - start
            before = len(st.finished)
            sched.apply(plan, CpuResult(self.env.now))
            self._finished_changed(before)
            self._wake("_gpu_event")

    def _cpu_batch(self, plan: CpuPlan):
        """Run one CPU decode batch along its post-attention route."""
        env, cost, n = self.env, self.cost, self._n_layers
        b = len(plan.batch)
        pre = cost.cpu_pre_layer(b) + cost.cpu_iteration_overhead
        local = cost.cpu_layer_local(b, plan.context)  # pre-attention + attention, one layer
        if plan.route is Route.FULL_CPU:
            yield env.timeout(pre + n * (local + cost.cpu_post_attn(b)) + cost.cpu_post_layer(b))
        elif plan.route is Route.SPLIT_FINAL:
            yield env.timeout(pre + n * (local + cost.cpu_post_attn(b)) + cost.cpu_hidden_write(b))
            yield env.timeout(self._assist("lS", b, in_acts=1, out_acts=0) - env.now)
        else:
            write, read = cost.cpu_assist_write(b), cost.cpu_assist_read(b)
            yield env.timeout(pre + local + write)
            for _ in range(n - 1):
                resume = self._assist("p", b, in_acts=2, out_acts=1)
                yield env.timeout(resume - env.now + read + local + write)
            yield env.timeout(self._assist("lA", b, in_acts=2, out_acts=0) - env.now)

    def _assist(self, kind: str, b: int, in_acts: int, out_acts: int) -> float:
        """Hand one Dense Assist to the GPU worker now; returns when the CPU sees its result.

        The GPU is displaced for o_x + g_x and the CPU waits q_x + g_x after the service starts
        (paper Appendix B, Eq. 14); g_x includes moving the activations over the link."""
        cost, now = self.cost, self.env.now
        g = cost.assist_gpu(kind, b)
        act = cost.activation_bytes(b)
        self.link.h2d.carry(in_acts * act)
        if out_acts:
            self.link.d2h.carry(out_acts * act)
        start = self.gpu.assist(now, cost.assist_o(kind) + g)
        return start + g + cost.assist_q(kind)
