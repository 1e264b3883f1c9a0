"""Fused elementwise kernels for the GPU executor's stages (Triton, CUDA).

model.py writes each stage as plain PyTorch ops: an RMSNorm is nine kernels, RoPE on q and k
about twenty. At decode batch sizes those launches, not the weights, would dominate a step, so
on CUDA the executor runs the same arithmetic fused: RMSNorm (optionally with the residual
add), q/k-norm + RoPE + the paged K/V store in one kernel, and SiLU-and-multiply. Each kernel
rounds where the PyTorch ops round (to the activation dtype between ops), so the results match
model.py's stages up to the order of a sum. The matrix products stay cuBLAS (the `Dense`
objects).
"""

from __future__ import annotations

import torch

from dualpace_hw.kernels.triton_decode import HAVE_TRITON

if HAVE_TRITON:  # pragma: no cover - depends on the machine
    import triton
    import triton.language as tl

    @triton.jit
    def _rms_norm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, h_ptr, stride_x, stride_r, stride_o, stride_h, eps,
        N: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < N
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
        if HAS_RES:
            r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(h_ptr + row * stride_h + offs, x, mask=mask)
        xf = x.to(tl.float32)
        var = tl.sum(xf * xf, 0) / N
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = (xf * (1.0 / tl.sqrt(var + eps))) * w
        tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rope_heads(x1, x2, cos, sin, nw_ptr, eps, HALF: tl.constexpr, QK_NORM: tl.constexpr,
                    DT: tl.constexpr):
        """x1, x2: [heads, HALF] fp32 halves of each head -> rotated halves (fp32)."""
        if QK_NORM:
            d = tl.arange(0, HALF)
            var = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF)
            inv = 1.0 / tl.sqrt(var + eps)
            w1 = tl.load(nw_ptr + d).to(tl.float32)
            w2 = tl.load(nw_ptr + HALF + d).to(tl.float32)
            x1 = ((x1 * inv[:, None]) * w1[None, :]).to(DT).to(tl.float32)
            x2 = ((x2 * inv[:, None]) * w2[None, :]).to(DT).to(tl.float32)
        o1 = x1 * cos[None, :] + (-x2) * sin[None, :]
        o2 = x2 * cos[None, :] + x1 * sin[None, :]
        return o1, o2

    @triton.jit
    def _qkv_rope_store_kernel(
        qkv_ptr, cos_ptr, sin_ptr, slots_ptr, qn_ptr, kn_ptr,
        q_out_ptr, k_out_ptr, kc_ptr, vc_ptr,
        stride_qkv, stride_cs, stride_qo_t, stride_qo_h, stride_ko_t, stride_ko_h,
        stride_cb, stride_ch, stride_ct, eps,
        H: tl.constexpr, KVH: tl.constexpr, H_PAD: tl.constexpr, KVH_PAD: tl.constexpr,
        HD: tl.constexpr, BS: tl.constexpr, QK_NORM: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        HALF: tl.constexpr = HD // 2
        DT = q_out_ptr.dtype.element_ty
        d = tl.arange(0, HALF)
        cos = tl.load(cos_ptr + t * stride_cs + d)
        sin = tl.load(sin_ptr + t * stride_cs + d)
        row = qkv_ptr + t * stride_qkv

        hq = tl.arange(0, H_PAD)
        mq = hq[:, None] < H
        q1 = tl.load(row + hq[:, None] * HD + d[None, :], mask=mq, other=0.0).to(tl.float32)
        q2 = tl.load(row + hq[:, None] * HD + HALF + d[None, :], mask=mq, other=0.0)
        q1, q2 = _rope_heads(q1, q2.to(tl.float32), cos, sin, qn_ptr, eps, HALF, QK_NORM, DT)
        qo = q_out_ptr + t * stride_qo_t + hq[:, None] * stride_qo_h + d[None, :]
        tl.store(qo, q1.to(DT), mask=mq)
        tl.store(qo + HALF, q2.to(DT), mask=mq)

        hk = tl.arange(0, KVH_PAD)
        mk = hk[:, None] < KVH
        kbase = row + H * HD
        k1 = tl.load(kbase + hk[:, None] * HD + d[None, :], mask=mk, other=0.0).to(tl.float32)
        k2 = tl.load(kbase + hk[:, None] * HD + HALF + d[None, :], mask=mk, other=0.0)
        k1, k2 = _rope_heads(k1, k2.to(tl.float32), cos, sin, kn_ptr, eps, HALF, QK_NORM, DT)
        k1 = k1.to(DT)
        k2 = k2.to(DT)
        ko = k_out_ptr + t * stride_ko_t + hk[:, None] * stride_ko_h + d[None, :]
        tl.store(ko, k1, mask=mk)
        tl.store(ko + HALF, k2, mask=mk)

        slot = tl.load(slots_ptr + t).to(tl.int64)
        if slot >= 0:
            blk = slot // BS
            off = slot % BS
            dst = blk * stride_cb + hk[:, None] * stride_ch + off * stride_ct + d[None, :]
            tl.store(kc_ptr + dst, k1.to(kc_ptr.dtype.element_ty), mask=mk)
            tl.store(kc_ptr + dst + HALF, k2.to(kc_ptr.dtype.element_ty), mask=mk)
            vbase = row + (H + KVH) * HD
            v1 = tl.load(vbase + hk[:, None] * HD + d[None, :], mask=mk, other=0.0)
            v2 = tl.load(vbase + hk[:, None] * HD + HALF + d[None, :], mask=mk, other=0.0)
            tl.store(vc_ptr + dst, v1.to(vc_ptr.dtype.element_ty), mask=mk)
            tl.store(vc_ptr + dst + HALF, v2.to(vc_ptr.dtype.element_ty), mask=mk)

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, stride_gu, stride_o, N: tl.constexpr,
                         BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        g = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0)
        u = tl.load(gu_ptr + row * stride_gu + N + offs, mask=mask, other=0.0).to(tl.float32)
        DT = out_ptr.dtype.element_ty
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(DT).to(tl.float32)
        tl.store(out_ptr + row * stride_o + offs, (s * u).to(DT), mask=mask)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x (or of x + residual). Returns (normed, the normed input)."""
    t, n = x.shape
    out = torch.empty_like(x)
    h = torch.empty_like(x) if residual is not None else x
    if t:
        res = residual if residual is not None else x
        _rms_norm_kernel[(t,)](
            x, res, w, out, h, x.stride(0), res.stride(0), out.stride(0), h.stride(0), eps,
            N=n, BLOCK=triton.next_power_of_2(n), HAS_RES=residual is not None,
            num_warps=8 if n >= 2048 else 4,
        )
    return out, h


def qkv_rope_store(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, n_heads: int, kv_heads: int, head_dim: int,
    q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, (H + 2 KVH) hd] -> q [T, H, hd] and k [T, KVH, hd] with (q/k-norm and) RoPE;
    K and V stored into the pages at `slots` (a slot < 0 stores nothing)."""
    t = qkv.shape[0]
    q = torch.empty(t, n_heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    k = torch.empty(t, kv_heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    if t:
        qn = q_norm if q_norm is not None else cos
        kn = k_norm if k_norm is not None else cos
        _qkv_rope_store_kernel[(t,)](
            qkv, cos, sin, slots, qn, kn, q, k, k_cache, v_cache,
            qkv.stride(0), cos.stride(0), q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), eps,
            H=n_heads, KVH=kv_heads, H_PAD=triton.next_power_of_2(n_heads),
            KVH_PAD=triton.next_power_of_2(kv_heads), HD=head_dim, BS=k_cache.shape[2],
            QK_NORM=q_norm is not None, num_warps=4,
        )
    return q, k


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    t, n2 = gate_up.shape
    n = n2 // 2
    out = torch.empty(t, n, device=gate_up.device, dtype=gate_up.dtype)
    if t:
        block = min(2048, triton.next_power_of_2(n))
        _silu_mul_kernel[(t, triton.cdiv(n, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), N=n, BLOCK=block, num_warps=4)
    return out
