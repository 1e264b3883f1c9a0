"""Real checkpoints against the `transformers` implementation of the same checkpoints: a tiny
Llama and a tiny Qwen3 (random weights, safetensors, a BPE tokenizer trained here) loaded by
`load_checkpoint`, whose logits must match at every position and whose greedy tokens must
match on both engines' paths: the GPU executor (on the CPU device) alone, and Prefill-to-CPU
followed by CPU executor decode steps for every Dense Assist route."""

from __future__ import annotations

import json

import pytest
import torch

from dualpace_hw.executors.checkpoint import CheckpointError, load_checkpoint
from dualpace_hw.executors.cpu_executor import CpuExecutor, CpuStep
from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model
from dualpace_hw.executors.packed import pack_model
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_sim.core.plans import GpuPlan, PrefillChunk
from dualpace_sim.core.request import Owner, Request, RoundLog, blocks_for
from dualpace_sim.core.routing import Route
from tests.hw.checkpoints import make_checkpoint, reference_model, reference_tokens
from tests.hw.reference import dense_logits

pytest.importorskip("transformers", reason="the reference comparison needs the serve extra")

BS = 4
STEPS = 8
PROMPTS = ["the quick brown fox", "a paged kv cache holds the keys and values of"]
FAMILIES = ["llama", "qwen3"]


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    return load_checkpoint(path), reference_model(path)


