"""Attention over paged KV: a plain PyTorch path that runs on any device.

The executors use faster kernels where they have them (Triton on CUDA, a C++/OpenMP kernel on
the CPU); this module is their reference and their fallback.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's first `length` tokens as K, V [kv_heads, length, hd]."""
    n_blocks = -(-length // k_cache.shape[2])
    ids = block_table[:n_blocks]
    k = k_cache[ids].transpose(0, 1).reshape(k_cache.shape[1], -1, k_cache.shape[3])
    v = v_cache[ids].transpose(0, 1).reshape(v_cache.shape[1], -1, v_cache.shape[3])
    return k[:, :length], v[:, :length]


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> torch.Tensor:
    """One query per request over its paged history, GQA.

    q: [B, n_heads, hd]; caches: [blocks, kv_heads, block_size, hd]; block_tables: [B, max
    blocks] (padding ignored); context_lens: [B] tokens including the current one.
    Returns [B, n_heads, hd].
    """
    out = torch.empty_like(q)
    kv_heads = k_cache.shape[1]
    group = q.shape[1] // kv_heads
    for b, length in enumerate(context_lens.tolist()):
        k, v = gather_kv(k_cache, v_cache, block_tables[b], length)
        qb = q[b].view(kv_heads, group, -1)  # [kvh, group, hd]
        out[b] = F.scaled_dot_product_attention(qb, k, v).reshape(q.shape[1], -1)
    return out


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start: int,
) -> torch.Tensor:
    """A prompt chunk of C tokens at positions start .. start+C-1 attending causally to the
    whole prefix, whose K/V (this chunk's included) are already in the pages.

    q: [C, n_heads, hd] -> [C, n_heads, hd].
    """
    chunk = q.shape[0]
    length = start + chunk
    k, v = gather_kv(k_cache, v_cache, block_table, length)
    kv_heads = k.shape[0]
    group = q.shape[1] // kv_heads
    qh = q.permute(1, 0, 2).reshape(kv_heads, group * chunk, -1)  # heads of a group stacked
    pos_q = torch.arange(start, length, device=q.device).repeat(group)
    mask = pos_q[:, None] >= torch.arange(length, device=q.device)[None, :]
    o = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask)
    return o.view(kv_heads, group, chunk, -1).permute(2, 0, 1, 3).reshape(chunk, q.shape[1], -1)
