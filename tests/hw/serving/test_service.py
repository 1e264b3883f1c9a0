"""The engine service over the real runtime with a tiny checkpoint (no HTTP): requests
submitted while it runs get transformers' tokens, greedy or seeded-sampled, on DualPace (every
Dense Assist route, tokens from both engines) and vLLM; EOS, stop strings and cancelling end a
request in the core; the run's records and journal are the ones `run` writes."""

from __future__ import annotations

import asyncio

import pytest
import torch

from dualpace_hw.executors.sampling import SamplingParams
from dualpace_hw.serving.serve import build_runtime, open_checkpoint, served_scenario
from dualpace_hw.serving.service import EngineService, held_back
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.core import Owner
from dualpace_sim.results.replay import replay
from tests.hw.checkpoints import make_checkpoint, reference_model, reference_tokens, tiny_scenario

pytest.importorskip("transformers", reason="the reference comparison needs the serve extra")

TEXTS = ["the quick brown fox", "a paged kv cache holds the keys and values of every",
         "hello world", "dense assist runs the post attention stages on the gpu engine while"]
N = 12


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("llama"), "llama")
    return path, reference_model(path)


def service(tmp_path, ck_path, policy: str = "dualpace", **scheduler) -> EngineService:
    loaded = load_scenario(tiny_scenario(tmp_path / "s.yaml", ck_path, [policy], **scheduler))
    ck = open_checkpoint(ck_path, loaded)
    rt = build_runtime(loaded, policy, "cpu", None, dtype=torch.float32, checkpoint=ck, specs=[])
    svc = EngineService(rt, ck.tokenizer, ck.eos_ids, max_rows=8, max_context=512)
    svc.start()
    return svc


async def collect(svc: EngineService, gens) -> list[tuple[list[int], str, str]]:
    """Every generation's token ids, text and finish reason, the pump running meanwhile."""
    pump = asyncio.create_task(svc.pump())
    out = []
    try:
        for g in gens:
            ids, text = [], ""
            while True:
                d = await asyncio.wait_for(g.queue.get(), 60)
                ids += d.token_ids
                text += d.text
                if d.finish_reason:
                    out.append((ids, text, d.finish_reason))
                    break
    finally:
        pump.cancel()
    return out


def run(svc: EngineService, prompts, sampling=None, stop=(), ignore_eos=True, n=N):
    async def main():
        gens = [svc.submit(p, n, list(stop), ignore_eos, s)
                for p, s in zip(prompts, sampling or [SamplingParams()] * len(prompts),
                                strict=True)]
        return await collect(svc, gens)
    return asyncio.run(main())


@pytest.mark.parametrize("route", [(0, 0), (8, 4), (2, 1)],
                         ids=["fused-assist", "full-cpu", "split-final"])
def test_served_requests_get_the_reference_tokens_greedy_and_sampled(tmp_path, llama, route):
    ck_path, ref = llama
    # 4 HBM blocks: a few requests decode on the GPU, the rest go Prefill-to-CPU
    svc = service(tmp_path, ck_path, route_p=route[0], route_f=route[1], gpu_kv_blocks=4)
    try:
        tok = svc.tokenizer
        prompts = [tok.encode(t) for t in TEXTS] * 2
        params = [SamplingParams()] * 4 + [SamplingParams(0.8, 0.9, 40, seed=7 + i)
                                           for i in range(4)]
        got = run(svc, prompts, params)
    finally:
        requests = svc.close()
    for (ids, text, reason), prompt, p in zip(got, prompts, params, strict=True):
        assert reason == "length"
        assert ids == reference_tokens(ref, prompt, N, None if p.greedy else p)
        assert text == tok.decode(ids)
    assert len({tuple(g[0]) for g in got[4:]}) > 1
    owners = b"".join(bytes(r.token_owners) for r in requests)
    assert Owner.CPU in owners and Owner.GPU in owners, "both engines decoded"
    rt = svc.runtime
    if route != (8, 4):
        assert rt.stats.assist_calls > 0
    rt.state.check_invariants()
    assert rt.state.hbm.used == rt.state.host.used == 0 and not rt.cpu_engine.alive


