"""The DualPace node: GPU and CPU engine loops as independent SimPy processes.

Each engine loops through its driver (`core.rounds`: begin, execute, land, end), with no barrier
between them; they meet only in the shared state and, for Dense Assist, at the GPU worker's
stage boundaries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dualpace_sim.results.trace_events import CPU_ENGINE, GPU_ENGINE, TraceRecorder

from ..core import CpuPlan, GpuPlan, Route, SchedulerConfig, assist_reachable
from ..core.policies import dualpace_schedulers
from ..core.rounds import Round, RoundKind
from ..costs import CostModel
from .assist import AssistBooker
from .node import Node, ids


class DualPaceNode(Node):
    # The CPU engine decodes on the other cores all along (its threads spin between steps),
    # so eager GPU rounds take the floor measured beside it.
    gpu_beside_cpu = True

    def __init__(
        self,
        specs: Sequence,
        cost: CostModel,
        config: SchedulerConfig,
        on_finish: Callable[[int], None] | None = None,
        trace: TraceRecorder | None = None,
    ) -> None:
        stage_mode = assist_reachable(config.largest_cpu_batch, config.route_f)
        super().__init__(specs, cost, config.block_size, stage_mode, on_finish, trace)
        self.config = config
        self._drive(dualpace_schedulers(config))
        self.state = self.core.state
        self.gpu_driver, self.cpu_driver = self.core.drivers["gpu"], self.core.drivers["cpu"]
        self._copies_land_s = 0.0
        self.assists = AssistBooker(self.env, self.gpu, self.link, cost, trace)
        self._head_wait: tuple[float, int, str] | None = None  # (since, req_id, why), traced

    def _start(self) -> None:
        self.env.process(self._gpu_loop())
        self.env.process(self._cpu_loop())

    def _describe(self) -> str:
        st = self.state
        return (f"GPU waiting {len(st.gpu_waiting)}, GPU running {len(st.gpu_running)}, CPU "
                f"waiting {len(st.cpu_waiting)}, CPU running {len(st.cpu_running)}, HBM free "
                f"{st.hbm.free}/{st.hbm.capacity}, host free {st.host.free}/{st.host.capacity}, "
                f"B_migration {st.b_migration}")

    # ---------------------------------------------------------------------- GPU engine

    def _gpu_loop(self):
        env, gpu = self.env, self.gpu_driver
        while not self._done():
            rnd = gpu.begin(env.now)
            if rnd.kind is RoundKind.WAIT_FOR_COPIES:
                yield from self._wait_for_copies(rnd)
                continue
            if rnd.idle:
                self.assists.gpu_moves_on()
                yield self._idle("gpu")
                continue
            self._sample()
            self._wake_cpu()
            self.stats.gpu_rounds += 1
            if rnd.lands:
                yield from self._migrate(rnd)
            if not rnd.forward:
                self.stats.migration_only_rounds += rnd.lands
                continue
            yield from self._forward(rnd)

    def _wait_for_copies(self, rnd: Round):
        env = self.env
        if self._copies_land_s > env.now:
            if self.trace is not None:
                self.trace.complete(GPU_ENGINE, "wait for Prefill-to-CPU copies", env.now,
                                    self._copies_land_s)
            self.assists.gpu_moves_on()
            yield env.timeout(self._copies_land_s - env.now)
        self.gpu_driver.landed(rnd, env.now)
        self._sample()
        self._note_finished()
        self._wake_cpu()

    def _migrate(self, rnd: Round):
        env = self.env
        land = self._book_swaps(rnd)
        if land > env.now:
            self.assists.gpu_moves_on()
            yield env.timeout(land - env.now)
        self.gpu_driver.landed(rnd, env.now)
        self._sample()
        self._wake_cpu()

    def _forward(self, rnd: Round):
        env, n, plan = self.env, self._n_layers, rnd.plan
        pre, layer, post = self._forward_times(plan)
        copies = plan.copy_chunks
        if copies:  # layer-by-layer Prefill-to-CPU copies, booked as each layer ends
            copy_tokens = sum(c.tokens for c in copies)
            layer_bytes = copy_tokens * self.cost.kv_block_bytes_per_layer // self.config.block_size
            landing = [c.req for c in copies if c.last]
            landed = self._book_layer_copies(env.now, pre, layer, layer_bytes,
                                             [c.req for c in copies], landing)
            self.stats.prefills_to_cpu += len(landing)
        start, last_layer_end = yield from self.gpu.run_batch(
            pre, layer, n, post, stage_queued=self._gpu_paced(plan, layer))
        if copies:
            self._copies_land_s = max(landed, last_layer_end + self.link.d2h.duration(layer_bytes))
        if self.trace is not None:
            self._trace_forward(plan, start, to_cpu=ids(c.req for c in copies))
        self.gpu_driver.end(rnd, env.now)
        self._sample()
        self._note_finished()

    # ---------------------------------------------------------------------- CPU engine

    def _cpu_loop(self):
        cpu = self.cpu_driver
        while not self._done():
            rnd = cpu.begin(self.env.now)
            plan = rnd.plan
            self._sample()
            if plan.held_back or plan.admitted:
                self._wake("gpu")
            if rnd.idle:
                yield from self._cpu_idle(plan)
                continue
            self.stats.cpu_rounds += 1
            routes = self.stats.routes
            routes[plan.route.value] = routes.get(plan.route.value, 0) + 1
            start = self.env.now
            yield from self._cpu_batch(plan)
            self.stats.cpu_busy_s += self.env.now - start
            self.cpu_worked.add(start, self.env.now)
            if self.trace is not None:
                self._trace_cpu_round(plan, start)
            cpu.end(rnd, self.env.now)
            self._sample()
            self._note_finished()
            self._wake("gpu")

    def _cpu_idle(self, plan: CpuPlan):
        """Sleep until woken; when tracing, the wait on the waiting queue's head is a slice."""
        self._note_head_wait(plan)
        yield self._idle("cpu")
        if self._head_wait is not None:
            start, req_id, why = self._head_wait
            self._head_wait = None
            if self.env.now > start:
                self.trace.complete(CPU_ENGINE, "wait for head", start, self.env.now,
                                    req_id=req_id, reason=why)

    def _wake_cpu(self) -> None:
        """Wake an idle CPU engine only when its next round would run a batch. An idle engine
        holds no running batch, so a round without one changes nothing; leaving it asleep
        gives the same run without two events (and a schedule and commit) per GPU round."""
        if not self._sleeping("cpu"):
            return
        plan = self.cpu_driver.preview()
        if not plan.is_empty:
            self._wake("cpu")
        elif self._head_wait is None:  # the engine now waits on a head it did not see yet
            self._note_head_wait(plan)

    def _cpu_batch(self, plan: CpuPlan):
        """Run one CPU decode batch along its post-attention route."""
        env, cost, n = self.env, self.cost, self._n_layers
        b = len(plan.batch)
        pre = cost.cpu_pre_layer(b) + cost.cpu_iteration_overhead
        local = cost.cpu_layer_local(b, plan.context)  # pre-attention + attention, one layer
        if plan.route is Route.FULL_CPU:
            yield env.timeout(pre + n * (local + cost.cpu_post_attn(b)) + cost.cpu_post_layer(b))
        elif plan.route is Route.SPLIT_FINAL:
            first = pre + n * (local + cost.cpu_post_attn(b)) + cost.cpu_hidden_write(b)
            yield from self.assists.run(b, first, ("lS",))
        else:
            write, read = cost.cpu_assist_write(b), cost.cpu_assist_read(b)
            kinds = ("p",) * (n - 1) + ("lA",)
            yield from self.assists.run(b, pre + local + write, kinds, read, local, write)

    def _gpu_paced(self, plan: GpuPlan, layer: float) -> bool:
        """Whether the GPU, not its host's launch floor, sets this batch's layer time: graph
        replays always; an eager batch where its layer outlasts the floor."""
        return not plan.prefills or layer > self.cost.gpu_eager_floor(self.gpu_beside_cpu)

    # ---------------------------------------------------------------------- trace recording

    def _trace_cpu_round(self, plan: CpuPlan, start: float) -> None:
        trace, end = self.trace, self.env.now
        req_ids = ids(plan.batch)
        trace.complete(CPU_ENGINE, plan.route.value, start, end, batch=len(req_ids),
                       context_tokens=plan.context, admitted=plan.admitted,
                       held_back=ids(plan.held_back), req_ids=req_ids)
        for i in req_ids:  # ends the arrow of a request that just landed on the host
            trace.flow_to(i, CPU_ENGINE, (start + end) / 2)

    def _note_head_wait(self, plan: CpuPlan) -> None:
        """When tracing, note since when and why an idle CPU engine waits on the head of its
        waiting queue (the slice is recorded when the engine wakes)."""
        why = self._wait_reason(plan)
        if why is not None:
            self._head_wait = (self.env.now, plan.wait_for.req_id, why)

    def _wait_reason(self, plan: CpuPlan) -> str | None:
        """Why an idle CPU engine waits on the head of its waiting queue, for the trace: its KV
        is still in flight, or the GPU marked it for a swap-in (the engine never bypasses it).
        None when not tracing or when the CPU simply has no work."""
        head = plan.wait_for
        if self.trace is None or head is None:
            return None
        return "marked for swap-in" if head.req_id in self.state.marked else "migration in flight"
