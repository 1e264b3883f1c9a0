"""Tiny Hugging Face checkpoints made at test time: random weights saved by `transformers` as
safetensors, and a small byte-level BPE tokenizer trained by the `tokenizers` library. Nothing
is downloaded and nothing is committed."""

from __future__ import annotations

from pathlib import Path

import torch

from dualpace_hw.executors.checkpoint import train_tokenizer

from . import scenarios

VOCAB = 600  # byte-level: 256 bytes, the special tokens and merges; the models have as many


def make_checkpoint(out: Path, family: str, seed: int = 0) -> Path:
    """A 2-layer `family` ("llama" or "qwen3") checkpoint folder at `out`, float32."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    ids = train_tokenizer(out, VOCAB)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, bos_token_id=ids["<s>"],
                  eos_token_id=ids["</s>"], initializer_range=0.2, max_position_embeddings=512)
    if family == "llama":
        config = LlamaConfig(**common, head_dim=16, rms_norm_eps=1e-5, rope_theta=500000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 64})
        cls = LlamaForCausalLM
    elif family == "qwen3":
        config = Qwen3Config(**common, head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0,
                             tie_word_embeddings=True)
        cls = Qwen3ForCausalLM
    else:
        raise ValueError(f"family {family!r}: llama or qwen3")
    torch.manual_seed(seed)
    model = cls(config).float().eval()
    with torch.no_grad():  # norms away from 1, so a wrong norm weight shows in the logits
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(out)
    return out


def reference_model(path: Path):
    """The same checkpoint through transformers' own implementation (float32, eager)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def reference_tokens(ref, prompt: list[int], n: int, params=None) -> list[int]:
    """`n` tokens continuing `prompt` by transformers' forward: greedy, or sampled with
    `params` (a seeded SamplingParams) through the runtime's own perturbation of the logits."""
    from dualpace_hw.executors.sampling import sample

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = ref(torch.tensor([ids])).logits[0, -1:]
            rows = [None if params is None else (params, len(ids))]
            ids.append(sample(logits, rows)[0])
    return ids[len(prompt):]


def tiny_scenario(path: Path, checkpoint: Path, policies: list[str], **scheduler) -> Path:
    """A scenario over `checkpoint`'s shape (a roofline of its config.json); its workload is
    what `run` would replay."""
    return scenarios.tiny_scenario(
        path, str(checkpoint / "config.json"), policies, "served-tiny",
        {"num_requests": 4, "rate": 50.0, "seed": 1, "max_prompt_tokens": 24,
         "max_output_tokens": 12}, **scheduler)
