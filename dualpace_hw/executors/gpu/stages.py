"""The forward's stage kernels over one model and one paged HBM pool.

Each layer computes q/k/v for all rows and stores K/V into the pages, runs paged decode
attention for the decode rows and causal attention over the prefix for each chunk, then the
post-attention stage; the post-layer samples the sampled rows. On CUDA, RMSNorm, q/k-norm +
RoPE + the paged K/V store and SiLU-and-multiply run as fused Triton kernels (triton_ops.py),
decode attention is the Triton paged kernel (triton_decode.py) and prefill attention is
FlashAttention-2's varlen kernel over the gathered prefix. On the CPU device (the tests) the
stages are model.py's own and attention is attention.py's reference.

The executor's forwards, its CUDA graphs, Dense Assist and NEO's pipeline all call these.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dualpace_hw.executors.gpu.batch import Batch
from dualpace_hw.executors.gpu.forward import ForwardState
from dualpace_hw.executors.gpu.to_cpu import PrefillToCpu
from dualpace_hw.executors.model import Model, greedy
from dualpace_hw.kernels import attention as ref_attn
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.migrate import CopyGroup


class StageKernels:
    """pre-layer, a layer's pre-attention, attention and post-attention, the post-layer.

    fused: the Triton kernels of the dense stages; triton_decode: the Triton paged decode
    kernel. to_cpu: the attention of Prefill-to-CPU chunks (None: the executor has no host
    pool)."""

    def __init__(self, model: Model, pool: PagedKVPool, fused: bool, triton_decode: bool,
                 to_cpu: PrefillToCpu | None) -> None:
        self.model, self.shape, self.pool = model, model.shape, pool
        self.device = model.device
        self.fused, self.triton_decode = fused, triton_decode
        self.to_cpu = to_cpu

    def stage_fns(self, b: Batch, st: ForwardState, copies: CopyGroup
                  ) -> list[Callable[[], None]]:
        """[pre-layer, layer 0 .. N-1, post-layer] of a batch over one state."""
        fns: list[Callable[[], None]] = [lambda: self.pre_layer(b, st)]
        for layer in range(self.model.n_layers):
            fns.append(lambda layer=layer: self.layer(layer, b, st, copies))
        fns.append(lambda: self.post_layer(b, st))
        return fns

    def embed(self, b: Batch) -> torch.Tensor:
        """The pre-layer of a batch: its hidden states [T, hidden] (and, fused, its RoPE
        tables)."""
        hidden = self.model.pre_layer(b.ids)
        if self.fused:
            b.cos, b.sin = self.rope_tables(b.positions)
        return hidden

    def pre_layer(self, b: Batch, st: ForwardState) -> None:
        st.hidden = self.embed(b)

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin [T, hd/2] of the rows' positions (the fused kernels' input)."""
        freqs = positions.float()[:, None] * self.model.rope.inv_freq[None, :]
        return freqs.cos(), freqs.sin()

    def post_layer(self, b: Batch, st: ForwardState) -> None:
        """The sampled rows' logits and greedy tokens."""
        h = st.hidden if b.sample_rows is None else st.hidden.index_select(0, b.sample_rows)
        st.logits = self.model.post_layer(h)
        st.tokens = greedy(st.logits)

    def layer(self, layer: int, b: Batch, st: ForwardState, copies: CopyGroup) -> None:
        h = st.hidden
        q, k, v = self.pre_attn(layer, h, b)
        o = self.attention(layer, q, k, v, b, copies)
        st.hidden = self.post_attn(layer, o.view(o.shape[0], -1), h)

    def pre_attn(self, layer: int, h: torch.Tensor, b: Batch
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A layer's pre-attention stage: q [T, heads, hd], k and v [T, kv_heads, hd], the
        K/V of the batch's GPU rows stored into the HBM pages (none for slot -1)."""
        s, lw = self.shape, self.model.w.layers[layer]
        kc, vc = self.pool.layer(layer)
        if self.fused:
            from dualpace_hw.kernels import triton_ops

            x, _ = triton_ops.rms_norm(h, lw.input_norm, s.rms_norm_eps)
            qkv = lw.qkv(x)
            q, k = triton_ops.qkv_rope_store(
                qkv, b.cos, b.sin, b.slots, kc, vc, s.n_heads, s.n_kv_heads, s.head_dim,
                lw.q_norm, lw.k_norm, s.rms_norm_eps)
            v = qkv[:, s.q_dim + s.kv_dim:].view(-1, s.n_kv_heads, s.head_dim)
            return q, k, v
        q, k, v = self.model.pre_attn(layer, h, b.positions)
        if b.n_ext or b.padded or any(c.to_cpu for c in b.chunks):
            keep = b.slots >= 0
            self.pool.write(layer, b.slots[keep], k[keep], v[keep])
        else:
            self.pool.write(layer, b.slots, k, v)
        return q, k, v

    def post_attn(self, layer: int, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """A layer's post-attention stage of attention output [T, heads * hd]: the next
        hidden states."""
        if not self.fused:
            return self.model.post_attn(layer, attn, residual)
        from dualpace_hw.kernels import triton_ops

        lw, reduce = self.model.w.layers[layer], self.model.reduce  # reduce: tensor parallel
        x, h = triton_ops.rms_norm(reduce(lw.o(attn)), lw.post_norm, self.shape.rms_norm_eps,
                                   residual=residual)
        return h + reduce(lw.down(triton_ops.silu_mul(lw.gate_up(x))))

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  b: Batch, copies: CopyGroup, out: torch.Tensor | None = None
                  ) -> torch.Tensor:
        """A layer's attention of the batch's GPU rows ([T, heads, hd]; external rows are left
        for the caller to fill), Prefill-to-CPU pages issued into `copies`."""
        kc, vc = self.pool.layer(layer)
        o = torch.empty_like(q) if out is None else out
        d = b.n_dec
        if d:
            if self.triton_decode:
                from dualpace_hw.kernels import triton_decode

                triton_decode.paged_decode_attention(q[:d], kc, vc, b.block_tables,
                                                     b.context_lens, out=o[:d])
            else:
                o[:d] = ref_attn.paged_decode_attention(q[:d], kc, vc, b.block_tables,
                                                        b.context_lens)
        for c in b.chunks:
            rows = slice(c.row0, c.row0 + c.n)
            if not c.to_cpu:
                o[rows] = ref_attn.prefill_attention(q[rows], kc, vc, c.table, c.start, c.cu)
            else:
                o[rows] = self.to_cpu.attention(layer, q[rows], k[rows], v[rows], c, copies)
        return o