def reference_greedy(ref, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation and its logits at every position of the result."""
    tokens = reference_tokens(ref, prompt, n)
    with torch.no_grad():
        logits = ref(torch.tensor([prompt + tokens[:-1]])).logits[0]
    return tokens, logits


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)],
                         ids=["float32", "bf16"])
def test_logits_match_transformers_at_every_position(checkpoint, dtype, tol):
    """Against transformers in float32: bf16 weights and activations (8 significant bits)
    through two layers land within a few percent, float32 within rounding."""
    ck, ref = checkpoint
    model = Model(ck.shape, ck.weights(dtype=dtype))
    for text in PROMPTS:
        ids = ck.tokenizer.encode(text)
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0]
        got = dense_logits(model, ids).float()
        assert got.shape == want.shape
        for pos in range(len(ids)):
            assert rel_err(got[pos], want[pos]) < tol, (text, pos)


class Engines:
    """A GPU executor on the CPU device and a CPU executor over one host pool, driven as the
    runtime drives them (the core's block ids, one request per prompt)."""

    def __init__(self, ck, prompts: list[list[int]]) -> None:
        self.model = Model(ck.shape, ck.weights(dtype=torch.float32))
        self.tokens = TokenStore()
        self.pool = PagedKVPool(ck.shape, 64, BS, dtype=torch.float32)
        self.host = PagedKVPool(ck.shape, 64, BS, dtype=torch.float32)
        self.gpu = GpuExecutor(self.model, self.pool, self.tokens, self.host)
        self.rounds = RoundLog()  # the rounds the requests' tokens are booked in
        self.reqs = []
        for i, p in enumerate(prompts):
            r = Request.create(i, 0.0, len(p), STEPS, BS)
            r.blocks = list(range(i * 16, i * 16 + blocks_for(len(p) + STEPS, BS)))
            self.tokens.add(i, p)
            self.reqs.append(r)

    def prefill(self, to_cpu: bool) -> list[torch.Tensor]:
        plan = GpuPlan(prefills=[PrefillChunk(r, 0, r.prompt_tokens, to_cpu, True)
                                 for r in self.reqs])
        out = self.gpu.execute(plan)
        assert self.gpu.copies_done()
        self._apply(out)
        return list(self.gpu.last_forward.logits)

    def gpu_decode(self) -> list[torch.Tensor]:
        self._apply(self.gpu.execute(GpuPlan(decodes=list(self.reqs))))
        return list(self.gpu.last_forward.logits)

    def cpu_decode(self, cpu: CpuExecutor, route: Route) -> None:
        step = CpuStep(route, [], [], [], [])
        for r in self.reqs:
            pos = r.prompt_tokens + r.generated - 1
            step.req_ids.append(r.req_id)
            step.token_ids.append(self.tokens.last(r.req_id))
            step.positions.append(pos)
            step.tables.append(r.blocks[: pos // BS + 1])
        self._apply(cpu.run(step))

    def _apply(self, out: dict[int, int]) -> None:
        for r in self.reqs:
            r.emit(0.0, Owner.GPU, self.rounds)
            self.tokens.append(r.req_id, out[r.req_id])

    def generated(self) -> list[list[int]]:
        return [self.tokens.generated(r.req_id) for r in self.reqs]


def test_gpu_executor_greedy_tokens_and_logits_match_transformers(checkpoint):
    ck, ref = checkpoint
    prompts = [ck.tokenizer.encode(t) for t in PROMPTS]
    eng = Engines(ck, prompts)
    logits = [[lg] for lg in eng.prefill(to_cpu=False)]
    for _ in range(STEPS - 1):
        for i, lg in enumerate(eng.gpu_decode()):
            logits[i].append(lg)
    for prompt, got_tokens, got_logits in zip(prompts, eng.generated(), logits, strict=True):
        want_tokens, want_logits = reference_greedy(ref, prompt, STEPS)
        assert got_tokens == want_tokens
        assert len(set(want_tokens)) > 1, "a continuation that tells tokens apart"
        for j, lg in enumerate(got_logits):
            assert rel_err(lg, want_logits[len(prompt) - 1 + j]) < 1e-5


@pytest.mark.parametrize("route", [Route.FULL_CPU, Route.SPLIT_FINAL, Route.FUSED_ASSIST],
                         ids=lambda r: r.value)
def test_cpu_engine_greedy_tokens_match_transformers_on_every_route(checkpoint, route):
    """Prefill-to-CPU on the GPU executor, then CPU decode steps on the packed CPU model as the
    CPU engine runs it, Dense Assist served by the GPU executor."""
    ck, ref = checkpoint
    prompts = [ck.tokenizer.encode(t) for t in PROMPTS]
    eng = Engines(ck, prompts)
    eng.prefill(to_cpu=True)
    cpu = CpuExecutor(pack_model(eng.model), eng.host, eng.tokens, assist=eng.gpu)
    for _ in range(STEPS - 1):
        eng.cpu_decode(cpu, route)
    for prompt, got in zip(prompts, eng.generated(), strict=True):
        assert got == reference_greedy(ref, prompt, STEPS)[0]


def test_tokenizer_round_trips_and_renders_the_chat_template(checkpoint):
    ck, _ = checkpoint
    tok = ck.tokenizer
    ids = tok.encode("hello world")
    assert ids[0] == tok.token_id("<s>") and tok.decode(ids) == "hello world"
    chat = tok.chat_prompt([{"role": "user", "content": "hi"}])
    assert chat[0] == tok.token_id("<s>") and chat[-1] == tok.token_id("<|assistant|>")
    assert ck.eos_ids == {tok.token_id("</s>")}


@pytest.mark.parametrize("remove, message", [
    ("tokenizer.json", "no tokenizer.json"),
    ("config.json", "no config.json"),
    ("model.safetensors", "no \\*.safetensors"),
])
def test_an_incomplete_checkpoint_folder_is_refused_naming_the_file(tmp_path, remove, message):
    path = make_checkpoint(tmp_path / "ck", "llama")
    (path / remove).unlink()
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_a_checkpoint_of_another_architecture_names_the_missing_tensor(tmp_path):
    path = make_checkpoint(tmp_path / "ck", "llama")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    ck = load_checkpoint(path)
    with pytest.raises(CheckpointError, match="model.layers.2.*missing"):
        ck.weights()
    assert ck.matches(ck.shape) == []


def test_a_random_checkpoint_loads_as_the_shape_it_was_written_for(tmp_path):
    """`dualpace-hw random-checkpoint`: config.json, safetensors and a tokenizer that
    `load_checkpoint` reads back as the same shape and weights."""
    from typer.testing import CliRunner

    from dualpace_hw.cli import app
    from dualpace_hw.executors.model import ModelWeights
    from dualpace_sim.costs.shapes import ModelShape

    for name in ("tiny-llama", "tiny-qwen3"):
        out = tmp_path / name
        result = CliRunner().invoke(app, ["random-checkpoint", "--model", name, "--out", str(out),
                                          "--seed", "3"])
        assert result.exit_code == 0, result.output
        shape = ModelShape.from_name(name)
        ck = load_checkpoint(out)
        assert not ck.matches(shape) and ck.shape.rope_scaling_factor == shape.rope_scaling_factor
        got, want = ck.weights(), ModelWeights.random(shape, seed=3)
        for a, b in zip(got.tensors(), want.tensors(), strict=True):
            assert torch.equal(a, b)
        assert ck.eos_ids == {ck.tokenizer.token_id("</s>")}
    again = CliRunner().invoke(app, ["random-checkpoint", "--model", "tiny-llama", "--out",
                                     str(tmp_path / "tiny-llama")])
    assert again.exit_code == 2 and "not empty" in again.output


def test_a_filled_vocabulary_decodes_every_id_and_encodes_as_before(tmp_path):
    """`random-checkpoint`'s tokenizer: ids past the trained ones decode to filler words, so
    every token a random model samples streams text, and text still encodes with the
    trained merges only."""
    from tokenizers import Tokenizer

    from dualpace_hw.executors.checkpoint import fill_vocabulary, train_tokenizer

    train_tokenizer(tmp_path, 512)  # the default: all 256 bytes and some merges
    trained = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    n = trained.get_vocab_size()
    fill_vocabulary(tmp_path / "tokenizer.json", 2000)
    filled = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert 256 < n <= 512 and filled.get_vocab_size() == 2000
    text = "the gpu engine prefills while the cpu engine decodes, zzzz qqqq"
    assert filled.encode(text).ids == trained.encode(text).ids
    words = [filled.decode([i]) for i in range(n, 2000)]
    assert all(w.startswith(" ") and len(w) == 5 for w in words) and len(set(words)) == 2000 - n
    fill_vocabulary(tmp_path / "tokenizer.json", 1000)  # never shrinks
    assert Tokenizer.from_file(str(tmp_path / "tokenizer.json")).get_vocab_size() == 2000
