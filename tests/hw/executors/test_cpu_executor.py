"""PackedDense and the CPU executor: decode steps over a batch against the dense reference, for
every post-attention route, and the executor's own thread count and cores."""

from __future__ import annotations

import os
import threading

import pytest
import torch
import torch.nn.functional as F

from dualpace_hw.executors.cpu_executor import CpuExecutor, LocalAssist
from dualpace_hw.executors.model import Dense, Model, ModelWeights, greedy
from dualpace_hw.executors.packed import PackedDense, cpu_features, pack_model
from dualpace_hw.kernels.attention import prefill_attention
from dualpace_hw.kernels.cpu_attention import extension_available
from dualpace_hw.memory.kv import PagedKVPool, slot_mapping
from dualpace_sim.core.plans import CpuPlan
from dualpace_sim.core.request import Owner, Request, RoundLog
from dualpace_sim.core.routing import Route
from tests.hw.reference import dense_logits

BS = 4
PROMPTS = {11: [3, 17, 42, 5, 99, 7], 12: [250, 13], 13: [8, 64, 1, 2, 3, 4, 5, 6, 7, 9, 10]}
STEPS = 5


class Tokens:
    """The token store's interface as the executor uses it
    (dualpace_hw.memory.tokens.TokenStore)."""

    def __init__(self) -> None:
        self._ids: dict[int, list[int]] = {}

    def add(self, req_id: int, prompt_ids: list[int]) -> None:
        self._ids[req_id] = list(prompt_ids)

    def append(self, req_id: int, token: int) -> None:
        self._ids[req_id].append(int(token))

    def ids(self, req_id: int) -> list[int]:
        return self._ids[req_id]

    def last(self, req_id: int) -> int:
        return self._ids[req_id][-1]


# --------------------------------------------------------------------------- PackedDense
# (the kernel itself: test_dense_kernel.py)
def test_packed_dense_falls_back_with_a_reason():
    w = torch.randn(8, 4, dtype=torch.float64)
    d = PackedDense(w)
    assert not d.is_packed and "float64" in d.fallback_reason
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(d(x), F.linear(x, w))


def test_pack_model_replaces_every_projection_and_leaves_the_input_alone():
    shape = _shape("tiny-llama")
    model = Model(shape, ModelWeights.random(shape, seed=3))
    packed = pack_model(model)
    for lw, lp in zip(model.w.layers, packed.w.layers, strict=True):
        for name in ("qkv", "o", "gate_up", "down"):
            assert type(getattr(lw, name)) is Dense
            assert isinstance(getattr(lp, name), PackedDense)
        assert lp.input_norm is lw.input_norm
    assert isinstance(packed.w.lm_head, PackedDense) and packed.w.embed is model.w.embed
    # The packed bf16 model's logits follow the plain model's (bf16 rounding apart).
    toks = PROMPTS[11]
    ref = dense_logits(model, toks)
    got = dense_logits(packed, toks)
    scale = ref.abs().max()
    assert ((got - ref).abs().max() / scale) < 3e-2


