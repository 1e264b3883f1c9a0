"""A Hugging Face checkpoint folder: its shape, its weights and its tokenizer; and a folder of
seeded random weights of any shape, for serving where no checkpoint can be downloaded.

`--checkpoint DIR` names a folder as the hub lays it out: `config.json`, one or more
`*.safetensors` shards, `tokenizer.json` (the `tokenizers` library's format) and optionally
`tokenizer_config.json` (special tokens, the chat template) and `generation_config.json` (EOS
ids). Nothing is downloaded: the folder must be on disk. Random weights stay the default
everywhere else, since timing does not depend on values.
"""

from __future__ import annotations

import itertools
import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dualpace_hw.executors.model import ModelWeights
from dualpace_sim.costs.shapes import ModelShape


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be used; the message names the file and the fix."""


# The chat format used when tokenizer_config.json has no chat_template: one line per message.
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")


class TextTokenizer:
    """Text <-> token ids through a `tokenizer.json`, with the checkpoint's special tokens."""

    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - the library raises bare Exceptions
            raise CheckpointError(f"{path}: not a tokenizers tokenizer.json ({e}); save one "
                                  "with Tokenizer.save or transformers' save_pretrained") from None
        self.chat_template = config.get("chat_template") or PLAIN_CHAT_TEMPLATE
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self.tok.token_to_id(text)

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of `text`; `special` adds what the tokenizer's post-processor adds (BOS)."""
        return self.tok.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template rendered as transformers' apply_chat_template does, then encoded
        without adding special tokens again (the template writes them)."""
        import jinja2

        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
        text = env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=True, bos_token=self.bos_token or "",
            eos_token=self.eos_token or "")
        return self.encode(text, special=False)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json gives it: a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, list) else {int(value)}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


@dataclass
class Checkpoint:
    """What a served model needs from its folder (weights are read on demand: `weights`)."""

    path: Path
    shape: ModelShape
    tokenizer: TextTokenizer
    eos_ids: frozenset[int]  # generation stops at any of these (unless a request ignores EOS)

    def weights(self, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.bfloat16) -> ModelWeights:
        try:
            return ModelWeights.from_safetensors(self.shape, self.path, device, dtype)
        except KeyError as e:
            raise CheckpointError(f"{e.args[0]}; is it a Llama or Qwen3 checkpoint?") from None

    def matches(self, shape: ModelShape) -> list[str]:
        """The fields where `shape` (a scenario's model) differs from this checkpoint's."""
        names = ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim",
                 "intermediate_size", "vocab_size", "qk_norm", "tie_word_embeddings")
        return [f"{n} {getattr(shape, n)} != {getattr(self.shape, n)}" for n in names
                if getattr(shape, n) != getattr(self.shape, n)]


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint folder's config and tokenizer (CheckpointError names what is wrong)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a folder; --checkpoint takes a Hugging Face "
                              "checkpoint folder (config.json, *.safetensors, tokenizer.json)")
    for name, fix in (("config.json", "the model's config"),
                      ("tokenizer.json", "save the tokenizer with the tokenizers library")):
        if not (path / name).is_file():
            raise CheckpointError(f"{path}: no {name} ({fix})")
    if not any(path.glob("*.safetensors")):
        raise CheckpointError(f"{path}: no *.safetensors shards (convert .bin weights with "
                              "safetensors first)")
    config = _read_json(path / "config.json")
    try:
        shape = ModelShape.from_hf_config(config, name=path.name)
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"{path / 'config.json'}: {e}") from None
    tok_config = (_read_json(path / "tokenizer_config.json")
                  if (path / "tokenizer_config.json").is_file() else {})
    tokenizer = TextTokenizer(path / "tokenizer.json", tok_config)
    if tokenizer.vocab_size > shape.vocab_size:
        raise CheckpointError(f"{path / 'tokenizer.json'}: {tokenizer.vocab_size} tokens, but "
                              f"config.json's vocab_size is {shape.vocab_size}")
    eos = _ids(config.get("eos_token_id"))
    gen = path / "generation_config.json"
    if gen.is_file():
        eos |= _ids(_read_json(gen).get("eos_token_id"))
    named = tokenizer.token_id(tokenizer.eos_token)
    if named is not None:
        eos.add(named)
    return Checkpoint(path, shape, tokenizer, frozenset(eos))


# What `train_tokenizer` learns its merges from: any text will do, the weights are random.
TOKENIZER_CORPUS = (
    "the quick brown fox jumps over the lazy dog. a paged kv cache holds the keys and values "
    "of every request; the cpu engine decodes while the gpu engine prefills new prompts, and "
    "dense assist runs the post-attention stages on the gpu. hello world, how are you today?"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def train_tokenizer(out: Path, vocab_size: int, corpus: list[str] | None = None) -> dict[str, int]:
    """A byte-level BPE tokenizer (BOS added to every text) trained with the `tokenizers`
    library, saved as out/tokenizer.json with a tokenizer_config.json (special tokens, a chat
    template). Returns the special tokens' ids. A vocabulary too small for all 256 bytes (the
    tiny test models') keeps only the corpus' bytes: other text encodes to nothing."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
                                  if vocab_size >= 2 * 256 else [],
                                  show_progress=False)
    tok.train_from_iterator(corpus or [TOKENIZER_CORPUS] * 20, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def hf_config(shape: ModelShape, bos: int, eos: int) -> dict[str, Any]:
    """The config.json of `shape` as Hugging Face writes it for Llama and Qwen3."""
    config: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM" if shape.qk_norm else "LlamaForCausalLM"],
        "model_type": "qwen3" if shape.qk_norm else "llama",
        "num_hidden_layers": shape.n_layers, "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.n_heads, "num_key_value_heads": shape.n_kv_heads,
        "head_dim": shape.head_dim, "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size, "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta, "tie_word_embeddings": shape.tie_word_embeddings,
        "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": bos,
        "eos_token_id": eos, "max_position_embeddings": 131072,
    }
    if shape.rope_scaling_factor is not None:
        config["rope_scaling"] = {
            "rope_type": "llama3", "factor": shape.rope_scaling_factor,
            "low_freq_factor": shape.rope_low_freq_factor,
            "high_freq_factor": shape.rope_high_freq_factor,
            "original_max_position_embeddings": shape.rope_original_max_position}
    return config


