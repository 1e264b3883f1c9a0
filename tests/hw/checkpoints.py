"""Tiny Hugging Face checkpoints made at test time: random weights saved by `transformers` as
safetensors, and a small byte-level BPE tokenizer trained by the `tokenizers` library. Nothing
is downloaded and nothing is committed."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a paged kv cache holds the keys and values of every request",
    "the cpu engine decodes while the gpu engine prefills new prompts",
    "dense assist runs the post attention stages on the gpu",
    "hello world, how are you today? i am fine, thank you.",
    "user: what is the capital of france? assistant: paris.",
] * 20

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


def train_tokenizer(out: Path, vocab_size: int = 384) -> int:
    """A byte-level BPE tokenizer with BOS added to every encoded text; returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE}))
    return tok.get_vocab_size()


def make_checkpoint(out: Path, family: str, seed: int = 0) -> Path:
    """A 2-layer `family` ("llama" or "qwen3") checkpoint folder at `out`, float32."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    vocab = train_tokenizer(out)
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(out / "tokenizer.json"))
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2,
                  bos_token_id=ids.token_to_id("<s>"), eos_token_id=ids.token_to_id("</s>"),
                  initializer_range=0.2, max_position_embeddings=512)
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
    from dualpace_hw.sampling import sample

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = ref(torch.tensor([ids])).logits[0, -1:]
            rows = [None if params is None else (params, len(ids))]
            ids.append(sample(logits, rows)[0])
    return ids[len(prompt):]


def tiny_scenario(path: Path, checkpoint: Path, policies: list[str], **scheduler) -> Path:
    """A scenario over `checkpoint`'s shape (a roofline of it) with pools small enough that
    prompts go Prefill-to-CPU and decodes migrate; its workload is what `run` would replay."""
    import yaml

    path.write_text(yaml.safe_dump({
        "name": "served-tiny",
        "roofline": {"hardware": "rtx4090-xeon4510-12c",
                     "model": str(checkpoint / "config.json")},
        "policies": policies,
        "vllm": {"max_num_batched_tokens": 64, "max_num_seqs": 8},
        "scheduler": {"gpu_kv_blocks": 10, "host_kv_blocks": 400, "gpu_token_limit": 16,
                      "cpu_batch_limit": 4, **scheduler},
        "workload": {"source": "default", "num_requests": 4, "rate": 50.0, "seed": 1,
                     "max_prompt_tokens": 24, "max_output_tokens": 12},
    }))
    return path
