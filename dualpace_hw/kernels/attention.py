"""Attention over paged KV: prefill attention for the GPU executor, and plain PyTorch paths
that run on any device.

Decode attention has faster kernels elsewhere (Triton on CUDA, a C++/OpenMP kernel on the CPU);
this module's decode path is their reference. Prefill attention on CUDA is FlashAttention-2's
varlen kernel (PyTorch's own, `aten._flash_attention_forward`): GQA natively and causal
aligned to the end of the key range, which is what a chunk at an offset into its prompt needs.
Masked SDPA, which it replaced, took SDPA's math path for the stacked GQA heads and ran 24-151x
the roofline on the H200 (docs/h200-measured-vs-roofline.md); it stays the path off CUDA. The
same kernel serves a Prefill-to-CPU chunk, whose prefix is staged on the GPU rather than paged.
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


def gather_tokens(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's first `length` tokens as K, V [length, kv_heads, hd] (token-major, the
    layout the flash kernel reads)."""
    ids = block_table[: -(-length // k_cache.shape[2])]
    # [n, kvh, bs, hd] -> [n * bs, kvh, hd]: the pages in token order
    k = k_cache[ids].transpose(1, 2).reshape(-1, k_cache.shape[1], k_cache.shape[3])[:length]
    v = v_cache[ids].transpose(1, 2).reshape(-1, v_cache.shape[1], v_cache.shape[3])[:length]
    return k, v


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start: int,
    cu: torch.Tensor | None = None,
) -> torch.Tensor:
    """A prompt chunk of C tokens at positions start .. start+C-1 attending causally to the
    whole prefix, whose K/V (this chunk's included) are already in the pages.

    q: [C, n_heads, hd] -> [C, n_heads, hd]. cu: `flash_lengths(C, start + C)` on q's device,
    uploaded with the round's other inputs (see `flash_prefix_attention`).
    """
    k, v = gather_tokens(k_cache, v_cache, block_table, start + q.shape[0])
    return prefix_attention(q, k, v, cu)


def masked_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start: int,
) -> torch.Tensor:
    """`prefill_attention` through masked SDPA on any device (the path flash replaced on
    CUDA, kept for the benchmark's before/after)."""
    k, v = gather_tokens(k_cache, v_cache, block_table, start + q.shape[0])
    return masked_prefix_attention(q, k, v)


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu: torch.Tensor | None = None) -> torch.Tensor:
    """q [C, n_heads, hd], the last C positions of k, v [L, kv_heads, hd], causal: flash
    varlen on CUDA (bf16/fp16), masked SDPA elsewhere. Both prefill paths use it: a chunk
    over the GPU pages, and a Prefill-to-CPU chunk over its GPU staging. cu: the flash
    kernel's lengths (`flash_lengths`), made here when not given."""
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        return flash_prefix_attention(q, k, v, cu)
    return masked_prefix_attention(q, k, v)


def flash_lengths(chunk: int, length: int) -> list[list[int]]:
    """The flash varlen kernel's cumulative lengths of one sequence: [[0, C], [0, L]]."""
    return [[0, chunk], [0, length]]


def flash_prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu: torch.Tensor | None = None) -> torch.Tensor:
    """`prefix_attention` through FlashAttention-2's varlen kernel: one sequence, GQA natively,
    causal from the bottom right (the chunk is the end of the key range).

    cu ([2, 2] int32 on q's device) should come with the caller's other inputs: made here,
    from a host list, it is a blocking copy that drains the stream, once a layer. On the H200
    box that kept every prefill round's host from running ahead of its GPU (128 stream
    synchronizations in four rounds of a profiler trace, session 14)."""
    chunk, length = q.shape[0], k.shape[0]
    if cu is None:
        cu = torch.tensor(flash_lengths(chunk, length), dtype=torch.int32, device=q.device)
    return torch.ops.aten._flash_attention_forward(
        q.contiguous(), k.contiguous(), v.contiguous(), cu[0], cu[1], chunk, length, 0.0, True,
        False)[0]


def masked_prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`prefix_attention` as SDPA with an explicit causal mask, the query heads of each KV
    group stacked (any device, any dtype)."""
    chunk, n_heads = q.shape[0], q.shape[1]
    length, kv_heads = k.shape[0], k.shape[1]
    group = n_heads // kv_heads
    qh = q.permute(1, 0, 2).reshape(kv_heads, group * chunk, -1)  # heads of a group stacked
    pos_q = torch.arange(length - chunk, length, device=q.device).repeat(group)
    mask = pos_q[:, None] >= torch.arange(length, device=q.device)[None, :]
    o = F.scaled_dot_product_attention(qh, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
    return o.view(kv_heads, group, chunk, -1).permute(2, 0, 1, 3).reshape(chunk, n_heads, -1)
