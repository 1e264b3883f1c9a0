"""Unit tests of requests: finish-peak footprint, next-token blocks, completion."""

from __future__ import annotations

import pytest

from dualpace_sim.core import Owner, Request, RoundLog, blocks_for
from dualpace_sim.core.request import emit_batch


def test_blocks_for_rounds_up():
    """KV blocks needed for n tokens are ceil(n / block_size)."""
    assert [blocks_for(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "bs", "peak"),
    [(16, 16, 16, 2), (17, 16, 16, 3), (1, 1, 16, 1), (100, 28, 16, 8), (100, 29, 16, 9)],
)
def test_finish_peak_formula(prompt, max_tokens, bs, peak):
    """DESIGN §3: b̂_r = ceil((prompt + max_tokens) / block_size)."""
    assert Request.create(0, 0.0, prompt, max_tokens, bs).peak_blocks == peak


@pytest.mark.parametrize(("prompt", "max_tokens"), [(0, 4), (4, 0), (-1, 4)])
def test_create_rejects_empty_prompt_or_budget(prompt, max_tokens):
    """A request needs at least one prompt token and one output token."""
    with pytest.raises(ValueError):
        Request.create(0, 0.0, prompt, max_tokens, 16)


def test_next_blocks_covers_the_next_kv_append():
    """next_blocks is what the next decode step's KV append (prompt + generated tokens) needs
    beyond the blocks held: 1 at a block boundary, else 0."""
    r = Request.create(0, 0.0, 16, 8, 16)
    r.blocks = [0]
    r.emit(1.0, Owner.GPU, RoundLog())  # KV after the next step: 17 tokens
    assert r.next_blocks(16) == 1
    r.blocks = [0, 1]
    assert r.next_blocks(16) == 0
    r = Request.create(1, 0.0, 15, 8, 16)
    r.blocks = [0]
    r.emit(1.0, Owner.GPU, RoundLog())  # 16 tokens still fit one block
    assert r.next_blocks(16) == 0
    assert r.next_blocks(4) == 3  # a tier with smaller blocks: 4 needed, 1 held


def test_finished_after_max_tokens_and_owner_record():
    """A request is finished once it emitted max_tokens; every token records its owner."""
    r, rounds = Request.create(0, 0.0, 4, 2, 16), RoundLog()
    r.emit(1.0, Owner.GPU, rounds)
    assert not r.finished and r.generated == 1
    r.emit(2.0, Owner.CPU, rounds)
    assert r.finished and r.generated == 2
    assert list(r.token_owners) == [Owner.GPU, Owner.CPU]
    assert r.kv_tokens_after_step == 6


def test_emit_batch_records_one_token_each_and_says_whether_one_finished():
    """emit_batch is Request.emit over a round's requests; True once any reaches max_tokens."""
    a, b = Request.create(0, 0.0, 4, 2, 4), Request.create(1, 0.0, 4, 3, 4)
    rounds = RoundLog()
    assert emit_batch([a, b], 1.0, Owner.CPU, rounds) is False
    assert emit_batch([a, b], 2.0, Owner.GPU, rounds) is True  # a reached its 2 tokens
    assert (a.token_times, list(a.token_owners)) == ([1.0, 2.0], [Owner.CPU, Owner.GPU])
    assert b.generated == 2 and not b.finished
    assert emit_batch([], 3.0, Owner.GPU, rounds) is False
    assert list(rounds.times[Owner.GPU]) == [2.0]  # an empty batch books no round


def test_tokens_are_one_time_per_round_and_spans_of_rounds():
    """A round books one time however many requests it serves; each request keeps a span per
    run of consecutive rounds of one engine, and its token times are read off them."""
    a, b, c = (Request.create(i, 0.0, 4, 9, 4) for i in range(3))
    rounds = RoundLog()
    emit_batch([a, b], 1.0, Owner.GPU, rounds)
    emit_batch([c], 1.0, Owner.GPU, rounds)  # a round's finishing prefill: the same round
    emit_batch([a, c], 2.0, Owner.GPU, rounds)
    emit_batch([b], 2.5, Owner.CPU, rounds)
    emit_batch([a, b], 3.0, Owner.GPU, rounds)  # b back on the GPU: a new span
    emit_batch([a], 4.0, Owner.GPU, rounds)
    emit_batch([a], 4.0, Owner.GPU, rounds)  # twice in one round: a new span at that round
    gpu, cpu = rounds.times
    assert (list(gpu), list(cpu)) == ([1.0, 2.0, 3.0, 4.0], [2.5])
    assert a.spans == [Owner.GPU, gpu, 0, 4, Owner.GPU, gpu, 3, 4]
    assert a.token_times == [1.0, 2.0, 3.0, 4.0, 4.0] and a.generated == 5
    assert b.spans == [Owner.GPU, gpu, 0, 1, Owner.CPU, cpu, 0, 1, Owner.GPU, gpu, 2, 3]
    assert (b.token_times, b.token_owners) == ([1.0, 2.5, 3.0], bytes([0, 1, 0]))
    assert c.token_times == [1.0, 2.0] and c.spans == [Owner.GPU, gpu, 0, 2]
