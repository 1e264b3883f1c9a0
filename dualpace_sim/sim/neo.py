"""The NEO node: one GPU-gated engine loop; CPU attention runs inside GPU iterations only."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core import Request
from ..core.neo import NeoConfig, NeoPlan, NeoScheduler, layer_time
from ..costs import CostModel
from ..costs.neo_tables import NeoTables
from .node import Node


class NeoNode(Node):
    def __init__(
        self,
        specs: Sequence,
        cost: CostModel,
        config: NeoConfig,
        launch_s: float | None = None,
        on_finish: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(specs, cost, config.block_size, stage_mode=False, on_finish=on_finish)
        self.tables = NeoTables(cost, launch_s)
        self.sched = NeoScheduler(config, self.tables)
        shape = cost.shape
        # Per CPU decode and layer: Q, K, V to the host, the attention output back.
        self._to_host_bytes = (shape.q_dim + 2 * shape.kv_dim) * shape.dtype_bytes
        self._to_gpu_bytes = shape.q_dim * shape.dtype_bytes

    def _start(self) -> None:
        self.env.process(self._loop())

    def _submit(self, req: Request) -> None:
        self.sched.submit(req)

    def _finished_count(self) -> int:
        return len(self.sched.finished)

    def _describe(self) -> str:
        s = self.sched
        return (f"waiting {len(s.waiting)}, GPU decoding {len(s.gpu_q)}, CPU decoding "
                f"{len(s.cpu_q)}, HBM free {s.hbm.free}/{s.hbm.capacity}, host free "
                f"{s.host.free}/{s.host.capacity}")

    def _loop(self):
        env, sched = self.env, self.sched
        while not self._done():
            plan = sched.schedule(env.now)
            if not plan.batches:  # nothing on the GPU (so no swap either): sleep until work
                yield self._idle("gpu")
                continue
            self.stats.gpu_rounds += 1
            yield from self._swap(plan)
            yield from self._iterate(plan)
            sched.apply(plan, env.now)
            self._note_finished()

    def _swap(self, plan: NeoPlan):
        """Swaps are copied for all layers before the forward and serialize into it."""
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

    def _iterate(self, plan: NeoPlan):
        env, cost, n = self.env, self.cost, self._n_layers
        width = sum(b.width for b in plan.batches)
        rows = sum(len(b) for b in plan.batches)
        per_layer = layer_time(plan, self.tables)
        pre = cost.gpu_pre_layer(width)
        post = cost.gpu_post_layer(rows) + cost.gpu_iteration_overhead
        cpu_prefills = [r for b in plan.batches for r in b.cpu_prefills]
        landed = env.now
        if cpu_prefills:  # their KV goes to the host layer by layer during this forward
            layer_bytes = sum(r.prompt_tokens for r in cpu_prefills) * (
                cost.kv_block_bytes_per_layer // cost.block_size)
            for end in self.gpu.planned_layer_ends(env.now, pre, per_layer, n):
                landed = self.link.d2h.transfer(end, layer_bytes)
            self.stats.prefills_to_cpu += len(cpu_prefills)
        n_cpu = sum(len(b.cpu_decodes) for b in plan.batches)
        if n_cpu:
            self.link.d2h.carry(n * n_cpu * self._to_host_bytes)
            self.link.h2d.carry(n * n_cpu * self._to_gpu_bytes)
            self.stats.cpu_busy_s += n * sum(b.cpu_time(self.tables) for b in plan.batches)
            self.stats.cpu_rounds += 1
        self.stats.pipelined_iterations += plan.pipelined
        yield from self.gpu.run_batch(pre, per_layer, n, post)
        if landed > env.now:
            yield env.timeout(landed - env.now)
