"""Unit tests of the vLLM v1 baseline (BASELINES.md §B1-B2), one rule per test.

States are built by hand (block size 4) so every budget can be checked on paper. In comments,
`c` = computed tokens, `blocks` = HBM blocks held, `need` = blocks for c + n tokens.
"""

from __future__ import annotations

import itertools

from dualpace_sim.core import GpuResult, Owner, Request, RoundLog, blocks_for
from dualpace_sim.core.vllm import VllmConfig, VllmScheduler

BS = 4
_ids = itertools.count(1000)


def vllm(gpu: int, budget: int = 64, seqs: int = 16) -> VllmScheduler:
    return VllmScheduler(VllmConfig(gpu_kv_blocks=gpu, block_size=BS,
                                    max_num_batched_tokens=budget, max_num_seqs=seqs))


def req(prompt: int, max_tokens: int = 8, generated: int = 0) -> Request:
    """A request that already emitted `generated` tokens (at times -100, -99, ...)."""
    r = Request.create(next(_ids), -200.0, prompt, max_tokens, BS)
    rounds = RoundLog()
    for i in range(generated):
        r.emit(-100.0 + i, Owner.GPU, rounds)
    return r


def running(s: VllmScheduler, r: Request, computed: int | None = None) -> Request:
    """A running request holding the blocks of its computed tokens; by default it is decoding
    (every token but the last sampled one computed)."""
    r.computed = r.prompt_tokens + r.generated - 1 if computed is None else computed
    r.blocks = s.hbm.allocate(blocks_for(r.computed, BS))
    s.running.append(r)
    s.n_submitted += 1
    return r


def waiting(s: VllmScheduler, r: Request) -> Request:
    s.submit(r)
    return r


def step(s: VllmScheduler, t: float = 1.0):
    """schedule + apply at time `t`, checking the invariants after each."""
    plan = s.schedule(t)
    s.check_invariants()
    s.apply(plan, GpuResult(t))
    s.check_invariants()
    return plan


def chunks(plan):
    return [(c.req, c.start, c.tokens, c.last) for c in plan.prefills]


# ----------------------------------------------------------------------------- B1 step 2


def test_running_requests_first_in_admission_order_under_the_token_budget():
    """B1.2: RUNNING requests are scheduled first, in admission order, while the token budget
    lasts; a waiting request gets nothing once running requests used the budget."""
    s = vllm(gpu=64, budget=2)
    a, b, c = (running(s, req(4, generated=1)) for _ in range(3))
    w = waiting(s, req(4))
    plan = step(s)
    assert plan.decodes == [a, b] and chunks(plan) == []
    assert [r.generated for r in (a, b, c)] == [2, 2, 1]
    assert s.running == [a, b, c] and list(s.waiting) == [w]


def test_chunked_prefill_takes_the_remaining_budget_and_continues_next_step():
    """B1.3: a long prompt is cut to the budget left after the running requests and continues
    from where it stopped in the next step (as a running request)."""
    s = vllm(gpu=64, budget=6)
    a = running(s, req(4, generated=1))
    d = waiting(s, req(10))
    first = step(s, 1.0)
    assert first.decodes == [a] and chunks(first) == [(d, 0, 5, False)]
    assert s.running == [a, d] and d.computed == 5 and len(d.blocks) == 2
    second = step(s, 2.0)
    assert second.decodes == [a] and chunks(second) == [(d, 5, 5, True)]
    assert d.computed == 10 and d.token_times == [2.0]


def test_partial_chunk_emits_no_token():
    """B1.5: a token is sampled only by the chunk that completes the prompt."""
    s = vllm(gpu=64, budget=4)
    d = waiting(s, req(10, max_tokens=3))
    assert chunks(step(s, 1.0)) == [(d, 0, 4, False)] and d.generated == 0
    assert chunks(step(s, 2.0)) == [(d, 4, 4, False)] and d.generated == 0
    assert chunks(step(s, 3.0)) == [(d, 8, 2, True)] and d.token_times == [3.0]


def test_max_num_seqs_caps_admission():
    """B1.3: no waiting request is admitted once `len(running) == max_num_seqs`."""
    s = vllm(gpu=64, budget=64, seqs=2)
    a = running(s, req(4, generated=1))
    b = waiting(s, req(4))
    c = waiting(s, req(4))
    plan = step(s)
    assert plan.decodes == [a] and chunks(plan) == [(b, 0, 4, True)]
    assert s.running == [a, b] and list(s.waiting) == [c]


