"""What a runtime's GPU engine is built from, and the executor built from it: one GPU, or
rank 0 of a tensor-parallel group of GPU ranks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.runtime.cpu_worker import CpuEngineProcess
from dualpace_hw.runtime.gpu_ranks import LeadExecutor
from dualpace_sim.costs.shapes import ModelShape


@dataclass
class GpuEngine:
    """What the GPU engine's executor is built from: the full model's weights on the first
    GPU and its HBM pool's size; with `tensor_parallel` > 1, rank 0 of that many GPU ranks."""

    shape: ModelShape
    weights: ModelWeights
    gpu_blocks: int
    block_size: int
    dtype: torch.dtype
    tensor_parallel: int = 1

    def build(self, tokens: TokenStore, cpu_engine: CpuEngineProcess | None = None
              ) -> GpuExecutor:
        host_pool = cpu_engine.host_pool if cpu_engine is not None else None
        if self.tensor_parallel == 1:
            pool = PagedKVPool(self.shape, self.gpu_blocks, self.block_size,
                               device=self.weights.embed.device, dtype=self.dtype)
            return GpuExecutor(Model(self.shape, self.weights), pool, tokens, host_pool)
        return LeadExecutor(self.shape, self.weights, self.tensor_parallel, self.gpu_blocks,
                            self.block_size, tokens, self.dtype, host_pool,
                            cpu_engine.share if cpu_engine is not None else None,
                            cpu_engine.cores if cpu_engine is not None else None)

