"""The rank group's own work in a tensor-parallel GPU round (`gpu.rank_round`).

Under GPU tensor parallelism a round costs more than its stages: rank 0 builds the round's
batch, hands it to every other rank (pickled through a pipe, then a command on the ring), each
of those builds its own batch and only then joins the round's first all-reduce; at the end each
syncs its sampled tokens and answers rank 0. The stage tables are timed with the ranks already
in step, so none of this is in them: on the 2-GPU box decode rounds ran 1.1-2.4 ms over the
model, more with more rows, where on one GPU they ran within 0.2 ms (docs/validation/h200x2).
So whole decode rounds are timed through the runtime's own `LeadExecutor` on a one-layer model,
and what the cost model does not already charge for the same round is the rank group's.
"""

from __future__ import annotations

import dataclasses

import torch

from dualpace_sim.costs.model import CostModel
from dualpace_sim.costs.profile import Profile, Table1D
from dualpace_sim.costs.shapes import ModelShape

from ..gpu_ranks import LeadExecutor
from ..model import ModelWeights
from ..tokens import TokenStore
from .measure import decode_plan
from .timing import Timer

CONTEXT = 256  # tokens per request in the timed rounds, as the iteration overhead's batch
MAX_ROWS = 256  # rounds of up to this many rows are timed


class RankRounds:
    """Whole decode rounds through a one-layer `LeadExecutor` over `world` GPU ranks; started
    on the first `wall` (a profile resumed past these points starts no ranks)."""

    def __init__(self, shape: ModelShape, seed: int, block_size: int, world: int,
                 device: torch.device, timer: Timer, rows: list[int]) -> None:
        self.shape = dataclasses.replace(shape, n_layers=1)
        self.seed, self.block_size, self.world, self.device = seed, block_size, world, device
        self.timer, self.rows = timer, rows
        self._ex: LeadExecutor | None = None
        self._tokens = TokenStore()

    def wall(self, rows: int) -> float:
        """Seconds per decode round of `rows` requests, start to sampled tokens on rank 0."""
        if self._ex is None:
            weights = ModelWeights.random(self.shape, self.seed, self.device)
            blocks = max(self.rows) * -(-CONTEXT // self.block_size)
            self._ex = LeadExecutor(self.shape, weights, self.world, blocks, self.block_size,
                                    self._tokens, weights.embed.dtype)
        for req_id in range(len(self._tokens)):  # the previous size's requests 0..n-1
            self._tokens.remove(req_id)
        plan = decode_plan(self._tokens, rows, CONTEXT, self.block_size)
        return self.timer(lambda: self._ex.execute(plan))

    def close(self) -> None:
        if self._ex is not None:
            self._ex.close()
            self._ex = None


def one_layer_round(cost: CostModel, rows: int) -> float:
    """What the cost model charges for the timed round without the rank group's work: a
    one-layer decode round of `rows` requests of CONTEXT tokens."""
    return (cost.gpu_pre_layer(rows) + cost.gpu_layer(rows, [], rows, rows * CONTEXT)
            + cost.gpu_post_layer(rows) + cost.gpu_iteration_overhead)


def with_rank_round(profile: Profile, walls: dict[int, float]) -> Profile:
    """The profile with `gpu.rank_round`: each timed round less the model's price for it
    (never below zero)."""
    cost = CostModel(profile)
    rows = sorted(walls)
    table = Table1D(x=rows, y=[max(walls[b] - one_layer_round(cost, b), 0.0) for b in rows])
    return profile.model_copy(update={"gpu": profile.gpu.model_copy(
        update={"rank_round": table})})