def test_out_of_blocks_preempts_the_newest_running_request_and_admits_nothing():
    """B1.2/B1.3: when a running request cannot allocate, the tail of `running` (newest) is
    preempted by recompute: blocks freed, computed = 0, put at the HEAD of waiting; and a step
    that preempted admits no waiting request (even one that would now fit)."""
    s = vllm(gpu=5, budget=4)
    a = running(s, req(8, generated=1))  # c 8, 2 blocks; 9 tokens need 3 blocks
    b = running(s, req(3, generated=1))  # c 3, 1 block; 4 tokens still 1 block
    c = running(s, req(7, generated=1))  # c 7, 2 blocks (tail); HBM full
    w = waiting(s, req(2))
    plan = step(s)
    assert plan.decodes == [a, b] and chunks(plan) == []
    assert s.running == [a, b] and list(s.waiting) == [c, w]
    assert c.blocks == [] and c.computed == 0 and s.preemptions == 1
    assert [kind for _, kind in c.migrations] == ["preempt_recompute"]
    assert c.generated == 1  # the emitted token is kept
    # One block is free and c's next chunk (budget 2 -> 1 block) would fit: nothing admitted.
    assert s.hbm.free == 1


def test_tail_that_cannot_allocate_preempts_itself_and_the_running_loop_stops():
    """B1.2: a request that is itself the tail and cannot allocate is the victim; allocation
    is not retried, it is not scheduled, nothing earlier is preempted, nothing is admitted."""
    s = vllm(gpu=3, budget=8)
    a = running(s, req(3, generated=1))  # c 3, 1 block; 4 tokens still 1 block
    b = running(s, req(8, generated=1))  # c 8, 2 blocks; 9 tokens need 3: none free
    w = waiting(s, req(1))
    plan = step(s)
    assert plan.decodes == [a] and chunks(plan) == []
    assert s.running == [a] and list(s.waiting) == [b, w]
    assert b.blocks == [] and b.computed == 0 and s.preemptions == 1
    assert a.generated == 2 and b.generated == 1 and w.generated == 0


def test_preempted_request_recomputes_prompt_and_emitted_tokens_then_continues():
    """B1.3 (resumed request): n = num_tokens - computed covers the prompt AND every output
    token already emitted; it is chunked like a prompt, and the next token is sampled only
    when the request has caught up. Nothing already emitted is emitted again."""
    s = vllm(gpu=64, budget=5)
    r = waiting(s, req(6, max_tokens=6, generated=3))  # preempted: c 0, 9 tokens so far
    before = list(r.token_times)
    assert chunks(step(s, 1.0)) == [(r, 0, 5, False)] and r.generated == 3
    assert chunks(step(s, 2.0)) == [(r, 5, 4, True)] and r.generated == 4
    assert step(s, 3.0).decodes == [r]
    assert step(s, 4.0).decodes == [r]
    assert r.finished and r.generated == r.max_tokens == 6
    assert r.token_times == before + [2.0, 3.0, 4.0]
    assert s.running == [] and s.finished == [r] and s.hbm.used == 0
    # With room in the budget, prompt + generated tokens are recomputed in one chunk.
    s = vllm(gpu=64, budget=64)
    r = waiting(s, req(6, max_tokens=6, generated=3))
    assert chunks(step(s, 1.0)) == [(r, 0, 9, True)] and r.generated == 4


def test_preemption_end_to_end_never_reemits_tokens():
    """B1.2-B1.5 together: under HBM pressure the newest request is preempted, recomputes
    prompt + generated tokens in one chunk, and both requests end with exactly max_tokens
    tokens; tokens emitted before the preemption are kept as they were."""
    s = vllm(gpu=4, budget=16)
    a = waiting(s, req(4, max_tokens=8))
    b = waiting(s, req(4, max_tokens=8))
    t = 0.0
    kept = None
    resumed = []
    while len(s.finished) < 2:
        t += 1.0
        assert t < 100
        plan = step(s, t)
        if kept is None and b.migrations:
            kept = list(b.token_times)
        resumed += [c for c in plan.prefills if c.req is b and b.migrations and c.start == 0]
    assert kept and s.preemptions >= 1
    assert [(c.start, c.tokens, c.last) for c in resumed][:1] == [(0, 4 + len(kept), True)]
    for r in (a, b):
        assert r.generated == r.max_tokens == 8
        assert all(x < y for x, y in itertools.pairwise(r.token_times))
    assert b.token_times[:len(kept)] == kept
    assert s.hbm.used == 0


# ----------------------------------------------------------------------------- B1 step 3


def test_waiting_admission_is_strict_fcfs_head_of_line():
    """B1.3: a waiting head that cannot allocate its chunk blocks every request behind it."""
    s = vllm(gpu=3, budget=16)
    h = waiting(s, req(16))  # chunk 16 -> 4 blocks > 3
    small = waiting(s, req(2))  # 1 block would fit
    plan = step(s)
    assert chunks(plan) == [] and plan.decodes == []
    assert s.running == [] and list(s.waiting) == [h, small] and s.hbm.used == 0


# ----------------------------------------------------------------------------- B1 step 5


def test_finished_requests_release_their_blocks():
    """B1.5: a request that reaches max_tokens leaves `running` and frees its HBM blocks."""
    s = vllm(gpu=8)
    a = running(s, req(4, max_tokens=2, generated=1))  # c 4, 1 block; needs a 2nd this step
    b = running(s, req(4, max_tokens=8, generated=1))
    step(s, 1.0)
    assert a.finished and a.blocks == [] and s.finished == [a]
    assert s.running == [b] and s.hbm.used == len(b.blocks) == 2
