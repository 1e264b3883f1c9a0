"""The NEO node: one GPU-gated engine loop; CPU attention runs inside GPU iterations only.

NEO decides with its predictor's per-layer time (`layer_time`, its tables) and pays what its
iterations cost as they run (`executed_layer_s`): the same kernels, but issued eagerly, so a
layer takes no less than the host needs to issue each sub-batch's kernels. The gap between the
two is NEO's, as on the real runtime (docs/validation/README.md, NEO).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dualpace_sim.results.trace_events import CPU_ENGINE, GPU_ENGINE, TraceRecorder

from ..core.neo import NeoConfig, NeoHostFull, NeoPlan, NeoPredictor, layer_time
from ..core.policies import neo_schedulers
from ..core.rounds import Round
from ..costs import CostModel
from ..costs.neo_tables import NeoTables
from .node import Node, SimulationStalled, ids


def executed_layer_s(plan: NeoPlan, tables: NeoPredictor, cost: CostModel) -> float:
    """Per-layer time an iteration pays: the predictor's layer time, but at least the host's
    floor for issuing every sub-batch's layer without CUDA graphs (per layer the host issues
    each sub-batch's pre-attention, attention and post-attention once). On the H200 box NEO's
    GPU-only decode iterations took 2.5x the predictor's time from this floor alone."""
    floor = sum(cost.neo_eager_floor(bool(b.prefills)) for b in plan.batches)
    return max(layer_time(plan, tables), floor)


class NeoNode(Node):
    def __init__(
        self,
        specs: Sequence,
        cost: CostModel,
        config: NeoConfig,
        on_finish: Callable[[int], None] | None = None,
        trace: TraceRecorder | None = None,
    ) -> None:
        super().__init__(specs, cost, config.block_size, stage_mode=False, on_finish=on_finish,
                         trace=trace)
        self.tables = NeoTables(cost, config.launch_s)
        self._drive(neo_schedulers(config, self.tables))
        self.sched, self.driver = self.core.state, self.core.drivers["gpu"]
        shape = cost.shape
        # Per CPU decode and layer: Q, K, V to the host, the attention output back.
        self._to_host_bytes = (shape.q_dim + 2 * shape.kv_dim) * shape.dtype_bytes
        self._to_gpu_bytes = shape.q_dim * shape.dtype_bytes

    def _start(self) -> None:
        self.env.process(self._loop())

    def _describe(self) -> str:
        s = self.sched
        return (f"waiting {len(s.waiting)}, GPU decoding {len(s.gpu_q)}, CPU decoding "
                f"{len(s.cpu_q)}, HBM free {s.hbm.free}/{s.hbm.capacity}, host free "
                f"{s.host.free}/{s.host.capacity}")

    def _loop(self):
        env, driver = self.env, self.driver
        while not self._done():
            try:
                rnd = driver.begin(env.now)
            except NeoHostFull as e:  # the run cannot go on: reported as a stall, one line
                raise SimulationStalled(f"simulation stalled at t={env.now:.3f}s: {e}") from None
            self._sample()
            if rnd.idle:
                yield self._idle("gpu")
                continue
            self.stats.gpu_rounds += 1
            if rnd.moves.any:
                yield from self._swap(rnd)
            if not rnd.forward:  # swaps only: nothing on the GPU after them
                continue
            yield from self._iterate(rnd.plan)
            driver.end(rnd, env.now)
            self._sample()
            self._note_finished()

    def _swap(self, rnd: Round):
        """Swaps are copied for all layers before the forward and serialize into it."""
        land = self._book_swaps(rnd)
        if land > self.env.now:
            yield self.env.timeout(land - self.env.now)

    def _iterate(self, plan: NeoPlan):
        env, cost, n = self.env, self.cost, self._n_layers
        width = sum(b.width for b in plan.batches)
        rows = sum(len(b) for b in plan.batches)
        per_layer = executed_layer_s(plan, self.tables, cost)
        pre = cost.gpu_pre_layer(width)
        post = cost.gpu_post_layer(rows) + cost.gpu_round_overhead(rows)
        cpu_prefills = [r for b in plan.batches for r in b.cpu_prefills]
        landed = env.now
        if cpu_prefills:  # their KV goes to the host layer by layer during this forward
            layer_bytes = sum(r.prompt_tokens for r in cpu_prefills) * (
                cost.kv_block_bytes_per_layer // cost.block_size)
            landed = self._book_layer_copies(env.now, pre, per_layer, layer_bytes, cpu_prefills,
                                             cpu_prefills)
            self.stats.prefills_to_cpu += len(cpu_prefills)
        n_cpu = sum(len(b.cpu_decodes) for b in plan.batches)
        cpu_s = n * sum(b.cpu_time(self.tables) for b in plan.batches) if n_cpu else 0.0
        if n_cpu:
            self.link.d2h.carry(n * n_cpu * self._to_host_bytes, env.now + pre)
            self.link.h2d.carry(n * n_cpu * self._to_gpu_bytes, env.now + pre)
            self.stats.cpu_busy_s += cpu_s
            self.stats.cpu_rounds += 1
        self.stats.pipelined_iterations += plan.pipelined
        start, last_layer_end = yield from self.gpu.run_batch(pre, per_layer, n, post)
        # the CPU attention runs inside the layers; its time counts from their start
        self.cpu_worked.add(start + pre, start + pre + cpu_s)
        if self.trace is not None:
            self._trace_iteration(plan, start, start + pre, last_layer_end, per_layer)
        if landed > env.now:
            if self.trace is not None:
                self.trace.complete(GPU_ENGINE, "wait for Prefill-to-CPU copies", env.now,
                                    landed)
            yield env.timeout(landed - env.now)

    def _trace_iteration(self, plan: NeoPlan, start: float, layers_start: float,
                         layers_end: float, per_layer: float) -> None:
        """The GPU iteration, and beside it the CPU attention of its sub-batches: it runs inside
        every layer (overlapped with the other sub-batch's GPU work when pipelined), so one CPU
        slice spans the layers and its args say how busy the CPU was in them."""
        trace, end, tables = self.trace, self.env.now, self.tables
        batches = plan.batches
        trace.complete(GPU_ENGINE, "iteration", start, end, pipelined=plan.pipelined,
                       per_layer_us=round(per_layer * 1e6, 3),
                       gpu_decodes=tuple(len(b.gpu_decodes) for b in batches),
                       cpu_decodes=tuple(len(b.cpu_decodes) for b in batches),
                       gpu_prefills=ids(r for b in batches for r in b.gpu_prefills),
                       cpu_prefills=ids(r for b in batches for r in b.cpu_prefills))
        for r in plan.swap_ins:  # swapped-in requests decode in the iteration that moved them
            trace.flow_to(r.req_id, GPU_ENGINE, (start + end) / 2)
        cpu_decodes = [r for b in batches for r in b.cpu_decodes]
        if not cpu_decodes:
            return
        n = self._n_layers
        trace.complete(CPU_ENGINE, "CPU attention", layers_start, layers_end,
                       decodes=tuple(len(b.cpu_decodes) for b in batches),
                       busy_us=round(n * sum(b.cpu_time(tables) for b in batches) * 1e6, 3),
                       to_host_bytes=n * len(cpu_decodes) * self._to_host_bytes,
                       to_gpu_bytes=n * len(cpu_decodes) * self._to_gpu_bytes,
                       req_ids=ids(cpu_decodes))
        for r in cpu_decodes:  # ends the arrow of a request that just landed on the host
            trace.flow_to(r.req_id, CPU_ENGINE, (layers_start + layers_end) / 2)
