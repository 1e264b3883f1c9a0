"""A Llama-architecture decoder (Llama-3.1, Qwen3) split into the paper's execution stages.

Stages: pre-layer (embedding); per layer pre-attention (RMSNorm, QKV, q/k norm, RoPE),
attention (done by an executor over its paged KV pool), post-attention (o_proj, residual,
RMSNorm, SwiGLU MLP, residual); post-layer (final RMSNorm, LM head, greedy sampling). Any stage
runs on whichever device holds the weights, so the GPU executor, the CPU executor and Dense
Assist share this one file. Projections are `Dense` objects so an executor can swap in a faster
implementation (weights packed for AMX on the CPU) without touching the model code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dualpace_sim.costs.shapes import ModelShape


class Dense:
    """y = x @ W^T for a weight W of shape [out, in]."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: Dense  # [q_dim + 2 kv_dim, H]: q, k, v projections fused
    o: Dense  # [H, q_dim]
    post_norm: torch.Tensor  # [H]
    gate_up: Dense  # [2 I, H]: gate and up projections fused
    down: Dense  # [H, I]
    q_norm: torch.Tensor | None = None  # [head_dim], Qwen3 only
    k_norm: torch.Tensor | None = None


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: Dense  # [V, H]

    @classmethod
    def random(
        cls,
        shape: ModelShape,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        n_layers: int | None = None,
    ) -> ModelWeights:
        """Seeded random weights (timing does not depend on values; no hub access anywhere).

        `n_layers` builds fewer layers than the model has: profiling one decoder layer plus the
        pre/post-layer needs no 64 GB model. Scales keep activations O(1) through many layers.
        """
        # Drawn on the target device: 8 billion values drawn on a CPU take minutes.
        g = torch.Generator(device=device).manual_seed(seed)
        h, q, kv, i = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.intermediate_size

        def mat(rows: int, cols: int) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=g, device=device, dtype=dtype)
            return w.mul_(1 / math.sqrt(cols))

        def norm(n: int) -> torch.Tensor:
            w = torch.randn(n, generator=g, device=device, dtype=dtype)
            return w.mul_(0.1).add_(1.0)

        layers = []
        for _ in range(shape.n_layers if n_layers is None else n_layers):
            layers.append(LayerWeights(
                input_norm=norm(h), qkv=Dense(mat(q + 2 * kv, h)), o=Dense(mat(h, q)),
                post_norm=norm(h), gate_up=Dense(mat(2 * i, h)), down=Dense(mat(h, i)),
                q_norm=norm(shape.head_dim) if shape.qk_norm else None,
                k_norm=norm(shape.head_dim) if shape.qk_norm else None,
            ))
        embed = torch.randn(shape.vocab_size, h, generator=g, device=device, dtype=dtype)
        head = embed if shape.tie_word_embeddings else mat(shape.vocab_size, h)
        return cls(embed, layers, norm(h), Dense(head))

    def map(self, fn: Callable[[Any], Any]) -> ModelWeights:
        """The same structure with fn applied to every tensor (a tied LM head stays tied).

        fn may return something other than a tensor: the runtime maps the weights to arena
        references to hand them to the CPU engine's process, which maps them back to views."""
        def t(x: Any) -> Any:
            return None if x is None else fn(x)

        layers = [LayerWeights(t(lw.input_norm), Dense(t(lw.qkv.weight)), Dense(t(lw.o.weight)),
                               t(lw.post_norm), Dense(t(lw.gate_up.weight)),
                               Dense(t(lw.down.weight)), t(lw.q_norm), t(lw.k_norm))
                  for lw in self.layers]
        embed = t(self.embed)
        head = embed if self.lm_head.weight is self.embed else t(self.lm_head.weight)
        return ModelWeights(embed, layers, t(self.final_norm), Dense(head))

    def tensors(self) -> list[torch.Tensor]:
        """Every distinct tensor (to size an arena that will hold them)."""
        seen: list[torch.Tensor] = []
        self.map(lambda x: seen.append(x) or x)
        return seen

    def to(self, device: str | torch.device) -> ModelWeights:
        """The same weights on another device (the CPU engine's copy of the GPU's model)."""
        return self.map(lambda x: x.to(device))

    @classmethod
    def from_safetensors(
        cls, shape: ModelShape, path: str | Path, device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
    ) -> ModelWeights:
        """Hugging Face checkpoint names, from one file or a folder of shards."""
        from safetensors.torch import load_file

        path = Path(path)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"{path}: no .safetensors files")
        t: dict[str, torch.Tensor] = {}
        for f in files:
            t.update(load_file(str(f)))

        def get(name: str) -> torch.Tensor:
            if name not in t:
                raise KeyError(f"{path}: tensor {name} missing from the checkpoint")
            return t[name].to(device=device, dtype=dtype)

        layers = []
        for n in range(shape.n_layers):
            p = f"model.layers.{n}."
            a = p + "self_attn."
            qkv = torch.cat([get(a + "q_proj.weight"), get(a + "k_proj.weight"),
                             get(a + "v_proj.weight")])
            gate_up = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
            layers.append(LayerWeights(
                input_norm=get(p + "input_layernorm.weight"), qkv=Dense(qkv),
                o=Dense(get(a + "o_proj.weight")),
                post_norm=get(p + "post_attention_layernorm.weight"),
                gate_up=Dense(gate_up), down=Dense(get(p + "mlp.down_proj.weight")),
                q_norm=get(a + "q_norm.weight") if shape.qk_norm else None,
                k_norm=get(a + "k_norm.weight") if shape.qk_norm else None,
            ))
        embed = get("model.embed_tokens.weight")
        head = embed if shape.tie_word_embeddings else get("lm_head.weight")
        return cls(embed, layers, get("model.norm.weight"), Dense(head))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32, as Llama and Qwen3 do."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def rope_inv_freq(shape: ModelShape) -> torch.Tensor:
    """Inverse frequencies, with Llama-3.1's scaling of the low-frequency bands when set."""
    d = shape.head_dim
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    factor = shape.rope_scaling_factor
    if factor is None:
        return inv.float()
    low, high = shape.rope_low_freq_factor, shape.rope_high_freq_factor
    old = shape.rope_original_max_position
    wavelen = 2 * math.pi / inv
    smooth = (old / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    mid = (wavelen <= old / low) & (wavelen >= old / high)
    blended = (1 - smooth) * inv / factor + smooth * inv
    return torch.where(mid, blended, scaled).float()


class Rope:
    """cos/sin for any positions; rotate-half convention of the HF checkpoints."""

    def __init__(self, shape: ModelShape, device: str | torch.device = "cpu") -> None:
        self.inv_freq = rope_inv_freq(shape).to(device)

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]; positions: [T]."""
        freqs = positions.to(self.inv_freq.device).float()[:, None] * self.inv_freq[None, :]
        cos = torch.cat([freqs.cos(), freqs.cos()], -1)[:, None, :]
        sin = torch.cat([freqs.sin(), freqs.sin()], -1)[:, None, :]
        xf = x.float()
        half = xf.shape[-1] // 2
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], -1)
        return (xf * cos + rotated * sin).to(x.dtype)


class Model:
    """The stages of one model over one set of weights (one device).

    Under tensor parallelism (`tp`), `shape` and `weights` are one rank's shard and `reduce`
    sums the output and down projections' partial results over the ranks."""

    def __init__(self, shape: ModelShape, weights: ModelWeights,
                 reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.shape = shape
        self.w = weights
        self.device = weights.embed.device
        self.rope = Rope(shape, self.device)
        self.reduce = reduce or (lambda t: t)
        self.sharded = reduce is not None  # one tensor-parallel rank's shard

    @property
    def n_layers(self) -> int:
        return len(self.w.layers)

    def pre_layer(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids -> [T, H] hidden states."""
        return F.embedding(token_ids, self.w.embed)

    def pre_attn(
        self, layer: int, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[T, H] -> q [T, n_heads, hd], k and v [T, n_kv_heads, hd] (RoPE applied)."""
        s, lw = self.shape, self.w.layers[layer]
        x = rms_norm(hidden, lw.input_norm, s.rms_norm_eps)
        qkv = lw.qkv(x)
        q, k, v = qkv.split([s.q_dim, s.kv_dim, s.kv_dim], dim=-1)
        q = q.view(-1, s.n_heads, s.head_dim)
        k = k.view(-1, s.n_kv_heads, s.head_dim)
        v = v.view(-1, s.n_kv_heads, s.head_dim)
        if lw.q_norm is not None:
            q = rms_norm(q, lw.q_norm, s.rms_norm_eps)
            k = rms_norm(k, lw.k_norm, s.rms_norm_eps)
        return self.rope.apply(q, positions), self.rope.apply(k, positions), v

    def post_attn(
        self, layer: int, attn_out: torch.Tensor, residual: torch.Tensor
    ) -> torch.Tensor:
        """attention output [T, n_heads * hd] and the layer's input [T, H] -> next hidden."""
        lw = self.w.layers[layer]
        h = residual + self.reduce(lw.o(attn_out))
        x = rms_norm(h, lw.post_norm, self.shape.rms_norm_eps)
        gate, up = lw.gate_up(x).chunk(2, dim=-1)
        return h + self.reduce(lw.down(F.silu(gate) * up))

    def post_layer(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, H] hidden of the rows that sample -> [R, V] fp32 logits."""
        x = rms_norm(hidden, self.w.final_norm, self.shape.rms_norm_eps)
        return self.w.lm_head(x).float()


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Greedy sampling: serving benchmarks run to max_tokens, so no EOS handling either."""
    return logits.argmax(dim=-1)
