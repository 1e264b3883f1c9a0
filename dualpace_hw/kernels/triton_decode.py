"""Paged decode attention in Triton, for the HND page layout with GQA.

Pages are [blocks, kv_heads, block_size, head_dim] (kv.py). One program per (request, KV head,
split): it loads the query heads of the KV head's group at once ([group, hd], padded to the 16
rows a tensor-core dot needs), walks the request's pages through its block table a few pages
per iteration, and keeps an online softmax in fp32. With few requests the context is split
across programs (flash-decoding) and a second small kernel merges the partial results by their
log-sum-exp, so a batch of one still fills the GPU; with many requests there is one split and
the output is written directly.

`triton` is imported lazily: the module imports on a machine without it (CI), and `available()`
says whether the kernel can run. Under TRITON_INTERPRET=1 the kernel runs on CPU tensors, which
is how the tests check it without a GPU.
"""

from __future__ import annotations

import math

import torch

try:  # pragma: no cover - depends on the machine
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover
    HAVE_TRITON = False


def available() -> bool:
    return HAVE_TRITON


if HAVE_TRITON:

    # Integers that vary from batch to batch are not specialized on (Triton would compile a
    # variant per divisibility class), and the split count is a runtime value: a cold
    # variant costs ~1 s of JIT in the middle of serving. What remains is few enough for
    # `warm_up` to compile before the clock starts.
    _VARYING = ["stride_btb", "stride_pb", "stride_ph", "stride_lb", "stride_lh",
                "blocks_per_split"]

    @triton.jit(do_not_specialize=_VARYING)
    def _paged_decode_kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr, part_ptr, lse_ptr,
        stride_qb, stride_qh,
        stride_kb, stride_kh, stride_kt,
        stride_btb,
        stride_ob, stride_oh,
        stride_pb, stride_ph, stride_ps,
        stride_lb, stride_lh,
        scale, blocks_per_split,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HD: tl.constexpr, BS: tl.constexpr,
        PAGES: tl.constexpr, SPLIT: tl.constexpr, IEEE: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        s = tl.program_id(2)
        length = tl.load(lens_ptr + b)
        n_blocks = (length + BS - 1) // BS
        first = s * blocks_per_split
        last = tl.minimum(first + blocks_per_split, n_blocks)

        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, HD)
        heads = kvh * GROUP + offs_g
        gmask = offs_g < GROUP
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=gmask[:, None], other=0.0)

        N: tl.constexpr = PAGES * BS
        offs_n = tl.arange(0, N)
        page_of_n = offs_n // BS
        slot_of_n = offs_n % BS
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HD], tl.float32)
        kv_base = kvh * stride_kh
        for blk in range(first, last, PAGES):
            page_idx = blk + page_of_n
            page_ok = page_idx < last
            page = tl.load(bt_ptr + b * stride_btb + page_idx, mask=page_ok, other=0).to(tl.int64)
            tok = page_idx * BS + slot_of_n
            valid = page_ok & (tok < length)
            off = page[:, None] * stride_kb + kv_base + slot_of_n[:, None] * stride_kt \
                + offs_d[None, :]
            k = tl.load(k_ptr + off, mask=valid[:, None], other=0.0)
            if IEEE:
                scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                scores = tl.dot(q, tl.trans(k)) * scale
            scores = tl.where(valid[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + off, mask=valid[:, None], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new

        if SPLIT:
            safe = tl.where(l_i > 0, l_i, 1.0)
            part = acc / safe[:, None]
            lse = tl.where(l_i > 0, m_i + tl.log(safe), float("-inf"))
            tl.store(part_ptr + b * stride_pb + heads[:, None] * stride_ph + s * stride_ps
                     + offs_d[None, :], part, mask=gmask[:, None])
            tl.store(lse_ptr + b * stride_lb + heads * stride_lh + s, lse, mask=gmask)
        else:
            safe = tl.where(l_i > 0, l_i, 1.0)
            o = acc / safe[:, None]
            tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=gmask[:, None])

    @triton.jit(do_not_specialize=["stride_pb", "stride_ph", "stride_lb", "stride_lh", "S"])
    def _merge_splits_kernel(
        part_ptr, lse_ptr, out_ptr,
        stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh, S,
        S_PAD: tl.constexpr, HD: tl.constexpr,
    ):
        b = tl.program_id(0)
        h = tl.program_id(1)
        offs_s = tl.arange(0, S_PAD)
        offs_d = tl.arange(0, HD)
        smask = offs_s < S
        lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=smask,
                      other=float("-inf"))
        m = tl.max(lse, 0)
        w = tl.where(smask & (lse > float("-inf")), tl.exp(lse - m), 0.0)
        w = w / tl.sum(w, 0)
        part = tl.load(part_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps
                       + offs_d[None, :], mask=smask[:, None], other=0.0)
        o = tl.sum(part * w[:, None], 0)
        tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty))


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def choose_splits(batch: int, kv_heads: int, max_blocks: int, block_size: int,
                  sm_count: int) -> int:
    """Split the context until there are ~16 programs per SM (about five waves at three
    resident programs per SM, so the last wave's tail is small), each split at least 128
    tokens (two iterations) long; at most 128 splits."""
    programs = max(1, batch * kv_heads)
    want = -(-16 * sm_count // programs)
    cap = max(1, -(-max_blocks * block_size // 128))
    return max(1, min(want, cap, 128))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as attention.paged_decode_attention.

    q: [B, n_heads, hd]; caches: [blocks, kv_heads, block_size, hd]; block_tables: [B, max
    blocks] int32 (padding ignored); context_lens: [B] int32, tokens including the current one.
    Returns [B, n_heads, hd] in q's dtype. A request with context 0 gets zeros. The launch
    depends on no host value of the tensors, so it can be captured in a CUDA graph.
    """
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    bsz, n_heads, hd = q.shape
    _, kv_heads, block_size, hd2 = k_cache.shape
    assert hd == hd2 and n_heads % kv_heads == 0
    assert k_cache.stride(3) == 1 and q.stride(2) == 1
    group = n_heads // kv_heads
    max_blocks = block_tables.shape[1]
    if out is None:
        out = torch.empty_like(q)
    if bsz == 0:
        return out
    if splits is None:
        splits = choose_splits(bsz, kv_heads, max_blocks, block_size, _sm_count(q.device))
    splits = max(1, min(splits, max_blocks))
    blocks_per_split = -(-max_blocks // splits)
    pages = max(1, 64 // block_size)
    group_pad = max(16, triton.next_power_of_2(group))
    scale = 1.0 / math.sqrt(hd)
    if splits == 1:
        part = lse = out  # unused
        psb = psh = pss = lsb = lsh = 0
    else:
        part = torch.empty(bsz, n_heads, splits, hd, device=q.device, dtype=torch.float32)
        lse = torch.empty(bsz, n_heads, splits, device=q.device, dtype=torch.float32)
        psb, psh, pss = part.stride(0), part.stride(1), part.stride(2)
        lsb, lsh = lse.stride(0), lse.stride(1)
    _paged_decode_kernel[(bsz, kv_heads, splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part, lse,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        psb, psh, pss, lsb, lsh,
        scale, blocks_per_split,
        GROUP=group, GROUP_PAD=group_pad, HD=hd, BS=block_size, PAGES=pages,
        SPLIT=splits > 1, IEEE=q.dtype == torch.float32, num_warps=4, num_stages=2,
    )
    if splits > 1:
        _merge_splits_kernel[(bsz, n_heads)](
            part, lse, out, psb, psh, pss, lsb, lsh, out.stride(0), out.stride(1), splits,
            S_PAD=triton.next_power_of_2(splits), HD=hd, num_warps=4,
        )
    return out
