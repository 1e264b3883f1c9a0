"""Transformer shapes: the few numbers that turn a model into bytes and FLOPs.

The cost model, the roofline synthesizer and the KV pools all need the same derived
quantities (KV bytes per token, weight bytes, linear FLOPs), so they live here, once.
Only Llama-style decoders are described: RMSNorm, GQA attention, SwiGLU MLP, optional
Qwen3 q/k norm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from dualpace_sim.common.inputs import read_text

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# config.json fields of architectures the costs do not model, each with what it means. A
# config with one of them set would otherwise be priced as the dense Llama-style model its
# other fields describe (a Mixtral as a Mistral-7B), silently wrong.
UNMODELLED_FIELDS = {
    "num_local_experts": "mixture-of-experts layers",
    "num_experts": "mixture-of-experts layers",
    "n_routed_experts": "mixture-of-experts layers",
    "num_experts_per_tok": "mixture-of-experts routing",
    "moe_intermediate_size": "mixture-of-experts layers",
    "kv_lora_rank": "multi-head latent attention (MLA)",
    "q_lora_rank": "multi-head latent attention (MLA)",
    "quantization_config": "quantized weights",
}


@dataclass(frozen=True)
class ModelShape:
    """Shape of a decoder-only model; every size is in elements unless the name says bytes."""

    # Inside a profile pydantic validates this dataclass: strictly, like the rest of the file,
    # and with the attribute docstrings below as the descriptions in the profile reference.
    __pydantic_config__ = {"extra": "forbid", "allow_inf_nan": False,
                           "use_attribute_docstrings": True}

    name: str
    """the model's name, e.g. `llama-3.1-8b`"""
    n_layers: int
    """transformer layers N"""
    hidden_size: int
    """hidden dimension H"""
    n_heads: int
    """query heads"""
    n_kv_heads: int
    """key/value heads (GQA); divides n_heads"""
    head_dim: int
    """dimension of one head"""
    intermediate_size: int
    """MLP (SwiGLU) inner dimension"""
    vocab_size: int
    """vocabulary size: the LM head's rows"""
    qk_norm: bool = False
    """RMSNorm on q and k before RoPE (Qwen3)"""
    dtype_bytes: int = 2
    """bytes per weight and KV element (2 for bf16)"""
    tie_word_embeddings: bool = False
    """the LM head shares the embedding's weights"""
    # Numerics the real model needs and costs do not: RMSNorm epsilon and RoPE. A
    # rope_scaling_factor of None means plain RoPE; otherwise Llama-3.1's frequency scaling.
    rms_norm_eps: float = 1e-5
    """RMSNorm epsilon"""
    rope_theta: float = 10000.0
    """RoPE base"""
    rope_scaling_factor: float | None = None
    """Llama-3.1 RoPE scaling factor; null: plain RoPE"""
    rope_low_freq_factor: float = 1.0
    """Llama-3.1 RoPE scaling: low-frequency factor"""
    rope_high_freq_factor: float = 4.0
    """Llama-3.1 RoPE scaling: high-frequency factor"""
    rope_original_max_position: int = 8192
    """Llama-3.1 RoPE scaling: the original context length"""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{f.name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )

    # --- attention geometry -------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the attention output (input of o_proj); differs from hidden for Qwen3-32B."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return 2 * self.kv_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes_per_token_per_layer * self.n_layers

    # --- parameters -------------------------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        """q, k, v and o projections (no biases in Llama/Qwen3)."""
        return self.hidden_size * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden_size

    @property
    def mlp_params_per_layer(self) -> int:
        """SwiGLU: gate, up and down projections."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer + self.norm_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Weights the LM head reads per call; it reads them even when tied to the embedding."""
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        final_norm = self.hidden_size
        return self.n_layers * self.params_per_layer + self.embedding_params + head + final_norm

    @property
    def weight_bytes_per_layer(self) -> int:
        return self.params_per_layer * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        return self.total_params * self.dtype_bytes

    @property
    def linear_flops_per_token_per_layer(self) -> int:
        """2 FLOPs per multiply-accumulate over the projection weights of one layer."""
        return 2 * (self.attn_params_per_layer + self.mlp_params_per_layer)

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def from_name(cls, name: str) -> ModelShape:
        try:
            return BUILTIN_SHAPES[name]
        except KeyError:
            known = ", ".join(sorted(BUILTIN_SHAPES))
            raise ValueError(f"unknown model {name!r}; known models: {known}") from None

    @classmethod
    def from_hf_config(
        cls, source: str | Path | dict[str, Any], name: str | None = None
    ) -> ModelShape:
        """Read a Hugging Face ``config.json`` (a path, its directory, or the parsed dict).

        Multimodal configs that nest the language model under ``text_config`` are accepted.
        """
        if isinstance(source, dict):
            cfg, default_name, where = source, None, "the model config"
        else:
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            where = str(path)
            try:
                cfg = json.loads(read_text(path, "model config"))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: invalid JSON (line {e.lineno}): {e.msg}") from None
            if not isinstance(cfg, dict):
                raise ValueError(f"{path}: expected a JSON object (a Hugging Face config.json)")
            default_name = path.parent.name or None
        cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg
        refuse_unmodelled(cfg, str(path) if not isinstance(source, dict) else "config")
        try:
            return cls._from_fields(cfg, name, default_name)
        except KeyError as e:
            raise ValueError(f"{where}: has no {e.args[0]!r}; give a Hugging Face decoder "
                             "config.json (Llama or Qwen)") from None
        except (TypeError, ValueError, ZeroDivisionError) as e:
            raise ValueError(f"{where}: {e}") from None

    @classmethod
    def _from_fields(cls, cfg: dict[str, Any], name: str | None,
                     default_name: str | None) -> ModelShape:
        model_type = str(cfg.get("model_type", ""))
        n_heads = int(cfg["num_attention_heads"])
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        # transformers >= 5 writes rope_theta and the scaling together as rope_parameters.
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default")
                                              != "default" else None)
        return cls(
            name=name or cfg.get("_name_or_path") or default_name or model_type or "hf-model",
            n_layers=int(cfg["num_hidden_layers"]),
            hidden_size=int(cfg["hidden_size"]),
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // n_heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            qk_norm=model_type.startswith("qwen3"),
            dtype_bytes=_DTYPE_BYTES.get(dtype, 2),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
            **_rope_scaling(scaling),
        )


