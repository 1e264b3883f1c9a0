"""Unit tests of the NEO baseline (BASELINES.md §A1-A4, §D1), one rule per test.

States are built by hand (block size 16) with a linear predictor whose coefficients are
integers, so every overlap slack and rate below is exact and can be checked on paper.
Notation in comments: `ctx` = prompt + generated (NEO's seq_len, the KV after this step),
`need` = ceil(ctx / 16) (NEO's _get_block_needed), `held` = blocks held now,
`rem0/rem1` = NEO's remains[0]/remains[1], `s0/s1` = sub-batch widths.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from dualpace_sim.core import Owner, Request, RoundLog, blocks_for
from dualpace_sim.core.neo import NeoConfig, NeoPlan, NeoScheduler, SubBatch, layer_time

BS = 16
_ids = itertools.count(2000)


@dataclass
class LinearPredictor:
    """linr_T(s) = a + b*s, pref_T(L) = c*L, gdec_T(n, ctx) = d*ctx, cdec_T(n, ctx) = e*ctx."""

    a: float = 0.0
    b: float = 0.0
    c: float = 0.0
    d: float = 0.0
    e: float = 0.0
    lnch_T: float = 0.0

    def linr_T(self, width: int) -> float:
        return self.a + self.b * width

    def pref_T(self, prompt: int) -> float:
        return self.c * prompt

    def gdec_T(self, n: int, context: int) -> float:
        return self.d * context

    def cdec_T(self, n: int, context: int) -> float:
        return self.e * context


REJECT_CPU = LinearPredictor(a=1, lnch_T=1000)  # no CPU decode ever passes the overlap test


def neo(gpu: int, host: int = 1000, pred: LinearPredictor | None = None, **kw) -> NeoScheduler:
    config = NeoConfig(gpu_kv_blocks=gpu, host_kv_blocks=host, block_size=BS, **kw)
    return NeoScheduler(config, pred or LinearPredictor(a=1))


def req(prompt: int, max_tokens: int = 8, generated: int = 0) -> Request:
    """A request that already emitted `generated` tokens (at times -100, -99, ...)."""
    r = Request.create(next(_ids), -200.0, prompt, max_tokens, BS)
    rounds = RoundLog()
    for i in range(generated):
        r.emit(-100.0 + i, Owner.GPU, rounds)
    return r


def dec(ctx: int, max_tokens: int = 8) -> Request:
    """A decoding request (one token emitted) whose seq_len this step is `ctx`."""
    return req(ctx - 1, max_tokens, generated=1)


def _place(s: NeoScheduler, r: Request, owner: Owner) -> Request:
    pool, queue = (s.hbm, s.gpu_q) if owner == Owner.GPU else (s.host, s.cpu_q)
    r.blocks = pool.allocate(blocks_for(r.prompt_tokens + r.generated - 1, BS))
    r.owner = owner
    queue.append(r)
    if owner == Owner.CPU:
        s.cpu_q_blocks += blocks_for(r.kv_tokens_after_step, BS)
    else:
        s.count_gpu(r, 1)
    s.n_submitted += 1
    return r


def on_gpu(s: NeoScheduler, r: Request) -> Request:
    """A GPU decode holding the KV of prompt + generated - 1 tokens, at the gpu_q tail."""
    return _place(s, r, Owner.GPU)


def on_cpu(s: NeoScheduler, r: Request) -> Request:
    """A CPU-resident decode at the cpu_q tail."""
    return _place(s, r, Owner.CPU)


def waiting(s: NeoScheduler, r: Request) -> Request:
    s.submit(r)
    return r


def schedule(s: NeoScheduler, t: float = 1.0) -> NeoPlan:
    plan = s.schedule(t)
    s.check_invariants()
    return plan


def apply(s: NeoScheduler, plan: NeoPlan, t: float = 1.0) -> None:
    s.apply(plan, t)
    s.check_invariants()


def step(s: NeoScheduler, t: float = 1.0) -> NeoPlan:
    plan = schedule(s, t)
    apply(s, plan, t)
    return plan


def generated(*rs: Request) -> list[int]:
    return [r.generated for r in rs]


# ----------------------------------------------------------------------------- A2 step 2


def test_gpu_decodes_always_run():
    """A2.2: every GPU decode is in the iteration, without any admission test, even when the
    token budget has no room left for anything else."""
    s = neo(gpu=64, max_tokens_in_batch=3)
    g = [on_gpu(s, dec(17)) for _ in range(3)]
    p = waiting(s, req(16))  # 16 tokens > the 0 left after the three decodes
    plan = step(s)
    assert len(plan.batches) == 1 and plan.batches[0].gpu_decodes == g
    assert plan.batches[0].prefills == [] and list(s.waiting) == [p]
    assert generated(*g) == [2, 2, 2]


# ----------------------------------------------------------------------------- A2 step 3


def test_swap_out_from_the_tail_above_100_percent_victims_to_cpu_head_in_order():
    """A2.3: while Σ need(gpu_q) > GPU blocks, the TAIL of gpu_q is swapped out and
    appendleft-ed to cpu_q, so the victims sit at its head in their arrival order."""
    s = neo(gpu=10, pred=REJECT_CPU)
    a = on_gpu(s, dec(129))  # held 8, need 9
    b = on_gpu(s, dec(17))  # held 1, need 2
    c = on_gpu(s, dec(17))  # held 1, need 2: Σ need 13 > 10
    x = on_cpu(s, dec(17))
    plan = step(s)
    assert plan.swap_outs == [c, b] and plan.swap_out_blocks == 2 and plan.swap_ins == []
    assert s.gpu_q == [a] and list(s.cpu_q) == [b, c, x]
    assert b.owner == c.owner == Owner.CPU and s.host.used == 3 and s.hbm.used == 9
    assert plan.batches[0].gpu_decodes == [a] and generated(a, b, c) == [2, 1, 1]


def test_no_swap_out_at_exactly_100_percent():
    """A2.3: the swap-out threshold is strictly above 100% of the GPU blocks."""
    s = neo(gpu=9, pred=REJECT_CPU)
    a = on_gpu(s, dec(129))  # need 9 == 9
    plan = step(s)
    assert plan.swap_outs == [] and s.gpu_q == [a] and s.hbm.used == 9


def test_swap_out_when_gpu_decodes_overspend_the_budget():
    """A2.3: GPU decodes beyond max_batch_size overspend the budget and are swapped out from
    the tail even though their blocks fit."""
    s = neo(gpu=64, max_batch_size=2, pred=REJECT_CPU)
    a, b, c = (on_gpu(s, dec(17)) for _ in range(3))
    plan = step(s)
    assert plan.swap_outs == [c] and s.gpu_q == [a, b] and list(s.cpu_q) == [c]
    assert generated(a, b, c) == [2, 2, 1]


# ----------------------------------------------------------------------------- A2 step 4


def test_swap_in_from_the_head_only_while_within_95_percent():
    """A2.4: the head of cpu_q is swapped in while Σ need stays <= round(0.95 * GPU blocks),
    not up to 100%; swapped-in requests decode on the GPU this iteration."""
    s = neo(gpu=40, pred=REJECT_CPU)  # swap-in threshold round(38.0) = 38
    a = on_gpu(s, dec(320))  # need 20
    h = on_cpu(s, dec(288))  # need 18: 38 <= 38
    small = on_cpu(s, dec(16))  # need 1: 39 > 38 (but <= 40)
    plan = step(s)
    assert plan.swap_ins == [h] and plan.swap_in_blocks == 18 and plan.swap_outs == []
    assert s.gpu_q == [a, h] and list(s.cpu_q) == [small] and h.owner == Owner.GPU
    assert plan.batches[0].gpu_decodes == [a, h] and generated(h, small) == [2, 1]


def test_swap_in_threshold_rounds_95_percent():
    """A2.1: swap_in_threshold = round(0.95 * N): 47.5 -> 48 for N = 50."""
    s = neo(gpu=50, pred=REJECT_CPU)
    on_gpu(s, dec(320))  # need 20
    h = on_cpu(s, dec(448))  # need 28: 48 <= 48
    assert schedule(s).swap_ins == [h]
    s = neo(gpu=50, pred=REJECT_CPU)
    on_gpu(s, dec(336))  # need 21: 49 > 48
    on_cpu(s, dec(448))
    assert schedule(s).swap_ins == []


def test_swap_in_is_strict_head_of_line():
    """A2.4: a head of cpu_q that does not fit under 95% stops swap-in; a smaller request
    behind it that would fit stays on the CPU."""
    s = neo(gpu=40, pred=REJECT_CPU)
    on_gpu(s, dec(320))  # need 20
    big = on_cpu(s, dec(304))  # need 19: 39 > 38
    small = on_cpu(s, dec(16))  # need 1: would fit
    plan = step(s)
    assert plan.swap_ins == [] and list(s.cpu_q) == [big, small]


# ----------------------------------------------------------------------------- A2 step 5

KEEP_ALL = {"linr_s_threshold": 10**6}  # GPU-only trim keeps every CPU prefill: placement shows


def test_prefill_goes_to_gpu_while_the_gpu_pool_holds_it_at_100_percent():
    """A2.5 placement: a prompt is a GPU prefill when GPU decodes + earlier GPU prefills + its
    blocks fit 100% of the GPU pool (not 95%); otherwise it is a CPU prefill."""
    s = neo(gpu=20, **KEEP_ALL)
    a = on_gpu(s, dec(80))  # need 5
    p1 = waiting(s, req(240))  # 15 blocks: 20 <= 20
    p2 = waiting(s, req(16))  # 1 block: 21 > 20
    plan = step(s)
    (b,) = plan.batches
    assert b.gpu_prefills == [p1] and b.cpu_prefills == [p2]
    assert s.gpu_q == [a, p1] and list(s.cpu_q) == [p2] and list(s.waiting) == []
    assert p1.owner == Owner.GPU and len(p1.blocks) == 15 and s.hbm.used == 20
    assert p2.owner == Owner.CPU and s.host.used == 1
    assert [kind for _, kind in p2.migrations] == ["prefill_to_cpu"]


def test_after_the_first_cpu_prefill_every_later_prompt_goes_to_the_cpu():
    """A2.5 fairness: once one candidate went to the CPU, later ones do too, even if the GPU
    pool could hold them."""
    s = neo(gpu=20, **KEEP_ALL)
    on_gpu(s, dec(80))  # need 5
    p0 = waiting(s, req(32))  # 2 blocks: 7 <= 20 -> GPU
    p1 = waiting(s, req(224))  # 14 blocks: 21 > 20 -> CPU
    p2 = waiting(s, req(16))  # 1 block: 8 <= 20, but after a CPU prefill -> CPU
    (b,) = step(s).batches
    assert b.gpu_prefills == [p0] and b.cpu_prefills == [p1, p2]


def test_prefill_candidates_stop_at_the_first_failing_itm_check():
    """A2.5: candidates stop at the first one whose blocks overflow the staging (itm) pool;
    later ones that would fit are not considered."""
    s = neo(gpu=4, **KEEP_ALL)  # itm = 4
    p1 = waiting(s, req(64))  # 4 blocks -> GPU
    p2 = waiting(s, req(48))  # 3 -> CPU, itm 3
    p3 = waiting(s, req(32))  # 2: itm 5 > 4 -> stop
    p4 = waiting(s, req(16))  # 1: itm 4 would fit
    (b,) = step(s).batches
    assert b.gpu_prefills == [p1] and b.cpu_prefills == [p2]
    assert list(s.waiting) == [p3, p4] and generated(p3, p4) == [0, 0]


def test_prefill_candidates_stop_at_the_cpu_threshold():
    """A2.5: candidates stop at the first one for which Σ need(cpu_q) + its blocks exceeds
    cpu_threshold = host - GPU blocks, even if it would be a GPU prefill; later ones that would
    pass are not considered."""
    s = neo(gpu=4, host=12, pred=REJECT_CPU)  # cpu_threshold 8
    on_cpu(s, dec(80))  # need 5 > round(3.8): not swapped in
    p1 = waiting(s, req(64))  # 4 blocks: 5 + 4 > 8 (the empty GPU pool could hold it)
    p2 = waiting(s, req(16))  # 1 block: 5 + 1 <= 8 would pass
    plan = step(s)
    assert plan.batches == [] and list(s.waiting) == [p1, p2]


def test_prefill_candidates_stop_at_the_budget():
    """A2.5: candidates stop at the first one the budget (tokens, then slots) cannot pay."""
    s = neo(gpu=64, max_tokens_in_batch=100)
    on_gpu(s, dec(17))  # 1 token: 99 left
    p1 = waiting(s, req(64))  # 35 left
    p2 = waiting(s, req(48))  # does not fit -> stop
    p3 = waiting(s, req(16))  # would fit
    (b,) = step(s).batches
    assert b.gpu_prefills == [p1] and list(s.waiting) == [p2, p3]

    s = neo(gpu=64, max_batch_size=2)
    on_gpu(s, dec(17))  # 1 slot left
    q1 = waiting(s, req(16))
    q2 = waiting(s, req(16))
    (b,) = step(s).batches
    assert b.gpu_prefills == [q1] and list(s.waiting) == [q2]


# ----------------------------------------------------------------------------- A3 step 1


def test_nothing_runs_when_there_is_no_gpu_work_even_with_cpu_decodes():
    """A3.1 / C7: no GPU decode and no prefill -> `batches == []`, even though cpu_q holds
    decodes the predictor would accept (its head is too big to swap in)."""
    s = neo(gpu=4, pred=LinearPredictor(a=10))  # swap-in threshold round(3.8) = 4
    big = on_cpu(s, dec(80))  # need 5 > 4
    small = on_cpu(s, dec(16))  # need 1, behind it
    plan = step(s)
    assert plan.batches == [] and plan.is_empty
    assert generated(big, small) == [1, 1] and list(s.cpu_q) == [big, small]


# ----------------------------------------------------------------------------- A3 step 3


def test_cpu_decode_admitted_only_while_overlap_slack_with_launch_is_non_negative():
    """A3.3: a CPU decode joins only if min(remains) >= 0 with
    remains[1] = linr(s0) - (cdec1 + lnch); the launch term is what rejects ctx 8."""
    pred = LinearPredictor(a=10, d=1, e=1, lnch_T=3)
    for ctx, admitted in ((7, True), (8, False)):
        s = neo(gpu=1, pred=pred)  # G fills the pool: no swap-in
        g = on_gpu(s, dec(16))  # s0 = 1, gdec0 = 16
        c = on_cpu(s, dec(ctx))
        # rem1 = 10 - ctx - 3 (0 for ctx 7, -1 for ctx 8); rem0 = 10 + 16 - 3 = 23
        plan = step(s)
        assert plan.pipelined == admitted
        assert plan.batches[0].gpu_decodes == [g]
        assert plan.batches[-1].cpu_decodes == ([c] if admitted else [])
        assert c.generated == (2 if admitted else 1)


def test_launch_term_is_charged_to_sub_batch_0_without_cpu_decodes():
    """A1/A3.3 / C4: remains[0] = linr(s1) + pref0 + gdec0 - (0 + lnch) is charged even when
    sub-batch 0 has no CPU decode, so a small sub-batch-1 width rejects the decode."""
    for lnch, admitted in ((1, True), (5, False)):
        s = neo(gpu=7, pred=LinearPredictor(b=1, lnch_T=lnch))  # swap-in threshold 7
        c = on_cpu(s, dec(128))  # need 8 > 7: stays on the CPU
        p = waiting(s, req(100))  # 7 blocks -> GPU prefill, s0 = 100
        # rem1 = linr(100) - 0 - lnch >= 0; rem0 = linr(1) - lnch = 1 - lnch
        plan = step(s)
        assert plan.batches[0].gpu_prefills == [p]
        assert plan.pipelined == admitted and c.generated == (2 if admitted else 1)


def _length_skip_state(g_max_tokens: int = 8, c3_max_tokens: int = 8):
    """rem0 = linr + gdec0 - cdec0 - lnch = 39 - cdec0, rem1 = 9 - cdec1 (a=10, d=e=lnch=1)."""
    s = neo(gpu=2, pred=LinearPredictor(a=10, d=1, e=1, lnch_T=1))  # G fills 2 of 2: no swap-in
    g = on_gpu(s, dec(30, g_max_tokens))  # need 2
    cs = [on_cpu(s, dec(10)), on_cpu(s, dec(2, c3_max_tokens)), on_cpu(s, dec(10)),
          on_cpu(s, dec(20)), on_cpu(s, dec(3))]
    return s, g, cs


def test_after_a_rejection_every_cpu_request_at_least_as_long_is_skipped():
    """A3.3 / C5: the first rejection (ctx 10 into b1: rem1 = -1) sets min_out_cpu_len = 10;
    later requests with ctx >= 10 are skipped although they would fit sub-batch 0 (rem0 29 and
    19), while shorter ones still join."""
    s, g, (c2, c3, c4, c5, c6) = _length_skip_state()
    # c3 -> b1 (rem1 7, rem0 39: next 0); c4, c5 skipped; c6 -> b0 (rem0 36)
    plan = step(s)
    b0, b1 = plan.batches
    assert b1.cpu_decodes == [c3] and b0.cpu_decodes == [c6]
    assert generated(c2, c3, c4, c5, c6) == [1, 2, 1, 1, 2]


def test_next_cpu_decode_goes_to_the_sub_batch_with_more_slack():
    """A3.3: the first CPU decode goes to b1; each next one to b1 iff remains[1] > remains[0].
    rem0 = 14 - cdec0, rem1 = 10 - cdec1 (a=10, d=e=1, lnch=0), every decode ctx 3."""
    s = neo(gpu=1, pred=LinearPredictor(a=10, d=1, e=1))
    on_gpu(s, dec(4))  # gdec0 = 4
    x = [on_cpu(s, dec(3)) for _ in range(8)]
    # x1->b1 (7|14), x2->b0 (11|7), x3->b0 (8|7), x4->b0 (5|7), x5->b1 (5|4), x6->b0 (2|4),
    # x7->b1 (2|1), x8->b0 would make rem0 -1: rejected.
    plan = step(s)
    b0, b1 = plan.batches
    assert b1.cpu_decodes == [x[0], x[4], x[6]]
    assert b0.cpu_decodes == [x[1], x[2], x[3], x[5]]
    assert x[7].generated == 1


# ----------------------------------------------------------------------------- A3 steps 4-7


def test_gpu_only_is_chosen_when_its_rate_is_at_least_the_pipelined_rate():
    """A3.7: seq_rate = len(gpu_only) / gpu_time, pipe_rate = (len b0 + len b1) /
    (gpu_time b0 + gpu_time b1); pipelined only if seq_rate < pipe_rate (a tie is GPU-only).
    Both cases admit the CPU decode (rem1 = 10 - 5 - 1 = 4)."""
    # d = 0: seq 1/10, pipe 2/(10 + 10): a tie -> GPU-only, the CPU decode gets no token.
    # d = 1: seq 1/15, pipe 2/(15 + 10) = 1/12.5 -> pipelined.
    for d, pipelined in ((0, False), (1, True)):
        s = neo(gpu=1, pred=LinearPredictor(a=10, d=d, e=1, lnch_T=1))
        g = on_gpu(s, dec(5))
        c = on_cpu(s, dec(5))
        plan = step(s)
        assert plan.pipelined == pipelined
        assert plan.batches[0].gpu_decodes == [g] and g.generated == 2
        assert c.generated == (2 if pipelined else 1)
        assert c.token_owners[-1] == (Owner.CPU if pipelined else Owner.GPU)


def test_gpu_only_trim_keeps_cpu_prefills_only_while_width_at_least_128():
    """A3.2: the GPU-only batch drops the last CPU prefill while the width after dropping
    stays >= 128 (144 -> 128 drops p4; 128 -> 96 keeps p3); GPU prefills are never trimmed.
    Trimmed candidates stay waiting."""
    s = neo(gpu=4, itm_blocks=10)
    p1 = waiting(s, req(64))  # 4 blocks -> GPU
    p2, p3, p4 = waiting(s, req(32)), waiting(s, req(32)), waiting(s, req(16))  # -> CPU
    (b,) = step(s).batches
    assert b.gpu_prefills == [p1] and b.cpu_prefills == [p2, p3] and b.width == 128
    assert list(s.waiting) == [p4] and generated(p1, p2, p3, p4) == [1, 1, 1, 0]


def _pipelined_trim_state(cdec_ctx: int, extra: bool):
    """b0 = GPU prefill p1 (64) + CPU prefills p2, p3 (100 each) [+ p4 (16)]; c (ctx
    `cdec_ctx`, too big to swap in) goes to b1. linr = 2s, pref = L, cdec = ctx, lnch = 10."""
    s = neo(gpu=4, itm_blocks=20, pred=LinearPredictor(b=2, c=1, e=1, lnch_T=10))
    c = on_cpu(s, dec(cdec_ctx))
    ps = [waiting(s, req(64)), waiting(s, req(100)), waiting(s, req(100))]
    if extra:
        ps.append(waiting(s, req(16)))
    return s, c, ps


def test_pipelined_keeps_cpu_prefills_needed_as_cover():
    """A3.6: a CPU prefill of b0 is kept when dropping it would make min(remains) < 0: with
    cdec1 + lnch = 400, dropping p3 gives rem1 = linr(164) - 400 = -72."""
    s, c, (p1, p2, p3) = _pipelined_trim_state(390, extra=False)
    # gpu-only: [p1, p2] (width 164), seq = 2/492; pipe = 4/(792 + 2) -> pipelined.
    plan = step(s)
    b0, b1 = plan.batches
    assert b1.cpu_decodes == [c]
    assert b0.gpu_prefills == [p1] and b0.cpu_prefills == [p2, p3]
    assert list(s.waiting) == []


def test_pipelined_trims_cpu_prefills_not_needed_keeping_width_at_least_128():
    """A3.6: CPU prefills are popped from b0 while the width stays >= 128 and min(remains)
    >= 0 (cdec1 + lnch = 110): p4 (280 -> 264) and p3 (-> 164) go; p2 stays because 64 < 128
    (rem1 = 128 - 110 >= 0 there, so it is the width that keeps it)."""
    s, c, (p1, p2, p3, p4) = _pipelined_trim_state(100, extra=True)
    plan = step(s)
    b0, b1 = plan.batches
    assert b1.cpu_decodes == [c]
    assert b0.gpu_prefills == [p1] and b0.cpu_prefills == [p2] and b0.width == 164


def test_surviving_prefills_are_a_fcfs_prefix_and_trimmed_ones_stay_waiting():
    """A2.7: only the surviving FCFS prefix of candidates leaves waiting_q (GPU prefills to
    gpu_q, CPU prefills to the tail of cpu_q); trimmed ones stay waiting, untouched, and are
    candidates again next iteration."""
    s, c, (p1, p2, p3, p4) = _pipelined_trim_state(100, extra=True)
    step(s, 1.0)
    assert list(s.waiting) == [p3, p4]
    assert all(r.blocks == [] and r.owner == Owner.GPU and r.generated == 0 for r in (p3, p4))
    assert s.gpu_q == [p1] and list(s.cpu_q) == [c, p2]
    assert generated(p1, p2, c) == [1, 1, 2]
    nxt = schedule(s, 2.0)
    assert p3 in nxt.batches[0].prefills


# ----------------------------------------------------------------------------- A4 / D1


def test_layer_time_matches_the_formula_for_both_modes():
    """D1: GPU-only = linr(s) + pref + gdec; pipelined = max(linr(s0), cdec1 + lnch) +
    max(linr(s1) + pref0 + gdec0, cdec0 + lnch), with lnch charged to an empty CPU part."""
    p = LinearPredictor(a=2, b=1, c=1, d=1, e=1, lnch_T=3)

    def b0_of(cdec0_ctx):
        b0 = SubBatch.with_gpu_decodes([dec(30)])  # gdec0 = 30
        b0.add_prefill(req(50), False, p)  # pref0 = 50
        if cdec0_ctx:
            b0.add_cpu_decode(dec(cdec0_ctx))
        return b0

    def b1_of(ctx):
        b1 = SubBatch()
        b1.add_cpu_decode(dec(ctx))  # s1 = 1, linr(1) = 3
        return b1

    assert layer_time(NeoPlan(), p) == 0.0
    assert layer_time(NeoPlan(batches=[b0_of(0)]), p) == 53 + 50 + 30  # s = 51
    # s0 = 52: stage0 = max(54, 40 + 3) = 54, stage1 = max(3 + 50 + 30, 20 + 3) = 83
    assert layer_time(NeoPlan(batches=[b0_of(20), b1_of(40)]), p) == 54 + 83
    # stage0 = max(54, 100 + 3) = 103, stage1 = max(83, 90 + 3) = 93
    assert layer_time(NeoPlan(batches=[b0_of(90), b1_of(100)]), p) == 103 + 93
    # stage0 = max(54, 40 + 3) = 54, stage1 = max(83, 120 + 3) = 123
    assert layer_time(NeoPlan(batches=[b0_of(120), b1_of(40)]), p) == 54 + 123
    # no CPU decode in b0 and a small GPU part: stage1 = max(3 + 0 + 2, 0 + 10) = 10
    q = LinearPredictor(a=2, b=1, d=1, e=1, lnch_T=10)
    small = SubBatch.with_gpu_decodes([dec(2)])  # s0 = 1, gdec0 = 2
    assert layer_time(NeoPlan(batches=[small, b1_of(2)]), q) == max(3, 2 + 10) + 10


def test_layer_time_of_a_scheduled_pipelined_iteration():
    """D1 on a plan the scheduler built (the slack test's state): s0 = 5, s1 = 3, linr = 10;
    stage0 = max(10, 9 + 0) = 10, stage1 = max(10 + 0 + 4, 12 + 0) = 14."""
    pred = LinearPredictor(a=10, d=1, e=1)
    s = neo(gpu=1, pred=pred)
    on_gpu(s, dec(4))
    for _ in range(8):
        on_cpu(s, dec(3))
    plan = schedule(s)
    assert [b.width for b in plan.batches] == [5, 3]
    assert layer_time(plan, pred) == 24


# ----------------------------------------------------------------------------- apply


def test_apply_gives_one_token_to_each_scheduled_request_and_frees_finished_ones():
    """A0/A4: every request of the chosen batches gets exactly one token (CPU decodes owned by
    the CPU, the rest by the GPU), no one else does; finished requests release the blocks of
    their own pool (HBM for gpu_q, host for cpu_q)."""
    s, g, (c2, c3, c4, c5, c6) = _length_skip_state(g_max_tokens=2, c3_max_tokens=2)
    plan = schedule(s, 5.0)
    assert plan.pipelined
    apply(s, plan, 5.0)
    assert generated(g, c2, c3, c4, c5, c6) == [2, 1, 2, 1, 1, 2]
    assert g.token_times[-1] == c3.token_times[-1] == c6.token_times[-1] == 5.0
    assert g.token_owners[-1] == Owner.GPU
    assert c3.token_owners[-1] == c6.token_owners[-1] == Owner.CPU
    assert g.finished and c3.finished and g.blocks == [] and c3.blocks == []
    assert s.finished == [g, c3] and s.gpu_q == [] and list(s.cpu_q) == [c2, c4, c5, c6]
    assert s.hbm.used == 0
    assert s.host.used == sum(len(r.blocks) for r in (c2, c4, c5, c6))
    # Nobody finishes: still exactly one token each (the slack test's state).
    s = neo(gpu=1, pred=LinearPredictor(a=10, d=1, e=1))
    g = on_gpu(s, dec(4))
    x = [on_cpu(s, dec(3)) for _ in range(8)]
    step(s, 7.0)
    assert generated(g, *x) == [2, 2, 2, 2, 2, 2, 2, 2, 1]
    assert [r.token_owners[-1] for r in (g, *x[:7])] == [Owner.GPU] + [Owner.CPU] * 7


def test_check_invariants_catches_a_wrong_cpu_block_total_or_a_finished_request_queued():
    """The running Σ blocks of cpu_q is checked against the full sum, and a finished request
    left in cpu_q (apply rebuilds it only when a CPU row finished) is caught."""
    s, _, (c2, *_) = _length_skip_state()
    s.check_invariants()
    s.cpu_q_blocks += 1
    with pytest.raises(AssertionError, match="Σ blocks of cpu_q"):
        s.check_invariants()
    s.cpu_q_blocks -= 1
    c2.generated = c2.max_tokens
    with pytest.raises(AssertionError, match="finished request left in cpu_q"):
        s.check_invariants()


def test_gpu_queue_running_totals_follow_swaps_prefills_decodes_and_finishes():
    """The GPU queue's Σ blocks, Σ KV and phase counts (kept up to date, not re-summed) match a
    full recomputation (`check_invariants`) through swap-outs, swap-ins, GPU prefills, block
    crossings of every decode and finishes; a wrong value of any of them is caught."""
    s = neo(gpu=6, pred=REJECT_CPU)
    a = on_gpu(s, dec(15, max_tokens=40))  # crosses into a new block at different steps
    b = on_gpu(s, dec(30, max_tokens=3))
    c = on_gpu(s, dec(17, max_tokens=40))
    waiting(s, req(4, max_tokens=5))  # 1 block: a GPU prefill
    kinds = set()
    for k in range(200):
        plan = step(s, float(k))
        kinds |= {name for name, rs in (("out", plan.swap_outs), ("in", plan.swap_ins))
                  if rs}
        kinds |= {"prefill"} if any(bt.gpu_prefills for bt in plan.batches) else set()
        assert s.gpu_q_kv == sum(r.kv_tokens_after_step for r in s.gpu_q)
        if not (s.waiting or s.gpu_q or s.cpu_q):
            break
    assert kinds == {"out", "in", "prefill"} and b.finished and a.finished and c.finished
    s = neo(gpu=64, pred=REJECT_CPU)
    on_gpu(s, dec(17))
    step(s)
    for name, wrong, match in (("gpu_q_blocks", 1, "Σ blocks of gpu_q"),
                               ("gpu_q_kv", 1, "Σ KV of gpu_q"),
                               ("gpu_steps", 1, "gpu_q by phase")):
        setattr(s, name, getattr(s, name) + wrong)
        with pytest.raises(AssertionError, match=match):
            s.check_invariants()
        setattr(s, name, getattr(s, name) - wrong)
    s.check_invariants()
