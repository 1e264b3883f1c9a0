"""Tensor parallelism: one rank's shard of a model, and the all-reduces that join the shards.

Megatron-style, as the paper's multi-GPU configurations run: each rank holds n_heads / N query
heads and n_kv_heads / N KV heads (so its KV pool holds only its heads), and I / N of the MLP's
intermediate width. The QKV and gate/up projections are split by output rows, the output and
down projections by input columns, so a layer needs two all-reduces — after the output
projection and after the down projection — and every rank ends each layer holding the full
hidden state. Embedding, norms and the LM head are replicated, so every rank samples the same
tokens. The same code serves GPU ranks (NCCL) and CPU ranks (Gloo): only the process group's
backend differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist

from dualpace_hw.executors.model import Dense, LayerWeights, ModelWeights
from dualpace_sim.costs.shapes import ModelShape


def shard_shape(shape: ModelShape, world: int) -> ModelShape:
    """The per-rank shape: heads and MLP width divided by `world` (they must divide)."""
    for name in ("n_heads", "n_kv_heads", "intermediate_size"):
        if getattr(shape, name) % world:
            raise ValueError(f"{shape.name}: {name}={getattr(shape, name)} does not split over "
                             f"{world} ranks")
    return dataclasses.replace(shape, n_heads=shape.n_heads // world,
                               n_kv_heads=shape.n_kv_heads // world,
                               intermediate_size=shape.intermediate_size // world)


def shard_weights(weights: ModelWeights, shape: ModelShape, rank: int,
                  world: int) -> ModelWeights:
    """Rank `rank`'s shard of full weights (copies, so the full tensors can be freed)."""
    if world == 1:
        return weights
    q, kv, inter = shape.q_dim // world, shape.kv_dim // world, shape.intermediate_size // world

    def rows(w: torch.Tensor, starts: tuple[int, ...], size: int) -> torch.Tensor:
        return torch.cat([w[s + rank * size: s + (rank + 1) * size] for s in starts]).clone()

    def cols(w: torch.Tensor, size: int) -> torch.Tensor:
        return w[:, rank * size: (rank + 1) * size].clone()

    layers = []
    for lw in weights.layers:
        qkv = lw.qkv.weight
        q_rows = rows(qkv, (0,), q)
        kv_rows = rows(qkv, (shape.q_dim, shape.q_dim + shape.kv_dim), kv)
        layers.append(LayerWeights(
            input_norm=lw.input_norm, qkv=Dense(torch.cat([q_rows, kv_rows])),
            o=Dense(cols(lw.o.weight, q)), post_norm=lw.post_norm,
            gate_up=Dense(rows(lw.gate_up.weight, (0, shape.intermediate_size), inter)),
            down=Dense(cols(lw.down.weight, inter)), q_norm=lw.q_norm, k_norm=lw.k_norm))
    return ModelWeights(weights.embed, layers, weights.final_norm, weights.lm_head)


def all_reduce(group: dist.ProcessGroup | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The Model's `reduce`: sum a partial projection over the group's ranks, in place."""

    def reduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t

    return reduce
