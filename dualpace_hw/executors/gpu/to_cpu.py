"""Prefill-to-CPU on the GPU: a chunk whose KV lives in the host pool, none of it in HBM.

Its K/V are computed on the GPU and attention uses GPU staging: the prompt's earlier chunks are
gathered back from the host pool layer by layer. Every layer's pages are copied to the request's
host blocks on the migrator's copy stream; a forward's `copies` report when the last layer
landed, and a request's next chunk waits on the GPU for its previous chunk's pages.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dualpace_hw.executors.gpu.batch import ChunkRows
from dualpace_hw.kernels import attention as ref_attn
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.migrate import CopyGroup, Migrator, PagePlan
from dualpace_sim.costs.shapes import ModelShape


class PrefillToCpu:
    """The attention of Prefill-to-CPU chunks and their pages' copies to the host pool."""

    def __init__(self, pool: PagedKVPool, host_pool: PagedKVPool, migrator: Migrator,
                 shape: ModelShape, n_layers: int, device: torch.device) -> None:
        self.pool, self.host_pool, self.migrator = pool, host_pool, migrator
        self.shape, self.n_layers = shape, n_layers
        self.device = device
        self.cuda = device.type == "cuda"
        self._req_copies: dict[int, CopyGroup] = {}  # per request, its latest chunk's copies

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  c: ChunkRows, copies: CopyGroup) -> torch.Tensor:
        """Attention of a Prefill-to-CPU chunk over GPU staging, and its pages to the host."""
        bs = self.pool.block_size
        kvh, hd = self.shape.n_kv_heads, self.shape.head_dim
        if layer == 0:
            earlier = self._req_copies.pop(c.req_id, None)
            if earlier is not None and self.cuda:
                earlier.block()  # the previous chunk's pages must have landed (GPU-side wait)
            self._req_copies[c.req_id] = CopyGroup()
        if c.start:  # the prompt's earlier chunks, back from the host: [start, kvh, hd]
            n_prev = -(-c.start // bs)
            kp, vp = self._gather_host_layer(layer, c.blocks[:n_prev])  # [n, kvh, bs, hd]
            kp = kp.transpose(1, 2).reshape(-1, kvh, hd)[: c.start].to(k.dtype)
            vp = vp.transpose(1, 2).reshape(-1, kvh, hd)[: c.start].to(v.dtype)
            kf, vf = torch.cat([kp, k]), torch.cat([vp, v])
        else:
            kf, vf = k, v
        out = ref_attn.prefix_attention(q, kf, vf, c.cu)
        handle = self.migrator.copy_layer_pages_to_host(layer, *self._pages(kf, vf, c))
        copies.add(handle)
        self._req_copies[c.req_id].add(handle)
        if c.last and layer == self.n_layers - 1:
            del self._req_copies[c.req_id]  # the prompt is complete: nothing reads it here
        return out

    def _pages(self, kf: torch.Tensor, vf: torch.Tensor, c: ChunkRows
               ) -> tuple[torch.Tensor, PagePlan]:
        """Whole pages from the first page this chunk touches to its last one, K and V stacked
        and put in host-id order for few large DMAs; with their page plan."""
        bs = self.pool.block_size
        kvh, hd = self.shape.n_kv_heads, self.shape.head_dim
        first, last = c.start // bs, (c.start + c.n - 1) // bs
        lo, hi = first * bs, (last + 1) * bs
        kv = torch.stack([kf[lo:], vf[lo:]])  # [2, tokens, kvh, hd]
        pad = hi - (c.start + c.n)
        if pad:
            kv = F.pad(kv, (0, 0, 0, 0, 0, pad))
        kv = kv.view(2, last + 1 - first, bs, kvh, hd).transpose(2, 3)  # [2, n, kvh, bs, hd]
        plan = self.migrator.page_plan(c.blocks[first:last + 1])
        kv = self.migrator.sort_pages(plan, kv.to(self.host_pool.data.dtype), dim=1)
        return kv, plan

    def _gather_host_layer(self, layer: int, host_blocks: list[int]
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V pages of `host_blocks` on the model's device (compute stream)."""
        hd = self.host_pool.data
        if not self.cuda:
            ids = torch.tensor(host_blocks)
            return hd[layer, 0].index_select(0, ids), hd[layer, 1].index_select(0, ids)
        plan = self.migrator.page_plan(host_blocks)
        stage = torch.empty((2, len(host_blocks)) + hd.shape[3:], dtype=hd.dtype,
                            device=self.device)
        for p, b0, m in plan.runs:  # host-id order
            stage[0, p:p + m].copy_(hd[layer, 0, b0:b0 + m], non_blocking=True)
            stage[1, p:p + m].copy_(hd[layer, 1, b0:b0 + m], non_blocking=True)
        stage = plan.unsort(stage, dim=1)
        return stage[0], stage[1]