def test_vllm_serves_the_reference_tokens_and_its_journal_replays(tmp_path, llama):
    ck_path, ref = llama
    svc = service(tmp_path, ck_path, "vllm")
    try:
        prompts = [svc.tokenizer.encode(t) for t in TEXTS]
        got = run(svc, prompts)
    finally:
        svc.close()
    for (ids, _, _), prompt in zip(got, prompts, strict=True):
        assert ids == reference_tokens(ref, prompt, N)
    check_replay(tmp_path, svc, "vllm")


def test_eos_stop_strings_and_cancelling_end_requests_in_the_core(tmp_path, llama):
    ck_path, ref = llama
    svc = service(tmp_path, ck_path)
    tok = svc.tokenizer
    prompt = tok.encode(TEXTS[1])
    full = reference_tokens(ref, prompt, N)
    text = tok.decode(full)
    stop = text[len(text) // 2: len(text) // 2 + 2]
    eos = full[3]  # pretend the fourth token is EOS
    try:
        svc.eos_ids = frozenset({eos})
        (ids, got_text, reason), = run(svc, [prompt], ignore_eos=False)
        assert reason == "stop" and ids == full[: full.index(eos) + 1]
        svc.eos_ids = frozenset()
        (ids, got_text, reason), = run(svc, [prompt], stop=[stop])
        assert reason == "stop" and got_text == text[: text.find(stop)]

        async def cancelled():
            gen = svc.submit(prompt, 200, [], True, SamplingParams())
            pump = asyncio.create_task(svc.pump())
            first = await asyncio.wait_for(gen.queue.get(), 60)
            svc.cancel(gen)
            pump.cancel()
            return gen, first
        gen, first = asyncio.run(cancelled())
        assert gen.finish_reason == "abort" and first.token_ids
    finally:
        requests = svc.close()
    # Stopped and cancelled requests end in the core one token after the pump drops their cap
    # (finish_early), before their own max_tokens. How far the pump is behind the engine
    # depends on the machine's load (on a busy 2-core machine, two tokens past an EOS).
    assert all(r.finished and r.generated == r.max_tokens for r in requests)
    assert requests[0].max_tokens < N and requests[2].max_tokens < 200
    rt = svc.runtime
    rt.state.check_invariants()
    assert rt.state.hbm.used == rt.state.host.used == 0
    assert svc.finished == {"stop": 2, "length": 0, "abort": 1}
    metrics = svc.metrics()
    assert 'dualpace_kv_blocks_capacity{pool="host"} 400' in metrics
    assert "dualpace_time_to_first_token_seconds_count 3" in metrics


def check_replay(tmp_path, svc: EngineService, policy: str) -> None:
    """The core's decisions are reproduced from the journal by the scenario of the arrivals
    the server saw (requests that ran to their max_tokens)."""
    out = tmp_path / "out"
    loaded = load_scenario(served_scenario(tmp_path / "s.yaml", out, svc.requests_done,
                                           policy))
    assert len(loaded.requests) == len(svc.requests_done)
    report = replay(svc.runtime.journal, loaded, policy)
    assert report.ok and report.calls == len(svc.runtime.journal.entries), report.line()


def test_a_served_dualpace_journal_replays_exactly(tmp_path, llama):
    ck_path, _ = llama
    svc = service(tmp_path, ck_path)
    try:
        run(svc, [svc.tokenizer.encode(t) for t in TEXTS])
    finally:
        svc.close()
    check_replay(tmp_path, svc, "dualpace")


def testheld_back_text_waits_for_a_stop_string_or_a_whole_character():
    assert held_back("hello wo", ["world"]) == 2
    assert held_back("hello", ["xyz"]) == 0
    assert held_back("abc\ufffd\ufffd", []) == 2  # two bytes of a three-byte character