def refuse_unmodelled(cfg: dict[str, Any], where: str) -> None:
    """A one-line ValueError naming the first field of ``cfg`` that describes an architecture
    the costs do not model (:data:`UNMODELLED_FIELDS`, or sliding-window attention in use)."""
    for key, what in UNMODELLED_FIELDS.items():
        if cfg.get(key) not in (None, 0, 1, {}):
            raise ValueError(f"{where}: {key}: {what} ({key} = {cfg[key]!r}) are not modelled "
                             f"by the simulator yet; use a dense model's config")
    window = cfg.get("sliding_window")
    if window not in (None, 0) and cfg.get("use_sliding_window", True) is not False:
        raise ValueError(f"{where}: sliding_window: sliding-window attention (window {window}) "
                         f"is not modelled by the simulator yet; use a full-attention model's "
                         f"config (or one with use_sliding_window: false)")


def _rope_scaling(scaling: dict[str, Any] | None) -> dict[str, Any]:
    """Llama-3.1's `rope_type: llama3` scaling; other kinds are refused, not ignored."""
    if not scaling:
        return {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (only 'llama3')")
    return {
        "rope_scaling_factor": float(scaling["factor"]),
        "rope_low_freq_factor": float(scaling.get("low_freq_factor", 1.0)),
        "rope_high_freq_factor": float(scaling.get("high_freq_factor", 4.0)),
        "rope_original_max_position": int(scaling.get("original_max_position_embeddings", 8192)),
    }


def _builtin() -> dict[str, ModelShape]:
    # Values from the models' Hugging Face config.json files.
    shapes = [
        ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, rope_theta=500000.0,
                   rope_scaling_factor=8.0),
        ModelShape("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936, qk_norm=True,
                   rms_norm_eps=1e-6, rope_theta=1000000.0),
        ModelShape("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936, qk_norm=True,
                   rms_norm_eps=1e-6, rope_theta=1000000.0),
        # Tiny models for tests: same architecture, sizes small enough to run anywhere.
        ModelShape("tiny-llama", 2, 64, 4, 2, 16, 128, 256, rope_theta=500000.0,
                   rope_scaling_factor=8.0, rope_original_max_position=64),
        ModelShape("tiny-qwen3", 2, 64, 4, 2, 32, 128, 256, qk_norm=True, tie_word_embeddings=True,
                   rms_norm_eps=1e-6, rope_theta=1000000.0),
    ]
    return {s.name: s for s in shapes}


BUILTIN_SHAPES: dict[str, ModelShape] = _builtin()