def hf_tensors(shape: ModelShape, weights: ModelWeights) -> dict[str, torch.Tensor]:
    """`weights` under the checkpoint names `ModelWeights.from_safetensors` reads (the fused
    projections split again)."""
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": weights.embed,
                                  "model.norm.weight": weights.final_norm}
    if not shape.tie_word_embeddings:
        t["lm_head.weight"] = weights.lm_head.weight
    for n, lw in enumerate(weights.layers):
        p, a = f"model.layers.{n}.", f"model.layers.{n}.self_attn."
        q, k, v = lw.qkv.weight.split([shape.q_dim, shape.kv_dim, shape.kv_dim])
        gate, up = lw.gate_up.weight.chunk(2)
        t |= {a + "q_proj.weight": q, a + "k_proj.weight": k, a + "v_proj.weight": v,
              a + "o_proj.weight": lw.o.weight, p + "mlp.gate_proj.weight": gate,
              p + "mlp.up_proj.weight": up, p + "mlp.down_proj.weight": lw.down.weight,
              p + "input_layernorm.weight": lw.input_norm,
              p + "post_attention_layernorm.weight": lw.post_norm}
        if lw.q_norm is not None:
            t |= {a + "q_norm.weight": lw.q_norm, a + "k_norm.weight": lw.k_norm}
    return {name: x.detach().to("cpu").contiguous() for name, x in t.items()}


def fill_vocabulary(path: Path, vocab_size: int) -> None:
    """Give the tokenizer at `path` (a byte-level BPE) `vocab_size` ids by adding filler words
    (" aaaa", " aaab", ...) past its trained ones. No merge produces them, so text encodes as
    before, but every id a random model samples decodes to text. Without them the ids the
    small tokenizer lacks decode to nothing, and a load tool counting the tokens it is
    streamed (guidellm) sees none: it times the first token at the last."""
    data = json.loads(path.read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    n = max(vocab.values()) + 1
    if vocab_size <= n:
        return
    space = "\u0120"  # the byte-level alphabet's stand-in for a space ("Ġ")
    words = ("".join(w) for w in itertools.product(string.ascii_lowercase, repeat=4))
    for word in words:
        if n == vocab_size:
            break
        if space + word not in vocab:
            vocab[space + word] = n
            n += 1
    path.write_text(json.dumps(data, ensure_ascii=False))


def write_random_checkpoint(shape: ModelShape, out: Path, seed: int = 0,
                            device: str | torch.device = "cpu",
                            tokenizer_vocab: int = 512) -> Path:
    """A checkpoint folder of `shape` with seeded random weights (drawn on `device`, bf16) and
    a small trained tokenizer: what `serve` needs where nothing can be downloaded. Its text is
    noise, but its timing is the model's (the tokenizer's few trained ids are all a prompt
    uses; the model samples any of its own, and those past the trained ones decode to filler
    words, see `fill_vocabulary`)."""
    from safetensors.torch import save_file

    ids = train_tokenizer(out, min(tokenizer_vocab, shape.vocab_size))
    fill_vocabulary(out / "tokenizer.json", shape.vocab_size)
    (out / "config.json").write_text(json.dumps(
        hf_config(shape, ids["<s>"], ids["</s>"]), indent=2) + "\n")
    weights = ModelWeights.random(shape, seed=seed, device=device)
    save_file(hf_tensors(shape, weights), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out
