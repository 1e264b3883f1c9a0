"""Paged KV pools, one per tier, addressed by the block ids the core's block pools hand out.

One tensor per pool, [layers, 2 (K, V), blocks, kv_heads, block_size, head_dim] (the "HND"
page layout: a page holds one block of tokens for every KV head, and a head's tokens are
contiguous, which is what a CPU attention kernel streams). The core's BlockPool ids index the
`blocks` axis directly: no translation tables beyond the block tables themselves.
"""

from __future__ import annotations

import torch

from dualpace_sim.costs.shapes import ModelShape


class PagedKVPool:
    def __init__(
        self,
        shape: ModelShape,
        n_blocks: int,
        block_size: int = 16,
        device: str | torch.device = "cpu",
        pin_memory: bool = False,
        n_layers: int | None = None,
        dtype: torch.dtype = torch.bfloat16,
        storage: torch.Tensor | None = None,
    ) -> None:
        """storage: use these bytes (e.g. a shared arena's tensor) instead of allocating."""
        self.shape = shape
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.n_layers = shape.n_layers if n_layers is None else n_layers
        dims = self.dims(shape, n_blocks, block_size, self.n_layers)
        if storage is not None:
            if tuple(storage.shape) != dims or storage.dtype != dtype:
                raise ValueError(f"pool storage is {tuple(storage.shape)} {storage.dtype}, "
                                 f"the pool needs {dims} {dtype}")
            self.data = storage
            return
        pin = pin_memory and torch.device(device).type == "cpu" and torch.cuda.is_available()
        self.data = torch.zeros(dims, dtype=dtype, device=device, pin_memory=pin)

    @staticmethod
    def dims(shape: ModelShape, n_blocks: int, block_size: int = 16,
             n_layers: int | None = None) -> tuple[int, ...]:
        """The pool tensor's shape (to allocate it elsewhere, e.g. in a shared arena)."""
        return (shape.n_layers if n_layers is None else n_layers, 2, n_blocks, shape.n_kv_heads,
                block_size, shape.head_dim)

    @classmethod
    def from_budget(
        cls, shape: ModelShape, budget_bytes: int, block_size: int = 16, **kw
    ) -> PagedKVPool:
        """As many blocks as `budget_bytes` holds, sized up front."""
        n_layers = kw.get("n_layers") or shape.n_layers
        per_block = 2 * n_layers * shape.n_kv_heads * block_size * shape.head_dim * 2
        n_blocks = budget_bytes // per_block
        if n_blocks < 1:
            raise ValueError(f"a KV budget of {budget_bytes} bytes holds no {per_block}-byte block")
        return cls(shape, int(n_blocks), block_size, **kw)

    def heads(self, shard: ModelShape, rank: int) -> PagedKVPool:
        """Tensor-parallel rank `rank`'s KV heads of this pool, in place: a view whose pages
        are this rank's slice of each page (`shard` is the per-rank shape)."""
        k = shard.n_kv_heads
        return PagedKVPool(shard, self.n_blocks, self.block_size, n_layers=self.n_layers,
                           dtype=self.data.dtype,
                           storage=self.data[:, :, :, rank * k:(rank + 1) * k])

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers (what a swap moves per block)."""
        return self.data[:, :, 0].numel() * self.data.element_size()

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V pages of layer i: each [blocks, kv_heads, block_size, head_dim]."""
        return self.data[i, 0], self.data[i, 1]

    def write(
        self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store K/V [T, kv_heads, hd] of T tokens at slots (block * block_size + offset)."""
        kc, vc = self.layer(layer)
        blocks, offsets = slots // self.block_size, slots % self.block_size
        kc[blocks, :, offsets] = k.to(kc.dtype)
        vc[blocks, :, offsets] = v.to(vc.dtype)


def slot_mapping(block_table: list[int], start: int, count: int, block_size: int) -> list[int]:
    """Physical slots of token positions start .. start + count - 1 of one request."""
    return [block_table[p // block_size] * block_size + p % block_size
            for p in range(start, start + count)]
