"""What a tensor-parallel GPU round costs beyond its priced stages (`gpu.rank_round`).

Under GPU tensor parallelism a decode round costs more than the stage tables and the iteration
overhead say. On the 2-GPU box (docs/validation/h200x2) decode rounds of Qwen3-14B ran 0.6-2.6
ms over the model, more with more rows, where on one GPU they ran within 0.2 ms. Whole rounds
timed through the runtime's `LeadExecutor` on that box split it in two:
- per layer, about 20 us: a layer replayed inside a round took 156-206 us on the GPU where its
  stages, timed on their own with the ranks in step, sum to 137-189 us. It is GPU time (rank 0
  waiting 5 ms before issuing its own stages, so that rank 1 had queued its whole round, changed
  nothing), and with one GPU the same comparison agrees within 2 %;
- per round: rank 0 hands the round to the other ranks, each builds its own inputs, and at the
  end every rank's tokens are checked; the first stage waits for the later rank.
A one-layer model sees only the second part (the first version of this measurement did that
and found nothing below 64 rows). So whole rounds are timed at the model's own depth, as the
runtime runs them (CUDA graphs, the same hand-off), and what the cost model does not already
charge for the same round is this table. Where the whole model does not fit beside its shard
on rank 0's GPU, rounds are timed at the depth that fits and at one layer, and the part that
grows with depth is extended linearly to the model's.
"""

from __future__ import annotations

import dataclasses

import torch

from dualpace_hw.executors.model import ModelWeights
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.profiler.measure import decode_plan
from dualpace_hw.profiler.timing import Timer
from dualpace_hw.runtime.gpu_ranks import LeadExecutor
from dualpace_sim.costs.model import CostModel
from dualpace_sim.costs.profile import Profile, Table1D
from dualpace_sim.costs.shapes import ModelShape

CONTEXT = 1024  # tokens per request in the timed rounds: about an Azure conversation's prompt
MAX_ROWS = 256  # rounds of up to this many rows are timed
MEMORY_SHARE = 0.6  # of rank 0's free GPU memory the timed model (full + shard + KV) may take


def timed_depth(shape: ModelShape, world: int, device: torch.device, blocks: int,
                block_size: int) -> int:
    """Layers of the timed model: the model's own where rank 0's GPU holds them (the full
    weights, to shard from, its own shard and its KV), else as many as fit."""
    if device.type != "cuda":
        return shape.n_layers
    free = torch.cuda.mem_get_info(device)[0] * MEMORY_SHARE
    fixed = (shape.embedding_params + shape.lm_head_params) * shape.dtype_bytes
    per_layer = (shape.weight_bytes_per_layer * (1 + 1 / world)
                 + shape.kv_bytes_per_token_per_layer * block_size * blocks / world)
    return min(shape.n_layers, max(2, int((free - fixed) // per_layer)))  # 2: a slope


class RankRounds:
    """Whole decode rounds through a `LeadExecutor` over `world` GPU ranks, `depth` layers
    deep; the ranks start on the first `wall` (a profile resumed past these points starts
    none)."""

    def __init__(self, shape: ModelShape, depth: int, seed: int, block_size: int, world: int,
                 device: torch.device, timer: Timer, rows: list[int]) -> None:
        self.shape = dataclasses.replace(shape, n_layers=depth)
        self.seed, self.block_size, self.world, self.device = seed, block_size, world, device
        self.timer, self.rows = timer, rows
        self._ex: LeadExecutor | None = None
        self._tokens = TokenStore()

    @staticmethod
    def blocks(rows: list[int], block_size: int) -> int:
        return max(rows) * -(-CONTEXT // block_size)

    def wall(self, rows: int) -> float:
        """Seconds per decode round of `rows` requests, start to checked tokens on rank 0
        (the first, untimed calls capture the round's CUDA graphs)."""
        if self._ex is None:
            weights = ModelWeights.random(self.shape, self.seed, self.device)
            self._ex = LeadExecutor(self.shape, weights, self.world,
                                    self.blocks(self.rows, self.block_size), self.block_size,
                                    self._tokens, weights.embed.dtype)
            del weights  # the full weights: rank 0 keeps its shard
        for req_id in range(len(self._tokens)):  # the previous size's requests 0..n-1
            self._tokens.remove(req_id)
        plan = decode_plan(self._tokens, rows, CONTEXT, self.block_size)
        return self.timer(lambda: self._ex.execute(plan))

    def close(self) -> None:
        if self._ex is not None:
            self._ex.close()
            self._ex = None


def priced_round(cost: CostModel, rows: int, layers: int) -> float:
    """What the cost model charges for a timed round without this table: a decode round of
    `rows` requests of CONTEXT tokens through `layers` layers."""
    return (cost.gpu_pre_layer(rows) + cost.gpu_post_layer(rows) + cost.gpu_iteration_overhead
            + layers * cost.gpu_layer(rows, [], rows, rows * CONTEXT))


def with_rank_round(profile: Profile, walls: dict[int, dict[int, float]]) -> Profile:
    """The profile with `gpu.rank_round` from `walls` (depth -> rows -> seconds per round):
    each round less the model's price for it, at the model's depth, or extended linearly in
    depth from two shallower ones; never below zero."""
    cost = CostModel(profile)
    n = profile.model.n_layers
    depths = sorted(walls)
    if n not in walls and len(depths) < 2:
        raise ValueError(f"gpu.rank_round: rounds timed at depth {depths} of {n} layers; "
                         "extending to the model's depth needs two depths")

    def over(depth: int, rows: int) -> float:
        return walls[depth][rows] - priced_round(cost, rows, depth)

    def full(rows: int) -> float:
        if n in walls:
            return over(n, rows)
        lo, hi = depths[0], depths[-1]
        per_layer = (over(hi, rows) - over(lo, rows)) / (hi - lo)
        return over(hi, rows) + (n - hi) * per_layer

    rows = sorted(walls[depths[-1]])
    table = Table1D(x=rows, y=[max(full(b), 0.0) for b in rows])
    return profile.model_copy(update={"gpu": profile.gpu.model_copy(
        update={"rank_round": table})})
