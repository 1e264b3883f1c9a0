"""A Hugging Face checkpoint folder: its shape, its weights and its tokenizer.

`--checkpoint DIR` names a folder as the hub lays it out: `config.json`, one or more
`*.safetensors` shards, `tokenizer.json` (the `tokenizers` library's format) and optionally
`tokenizer_config.json` (special tokens, the chat template) and `generation_config.json` (EOS
ids). Nothing is downloaded: the folder must be on disk. Random weights stay the default
everywhere else, since timing does not depend on values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dualpace_sim.costs.shapes import ModelShape

from .model import ModelWeights


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