def test_cpu_features_reports_the_flags():
    f = cpu_features()
    for key in ("amx_bf16", "avx512_bf16", "avx512f", "torch_cpu_capability", "mkldnn_bf16"):
        assert key in f
    assert f["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()


# --------------------------------------------------------------------------- CpuExecutor
def _shape(name):
    from dualpace_sim.costs.shapes import ModelShape

    return ModelShape.from_name(name)


def _prefill(model: Model, pool: PagedKVPool, r: Request, prompt: list[int]) -> int:
    """The prompt's K/V into the request's host blocks; returns its first (greedy) token."""
    n = len(prompt)
    h = model.pre_layer(torch.tensor(prompt))
    positions = torch.arange(n)
    slots = torch.tensor(slot_mapping(r.blocks, 0, n, BS))
    table = torch.tensor(r.blocks)
    for layer in range(model.n_layers):
        q, k, v = model.pre_attn(layer, h, positions)
        pool.write(layer, slots, k, v)
        kc, vc = pool.layer(layer)
        h = model.post_attn(layer, prefill_attention(q, kc, vc, table, 0).reshape(n, -1), h)
    return int(greedy(model.post_layer(h[-1:]))[0])


def _reference_tokens(model: Model, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation by full dense forwards over the whole sequence."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(dense_logits(model, seq)[-1].argmax()))
    return seq[len(prompt):]


def _run(model: Model, packed: Model, route: Route, assist, threads=None, cores=None):
    """Prefill every prompt, then STEPS CPU decode steps of the whole batch; tokens per req."""
    pool = PagedKVPool(model.shape, 64, BS, dtype=model.w.embed.dtype)
    free = torch.randperm(64, generator=torch.Generator().manual_seed(9)).tolist()
    store = Tokens()
    rounds = RoundLog()
    reqs = []
    for rid, prompt in PROMPTS.items():
        r = Request.create(rid, 0.0, len(prompt), STEPS + 1, BS)
        r.blocks = [free.pop() for _ in range(r.peak_blocks)]
        store.add(rid, prompt)
        store.append(rid, _prefill(model, pool, r, prompt))
        r.emit(0.0, Owner.GPU, rounds)
        reqs.append(r)
    ex = CpuExecutor(packed, pool, store, assist=assist, threads=threads, cores=cores)
    for step in range(STEPS):
        out = ex.execute(CpuPlan(batch=reqs, route=route))
        assert set(out) == set(PROMPTS)
        for r in reqs:  # what the runtime does after the core's apply
            store.append(r.req_id, out[r.req_id])
            r.emit(float(step + 1), Owner.CPU, rounds)
    return {rid: store.ids(rid)[len(p):] for rid, p in PROMPTS.items()}, ex


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_every_route_decodes_the_dense_references_greedy_tokens(name):
    shape = _shape(name)
    model = Model(shape, ModelWeights.random(shape, seed=5, dtype=torch.float32))
    packed = pack_model(model)
    want = {rid: _reference_tokens(model, p, STEPS + 1) for rid, p in PROMPTS.items()}
    got = {}
    for route in Route:
        assist = LocalAssist(model)  # the "GPU" side: the plain (unpacked) model
        got[route], _ = _run(model, packed, route, assist)
        assert got[route] == want, route
        calls = assist.calls
        if route == Route.FULL_CPU:
            assert calls == {"post_attn": 0, "post_layer": 0, "fused_final": 0}
        elif route == Route.SPLIT_FINAL:
            assert calls == {"post_attn": 0, "post_layer": STEPS, "fused_final": 0}
        else:
            assert calls == {"post_attn": STEPS * (shape.n_layers - 1), "post_layer": 0,
                             "fused_final": STEPS}


def test_bf16_routes_agree_with_each_other():
    shape = _shape("tiny-llama")
    model = Model(shape, ModelWeights.random(shape, seed=6))  # bf16
    packed = pack_model(model)
    got = {route: _run(model, packed, route, LocalAssist(packed))[0] for route in Route}
    assert got[Route.FULL_CPU] == got[Route.SPLIT_FINAL] == got[Route.FUSED_ASSIST]


def test_assist_routes_need_an_assist():
    shape = _shape("tiny-llama")
    model = Model(shape, ModelWeights.random(shape, seed=5, dtype=torch.float32))
    pool = PagedKVPool(shape, 8, BS, dtype=torch.float32)
    ex = CpuExecutor(model, pool, Tokens())
    r = Request.create(1, 0.0, 2, 2, BS)
    with pytest.raises(ValueError, match="Dense Assist"):
        ex.execute(CpuPlan(batch=[r], route=Route.SPLIT_FINAL))
    assert ex.execute(CpuPlan()) == {}


def test_thread_count_and_cores_are_the_executors_own():
    """The executor runs in its own thread here (its own process in the runtime): the thread
    count and core set apply there, and the calling test thread keeps its own."""
    shape = _shape("tiny-llama")
    model = Model(shape, ModelWeights.random(shape, seed=5, dtype=torch.float32))
    packed = pack_model(model)
    main_threads = torch.get_num_threads()
    main_cores = os.sched_getaffinity(0)
    core = min(main_cores)
    seen: dict[str, object] = {}

    def worker() -> None:
        try:
            tokens, ex = _run(model, packed, Route.FULL_CPU, None, threads=1, cores=[core])
            seen["tokens"] = tokens
            seen["torch_threads"] = torch.get_num_threads()
            seen["omp_threads"] = ex.effective_threads()
            seen["affinity"] = os.sched_getaffinity(0)
            seen["pinned"] = ex.pinned_threads
        except Exception as e:  # surfaced below
            seen["error"] = e

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    try:
        assert "error" not in seen, seen.get("error")
        assert seen["torch_threads"] == 1 and seen["omp_threads"] == 1
        assert seen["affinity"] == {core}
        if extension_available():
            assert seen["pinned"] == 1
        assert seen["tokens"] == {rid: _reference_tokens(model, p, STEPS + 1)
                                  for rid, p in PROMPTS.items()}
        assert os.sched_getaffinity(0) == main_cores
    finally:
        torch.set_num_threads(main_threads)


def test_executor_thread_count_without_cores():
    shape = _shape("tiny-llama")
    model = Model(shape, ModelWeights.random(shape, seed=5, dtype=torch.float32))
    pool = PagedKVPool(shape, 8, BS, dtype=torch.float32)
    before = torch.get_num_threads()
    try:
        ex = CpuExecutor(model, pool, Tokens(), threads=1)
        ex.configure_thread()
        assert torch.get_num_threads() == 1 and ex.effective_threads() == 1
    finally:
        torch.set_num_threads(before)
