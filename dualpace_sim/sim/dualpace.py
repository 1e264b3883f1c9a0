"""The DualPace node: GPU and CPU engine loops as independent SimPy processes.

Each engine loops schedule -> commit -> execute -> apply over the shared core, with no barrier
between them; they meet only in the shared state and, for Dense Assist, at the GPU worker's
stage boundaries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
from ..trace_events import CPU_ENGINE, DENSE_ASSIST, GPU_ENGINE, TraceRecorder
from .node import Node, ids

_ASSIST_NAMES = {"p": "assist p", "lA": "assist lA", "lS": "assist lS"}  # trace slice names
# Activations an assist moves (to the GPU, back to the host): a per-layer assist takes the
# attention output and the residual and returns the next layer's input; the final ones
# return only the sampled token.
_ASSIST_ACTIVATIONS = {"p": (2, 1), "lA": (2, 0), "lS": (1, 0)}


@dataclass(slots=True, eq=False)
class AssistChain:
    """The Dense Assists of the running CPU batch, booked on the GPU worker as far as its
    timeline is known."""

    b: int  # CPU batch rows
    kinds: tuple[str, ...]  # the assists in order: "p" per layer, then "lA"; or just "lS"
    read: float  # CPU time to read an assist's result
    local: float  # CPU time of one layer's pre-attention and attention
    write: float  # CPU time to write an assist's activations
    ready: float  # when the next assist is ready
    done: simpy.Event  # succeeds when the last assist's result is back on the CPU
    next: int = 0  # index of the next assist to book
    resume: float = 0.0  # when the last booked assist's result is back on the CPU
    wake: simpy.Event | None = None  # books assist `wake_for` at its ready time
    wake_for: int = -1

    def finish(self, _event: simpy.Event) -> None:
        self.done.succeed()


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
        self.state = EngineState(config)
        self.gpu_sched = GpuScheduler(self.state)
        self.cpu_sched = CpuScheduler(self.state)
        self._copies_land_s = 0.0
        self._chain: AssistChain | None = None  # the CPU batch's assists not yet booked
        self.gpu.on_batch_start = self._gpu_moves_on
        self._assist_terms: dict[tuple[str, int], tuple[float, float, float, int, int]] = {}

    def _start(self) -> None:
        self.env.process(self._gpu_loop())
        self.env.process(self._cpu_loop())

    def _submit(self, req: Request) -> None:
        self.state.submit(req)

    def _finished_count(self) -> int:
        return len(self.state.finished)

    def _describe(self) -> str:
        st = self.state
        return (f"GPU waiting {len(st.gpu_waiting)}, GPU running {len(st.gpu_running)}, CPU "
                f"waiting {len(st.cpu_waiting)}, CPU running {len(st.cpu_running)}, HBM free "
                f"{st.hbm.free}/{st.hbm.capacity}, host free {st.host.free}/{st.host.capacity}, "
                f"B_migration {st.b_migration}")

    # ---------------------------------------------------------------------- GPU engine

    def _gpu_loop(self):
        env, st, sched = self.env, self.state, self.gpu_sched
        while not self._done():
            plan = sched.schedule()
            if plan.wait_for_copies:
                if self._copies_land_s > env.now:
                    if self.trace is not None:
                        self.trace.complete(GPU_ENGINE, "wait for Prefill-to-CPU copies",
                                            env.now, self._copies_land_s)
                    self._gpu_moves_on()
                    yield env.timeout(self._copies_land_s - env.now)
                st.complete_copy_group(env.now)
                self._note_finished()
                self._wake_cpu()
                continue
            if plan.is_empty:
                self._gpu_moves_on()
                yield self._idle("gpu")
                continue
            sched.commit(plan)
            self._wake_cpu()
            self.stats.gpu_rounds += 1
            if plan.has_migrations:
                yield from self._migrate(plan)
            if not plan.has_forward:
                self.stats.migration_only_rounds += plan.has_migrations
                continue
            yield from self._forward(plan)

    def _migrate(self, plan: GpuPlan):
        env = self.env
        land = self._book_swaps(plan)
        if land > env.now:
            self._gpu_moves_on()
            yield env.timeout(land - env.now)
        self.state.complete_migrations(plan.swap_outs, plan.swap_ins, env.now)
        self._wake_cpu()

    def _forward(self, plan: GpuPlan):
        env, n = self.env, self._n_layers
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
        self.gpu_sched.apply(plan, GpuResult(env.now))
        self._note_finished()

    # ---------------------------------------------------------------------- CPU engine

    def _cpu_loop(self):
        sched = self.cpu_sched
        while not self._done():
            plan = sched.schedule()
            sched.commit(plan)
            if plan.held_back or plan.admitted:
                self._wake("gpu")
            if plan.is_empty:
                idle_from, why = self.env.now, self._wait_reason(plan)
                yield self._idle("cpu")
                if why is not None and self.env.now > idle_from:
                    self.trace.complete(CPU_ENGINE, "wait for head", idle_from, self.env.now,
                                        req_id=plan.wait_for.req_id, reason=why)
                continue
            self.stats.cpu_rounds += 1
            routes = self.stats.routes
            routes[plan.route.value] = routes.get(plan.route.value, 0) + 1
            start = self.env.now
            yield from self._cpu_batch(plan)
            self.stats.cpu_busy_s += self.env.now - start
            if self.trace is not None:
                self._trace_cpu_round(plan, start)
            sched.apply(plan, CpuResult(self.env.now))
            self._note_finished()
            self._wake("gpu")

    def _wake_cpu(self) -> None:
        """Wake an idle CPU engine only when its next round would run a batch. An idle engine
        holds no running batch, so a round without one changes nothing; leaving it asleep
        gives the same run without two events (and a schedule and commit) per GPU round."""
        if self._sleeping("cpu") and not self.cpu_sched.schedule().is_empty:
            self._wake("cpu")

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
            yield from self._assist_chain(b, first, ("lS",), 0.0, 0.0, 0.0)
        else:
            write, read = cost.cpu_assist_write(b), cost.cpu_assist_read(b)
            kinds = ("p",) * (n - 1) + ("lA",)
            yield from self._assist_chain(b, pre + local + write, kinds, read, local, write)

    def _assist_chain(self, b: int, first_s: float, kinds: tuple[str, ...], read: float,
                      local: float, write: float):
        """Run a CPU batch's Dense Assists of `kinds`, in order: the first is ready `first_s`
        from now, each later one when the CPU has read the previous one's result, run the next
        layer's local stages (`local`) and written its activations; the batch ends when the
        last one's result is back on the CPU."""
        env = self.env
        chain = AssistChain(b, kinds, read, local, write, env.now + first_s, env.event())
        self._chain = chain
        self._book_chain()
        yield chain.done

    def _book_chain(self) -> None:
        """Book the running chain's assists in closed form, as far as the GPU's timeline is
        known: every one ready by now or meeting the GPU batch set up now
        (GpuDevice.serves_ahead). The next one is booked when the GPU sets up its next batch,
        or at its ready time if the GPU waits without a batch first.

        The times are those of booking each assist at its ready time:
        `ready + (resume - ready + read + local + write)` is the sum that a timeout per layer
        computed, added in the same order."""
        c, env, gpu = self._chain, self.env, self.gpu
        now, kinds, b, i, ready, resume = env.now, c.kinds, c.b, c.next, c.ready, c.resume
        read, local, write = c.read, c.local, c.write
        n = len(kinds)
        while i < n and (ready <= now or gpu.serves_ahead(ready)):
            resume = self._assist(kinds[i], b, ready)
            i += 1
            if i < n:
                ready = ready + (resume - ready + read + local + write)
        c.next, c.ready, c.resume = i, ready, resume
        if i == n:
            self._chain = None
            env.timeout(resume - now).callbacks.append(c.finish)
        elif not gpu.active and c.wake_for != i:
            c.wake_for = i
            c.wake = env.timeout(ready - now)
            c.wake.callbacks.append(self._chain_wake)

    def _chain_wake(self, event: simpy.Event) -> None:
        """The next assist's ready time came with the GPU idle: book it now."""
        c = self._chain
        if c is not None and event is c.wake and c.wake_for == c.next:
            c.ready = self.env.now
            self._book_chain()

    def _gpu_moves_on(self) -> None:
        """The GPU worker set up a batch, or is about to wait without one: the running chain's
        next assist may now meet that batch, or needs its own wake-up."""
        if self._chain is not None:
            self._book_chain()

    def _gpu_paced(self, plan: GpuPlan, layer: float) -> bool:
        """Whether the GPU, not its host's launch floor, sets this batch's layer time: graph
        replays always; an eager batch where its layer outlasts the floor."""
        return not plan.prefills or layer > self.cost.gpu_eager_floor(self.gpu_beside_cpu)

    def _assist(self, kind: str, b: int, now: float) -> float:
        """Hand one Dense Assist, ready at `now`, to the GPU worker; returns when the CPU sees
        its result.

        The GPU is displaced for o_x + g_x and the CPU waits q_x + g_x after the service starts
        (paper Appendix B, Eq. 14); g_x includes moving the activations over the link."""
        terms = self._assist_terms.get((kind, b))
        if terms is None:
            terms = self._assist_terms[(kind, b)] = self._terms_of(kind, b)
        g, service, q, to_gpu, to_host = terms
        self.link.h2d.carry(to_gpu)
        if to_host:
            self.link.d2h.carry(to_host)
        start = self.gpu.assist(now, service)
        if self.trace is not None:
            self.trace.complete(DENSE_ASSIST, _ASSIST_NAMES[kind], start, start + service,
                                cpu_batch=b, queued_us=round((start - now) * 1e6, 3))
        return start + g + q

    def _terms_of(self, kind: str, b: int) -> tuple[float, float, float, int, int]:
        """An assist's g_x, GPU service o_x + g_x, q_x, and activation bytes each way: the
        same for every assist of that kind and batch size, so looked up once."""
        cost = self.cost
        g = cost.assist_gpu(kind, b)
        act = cost.activation_bytes(b)
        in_acts, out_acts = _ASSIST_ACTIVATIONS[kind]
        return g, cost.assist_o(kind) + g, cost.assist_q(kind), in_acts * act, out_acts * act

    # ---------------------------------------------------------------------- trace recording

    def _trace_cpu_round(self, plan: CpuPlan, start: float) -> None:
        trace, end = self.trace, self.env.now
        req_ids = ids(plan.batch)
        trace.complete(CPU_ENGINE, plan.route.value, start, end, batch=len(req_ids),
                       context_tokens=plan.context, admitted=plan.admitted,
                       held_back=ids(plan.held_back), req_ids=req_ids)
        for i in req_ids:  # ends the arrow of a request that just landed on the host
            trace.flow_to(i, CPU_ENGINE, (start + end) / 2)

    def _wait_reason(self, plan: CpuPlan) -> str | None:
        """Why an idle CPU engine waits on the head of its waiting queue, for the trace: its KV
        is still in flight, or the GPU marked it for a swap-in (the engine never bypasses it).
        None when not tracing or when the CPU simply has no work."""
        head = plan.wait_for
        if self.trace is None or head is None:
            return None
        return "marked for swap-in" if head.marked else "migration in flight"
