"""Dense Assist on the GPU: the dense stages of a CPU engine's batch, its tensors staged in and
out through pinned buffers.

The entry points are the paper's assists: g_p (one non-final post-attention stage), g_lS
(Split-Final's post-layer) and g_lA (Fused-Assist's last post-attention stage and the
post-layer). The executor runs them on its assist stream.
"""

from __future__ import annotations

import torch

from dualpace_hw.executors.gpu.stages import StageKernels
from dualpace_hw.executors.model import greedy
from dualpace_hw.executors.sampling import Row, perturb


class DenseAssist:
    """A CPU batch's dense stages on this GPU; rank: this executor's tensor-parallel rank (an
    attention output of every head comes in, and it takes its own heads' columns)."""

    def __init__(self, kernels: StageKernels, rank: int) -> None:
        self.kernels, self.rank = kernels, rank
        self.device = kernels.device
        self.cuda = self.device.type == "cuda"
        self.dtype = kernels.model.w.embed.dtype
        self._pinned: dict[str, torch.Tensor] = {}
        self._event = torch.cuda.Event() if self.cuda else None

    def post_attn(self, layer: int, attn_out_cpu: torch.Tensor, residual_cpu: torch.Tensor,
                  out: torch.Tensor | None = None) -> torch.Tensor:
        """g_p: one non-final post-attention stage of a CPU batch -> hidden (CPU)."""
        attn = self._stage_in("attn", self._own_heads(attn_out_cpu))
        res = self._stage_in("residual", residual_cpu)
        return self._stage_out("hidden", self.kernels.post_attn(layer, attn, res), out)

    def post_layer(self, hidden_cpu: torch.Tensor, out: torch.Tensor | None = None,
                   sampling_rows: list[Row] | None = None) -> torch.Tensor:
        """g_lS: the post-layer of a CPU batch -> token ids (CPU); `sampling_rows` perturb the
        logits of the CPU step's sampling requests."""
        h = self._stage_in("residual", hidden_cpu)
        return self._stage_out("tokens", self._tokens(h, sampling_rows), out)

    def fused_final(self, layer: int, attn_out_cpu: torch.Tensor, residual_cpu: torch.Tensor,
                    out: torch.Tensor | None = None, sampling_rows: list[Row] | None = None
                    ) -> torch.Tensor:
        """g_lA: the last post-attention stage and the post-layer -> token ids (CPU)."""
        attn = self._stage_in("attn", self._own_heads(attn_out_cpu))
        res = self._stage_in("residual", residual_cpu)
        h = self.kernels.post_attn(layer, attn, res)
        return self._stage_out("tokens", self._tokens(h, sampling_rows), out)

    def join(self, layer: int, attn: torch.Tensor, residual: torch.Tensor) -> None:
        """A tensor-parallel rank's part of rank 0's g_p or g_lA: the post-attention stage on
        its heads' columns `attn` (its all-reduces are rank 0's too); rank 0 keeps the result."""
        self.kernels.post_attn(layer, attn.to(self.device, self.dtype),
                               residual.to(self.device, self.dtype))

    def _tokens(self, hidden: torch.Tensor, sampling_rows: list[Row] | None) -> torch.Tensor:
        logits = self.kernels.model.post_layer(hidden)
        return greedy(logits if sampling_rows is None else perturb(logits, sampling_rows))

    def _own_heads(self, attn: torch.Tensor) -> torch.Tensor:
        """This rank's columns of an attention output of every head (tensor parallel)."""
        q = self.kernels.shape.q_dim
        return attn if attn.shape[1] == q else attn[:, self.rank * q:(self.rank + 1) * q]

    def _stage_in(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor to the model's device (through a pinned buffer on CUDA)."""
        if not self.cuda:
            return t.to(self.device, self.dtype)
        if t.is_pinned():
            return t.to(self.device, non_blocking=True).to(self.dtype)
        buf = self._pinned_buffer(name, t.numel(), t.dtype)
        view = buf[: t.numel()].view(t.shape)
        view.copy_(t)
        return view.to(self.device, non_blocking=True).to(self.dtype)

    def _pinned_buffer(self, name: str, n: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self._pinned.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            buf = torch.empty(max(n, 1 << 16), dtype=dtype, pin_memory=True)
            self._pinned[name] = buf
        return buf

    def _stage_out(self, name: str, t: torch.Tensor,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """A result back to the CPU: straight into `out` (pinned, e.g. the runtime's shared
        assist buffer: one DMA, no CPU copy), else through a pinned buffer and a clone."""
        if out is not None:
            out.copy_(t.reshape(out.shape), non_blocking=self.cuda and out.is_pinned())
            if self.cuda:
                self._event.record()
                self._event.synchronize()
            return out
        if not self.cuda:
            return t
        buf = self._pinned_buffer(name, t.numel(), t.dtype)
        view = buf[: t.numel()].view(t.shape)
        view.copy_(t, non_blocking=True)
        self._event.record()
        self._event.synchronize()
        return view.clone()
