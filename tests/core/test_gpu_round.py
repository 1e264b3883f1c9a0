"""Unit tests of the GPU engine round (paper Appendix A.1), one rule per test.

States are built by hand (block size 4) so every budget can be checked on paper. Notation in the
comments: `blocks/need/peak` = KV blocks held, next-token blocks, finish-peak b̂.
"""

from __future__ import annotations

from dualpace_sim.core import CpuScheduler, GpuResult, GpuScheduler, Owner

from .factories import (
    cpu_running,
    cpu_waiting,
    gpu_prefilling,
    gpu_round,
    gpu_running,
    gpu_waiting,
    make_req,
    make_state,
    mark,
)


def chunks(plan):
    return [(c.req, c.start, c.tokens, c.to_cpu, c.last) for c in plan.prefills]


def schedule(st):
    return GpuScheduler(st).schedule()


def commit(st, plan):
    GpuScheduler(st).commit(plan)
    st.check_invariants()


# --------------------------------------------------------------------------------- step 1


def test_step1_waits_for_previous_copy_group():
    """A.1 step 1: while the previous Prefill-to-CPU copy group is in flight the round only
    waits (no prefill reuses the staging blocks), and commit changes nothing."""
    st = make_state(gpu=1, gpu_max_rows=1)
    p1 = gpu_waiting(st, make_req(8, 4))  # 2 blocks > 1 free: Prefill-to-CPU
    p2 = gpu_waiting(st, make_req(4, 4))
    first = gpu_round(st)
    assert chunks(first) == [(p1, 0, 8, True, True)]
    assert st.copy_group == [p1]

    plan = schedule(st)
    assert plan.wait_for_copies
    assert not plan.prefills and not plan.decodes and not plan.has_migrations
    commit(st, plan)
    assert list(st.gpu_waiting) == [p2] and st.copy_group == [p1]

    st.complete_copy_group(2.0)
    after = schedule(st)
    assert not after.wait_for_copies
    assert [c.req for c in after.prefills] == [p2]


def test_step1_completed_copy_group_makes_request_ready_and_cpu_owned():
    """A.1 step 1: retiring a completed copy group makes its Prefill-to-CPU requests ready and
    CPU-owned; until then the CPU engine waits on them instead of running them."""
    st = make_state(gpu=1)
    p = gpu_waiting(st, make_req(8, 4))
    gpu_round(st, t=1.0)
    assert p in st.cpu_waiting and not p.ready and p.owner is Owner.GPU
    assert CpuScheduler(st).schedule().wait_for is p

    st.complete_copy_group(2.0)
    assert p.ready and p.owner is Owner.CPU and p.transit_to is None
    assert st.copy_group == []
    assert p.migrations == [(2.0, "prefill_to_cpu")]
    assert CpuScheduler(st).schedule().batch == [p]
    st.check_invariants()


def test_step1_copy_of_a_non_final_chunk_keeps_request_on_gpu():
    """A.1 step 1: a request becomes CPU-eligible only after the copies of all its chunks
    landed; a copy group holding a non-final chunk leaves it GPU-owned and prefilling."""
    st = make_state(gpu=1, gpu_token_limit=8)
    p = gpu_waiting(st, make_req(12, 4))  # 3 blocks > 1: Prefill-to-CPU, chunked 8 + 4
    plan = gpu_round(st)
    assert chunks(plan) == [(p, 0, 8, True, False)]
    st.complete_copy_group(2.0)
    assert p.owner is Owner.GPU and p.transit_to is None and p in st.gpu_prefilling
    assert p.migrations == []
    st.check_invariants()
    plan = gpu_round(st, t=3.0)
    assert chunks(plan) == [(p, 8, 4, True, True)]
    assert p in st.cpu_waiting and not p.ready


# --------------------------------------------------------------------------------- step 2


def test_step2_swap_out_from_eviction_tail():
    """A.1 step 2a: when the next-token footprint exceeds free HBM the victim comes from the
    eviction-priority tail of the GPU queue, and the remaining decodes run."""
    st = make_state(gpu=6)
    a, b, c = (gpu_running(st, make_req(8, 4, 1)) for _ in range(3))  # 2/1/3 each; free 0
    plan = schedule(st)
    assert plan.swap_outs == [c] and plan.swap_out_blocks == 2
    assert plan.decodes == [a, b] and plan.has_forward


def test_step2_skips_tail_victim_the_host_cannot_hold():
    """A.1 step 2b: a tail victim the host cannot take (not enough free host blocks) is skipped
    for an earlier feasible one."""
    st = make_state(gpu=8, host=3)
    a = gpu_running(st, make_req(8, 4, 1))  # 2/1/3
    b = gpu_running(st, make_req(8, 4, 1))  # 2/1/3
    c = gpu_running(st, make_req(16, 4, 1))  # 4/1/5: needs 4 host blocks, only 3 exist
    plan = schedule(st)
    assert plan.swap_outs == [b]
    assert plan.decodes == [a, c]


def test_step2_skips_tail_victim_that_breaks_host_envelope():
    """A.1 step 2b: a tail victim whose host copy would break Eq. 2 (here through the B_growth
    of a CPU-running request) is skipped for an earlier feasible one."""
    st = make_state(gpu=8, host=10)
    cpu_running(st, make_req(4, 24, 1))  # 1 block, peak 7: B_growth 6, host used 1
    a = gpu_running(st, make_req(8, 4, 1))  # 2/1/3
    b = gpu_running(st, make_req(8, 4, 1))  # 2/1/3
    c = gpu_running(st, make_req(16, 4, 1))  # 4/1/5: 1 + 4 + 6 > 10, but host.free is 9
    plan = schedule(st)
    assert plan.swap_outs == [b]  # 1 + 2 + 6 <= 10
    assert plan.decodes == [a, c]


def _pressure_with_big_prefill(st, small_tail: bool):
    """GPU queue [A, B, C] + a GPU prefilling P whose finish-peak (27) alone is the reserve, so
    any victim's host copy plus the reserve is what decides feasibility."""
    if small_tail:
        a = gpu_running(st, make_req(16, 2, 1))  # 4/1/5
        b = gpu_running(st, make_req(16, 2, 1))  # 4/1/5
        c = gpu_running(st, make_req(4, 2, 1))  # 1/1/2
    else:
        a = gpu_running(st, make_req(8, 4, 1))  # 2/1/3
        b = gpu_running(st, make_req(7, 4, 1))  # 2/0/3
        c = gpu_running(st, make_req(8, 4, 1))  # 2/1/3
    p = gpu_prefilling(st, make_req(8, 100), prefilled=4)  # 2 HBM blocks, peak 27
    return a, b, c, p


def test_step2_no_feasible_victim_runs_fitting_decode_subset():
    """A.1 step 2c: with no feasible victim the round still runs the decodes whose next-token
    growth fits free HBM (here A and the block-aligned B, not C)."""
    st = make_state(gpu=9, host=28)  # HBM: 2+2+2+2 held, 1 free; needs 1+0+1
    a, b, c, _ = _pressure_with_big_prefill(st, small_tail=False)
    st.check_invariants()
    plan = schedule(st)
    assert plan.swap_outs == []  # every victim: 2 + reserve 27 > 28
    assert plan.decodes == [a, b]
    commit(st, plan)
    assert st.hbm.free == 0
    assert c.generated == 1 and c in st.gpu_running


def test_step2_partial_relief_gives_migration_only_round():
    """A.1 step 2d: evictions that free only part of the deficit give a migration-only round:
    no decodes and no prefills, and B_migration is still published."""
    st = make_state(gpu=11, host=29)  # HBM 4+4+1+2 held, 0 free; needs 3
    a, b, c, p = _pressure_with_big_prefill(st, small_tail=True)
    q = gpu_waiting(st, make_req(4, 4))
    st.check_invariants()
    plan = schedule(st)
    assert plan.swap_outs == [c]  # frees 1 + 1 < 3; A/B: 1 + 4 + 27 > 29
    assert plan.decodes == [] and plan.prefills == [] and plan.swap_ins == []
    commit(st, plan)
    assert st.b_migration == 27  # [A, B, P] peaks 5+5+27 - 11 = 26 -> P's 27
    assert st.gpu_running == [a, b] and list(st.gpu_waiting) == [q] and p.prefilled == 4


# --------------------------------------------------------------------------------- step 3


def _queue_for_reserve(st):
    a = gpu_running(st, make_req(8, 8, 1))  # 2/1/4
    b = gpu_running(st, make_req(8, 12, 1))  # 2/1/5
    c = gpu_running(st, make_req(4, 8, 1))  # 1/1/3
    return a, b, c


def test_step3_publishes_eq4_tail_scan():
    """A.1 step 3: B_migration is the finish-peak of the shortest eviction-tail suffix whose
    removal makes the queue's aggregate peak fit HBM (Eq. 4): peaks 4+5+3 over 10 -> 3."""
    st = make_state(gpu=10)
    _queue_for_reserve(st)
    gpu_round(st)
    assert st.b_migration == 3


def test_step3_prefill_to_gpu_extends_reserve():
    """A.1 steps 3/5: a Prefill-to-GPU joins the GPU population at the tail and B_migration
    grows accordingly: peaks 4+5+3+3 over 10 -> tail 3 + 3 = 6."""
    st = make_state(gpu=10)
    _queue_for_reserve(st)
    d = gpu_waiting(st, make_req(8, 4))  # 2 blocks (2 free after decodes), peak 3
    plan = gpu_round(st, t=None)
    assert chunks(plan) == [(d, 0, 8, False, True)]
    assert st.b_migration == 6
    GpuScheduler(st).apply(plan, GpuResult(1.0))
    assert st.gpu_running[-1] is d  # D decodes at the tail of the queue from now on


# --------------------------------------------------------------------------------- step 4


def _saturated_cpu(st, n=2):
    return [cpu_running(st, make_req(8, 8, 1)) for _ in range(n)]  # 2 blocks each


def test_step4_early_swap_in_before_prefills_when_cpu_saturated():
    """A.1 step 4: with the CPU batch full, a nonempty CPU waiting queue and no swap-out, a
    ready CPU-waiting request is swapped in before prompt admission takes the HBM."""
    st = make_state(gpu=10, cpu_batch_limit=2)
    _saturated_cpu(st)
    w = cpu_waiting(st, make_req(8, 4, 1))  # 2 host blocks, needs 3 HBM, peak 3
    p = gpu_waiting(st, make_req(32, 4))  # 8 blocks: fits only if W is not swapped in
    plan = schedule(st)
    assert plan.swap_ins == [w] and w in plan.decodes
    assert chunks(plan) == [(p, 0, 32, True, True)]  # 8 > 10 - 3: Prefill-to-CPU


def test_step4_no_early_swap_in_when_cpu_batch_not_full():
    """A.1 step 4: a CPU batch below its limit is not saturated, so prompts are admitted first
    and the later residual pass finds no HBM left for the waiting request."""
    st = make_state(gpu=10, cpu_batch_limit=3)
    _saturated_cpu(st)
    cpu_waiting(st, make_req(8, 4, 1))
    p = gpu_waiting(st, make_req(32, 4))
    plan = schedule(st)
    assert plan.swap_ins == []
    assert chunks(plan) == [(p, 0, 32, False, True)]


def test_step4_no_swap_in_in_a_swap_out_round():
    """A.1 step 4: a round that performs a swap-out does not swap in, even with a saturated CPU
    tier and HBM left over after the eviction."""
    st = make_state(gpu=6, cpu_batch_limit=2)
    _saturated_cpu(st)
    cpu_waiting(st, make_req(4, 4, 1))  # 1 host block, needs 2 HBM, peak 2
    a = gpu_running(st, make_req(8, 4, 1))  # 2/1/3
    b = gpu_running(st, make_req(16, 4, 1))  # 4/1/5; free 0, deficit 2
    plan = schedule(st)
    assert plan.swap_outs == [b] and plan.decodes == [a]  # 3 HBM left over
    assert plan.swap_ins == []


def test_step4_swap_in_refused_when_finish_peak_does_not_fit_hbm():
    """A.1 step 4: a CPU-waiting request whose finish-peak would not fit HBM next to the GPU
    population's is not swapped in, though its next-token blocks fit."""
    st = make_state(gpu=10, cpu_batch_limit=2)
    _saturated_cpu(st)
    gpu_running(st, make_req(8, 16, 1))  # 2/1/6
    cpu_waiting(st, make_req(4, 16, 1))  # 1 block, needs 2 HBM (7 free), peak 5: 6 + 5 > 10
    plan = schedule(st)
    assert plan.swap_ins == []


def test_step4_swap_in_prefix_stops_at_first_unready_request():
    """A.1 step 4: the swapped-in FIFO prefix of the CPU waiting queue stops at the first
    unready request (a swap-out still in flight), even if a later one is ready."""
    st = make_state(gpu=32, cpu_batch_limit=2)
    _saturated_cpu(st)
    w1 = cpu_waiting(st, make_req(8, 4, 1))
    cpu_waiting(st, make_req(8, 4, 1), ready=False)
    cpu_waiting(st, make_req(8, 4, 1))
    plan = schedule(st)
    assert plan.swap_ins == [w1]


# --------------------------------------------------------------------------------- step 5


def test_step5_prefills_fifo_under_row_limit():
    """A.1 step 5a: prompts are admitted in FIFO order until the GPU row limit (decodes count
    as rows) is reached."""
    st = make_state(gpu=64, gpu_max_rows=3)
    a = gpu_running(st, make_req(8, 4, 1))
    p1, p2, _ = (gpu_waiting(st, make_req(4, 4)) for _ in range(3))
    plan = schedule(st)
    assert plan.decodes == [a]
    assert [c.req for c in plan.prefills] == [p1, p2]


def test_step5_long_prompt_chunked_to_batched_token_limit():
    """A.1 step 5b: a prompt longer than the remaining batched-token budget takes that budget
    as a chunk (Sarathi-style) and the next round continues it before newer prompts."""
    st = make_state(gpu=64, gpu_token_limit=16)
    p1 = gpu_waiting(st, make_req(10, 4))
    p2 = gpu_waiting(st, make_req(20, 4))
    plan = gpu_round(st)
    assert chunks(plan) == [(p1, 0, 10, False, True), (p2, 0, 6, False, False)]
    assert p2 in st.gpu_prefilling and len(p2.blocks) == 5 and p2.prefilled == 6

    p3 = gpu_waiting(st, make_req(4, 4))
    plan = gpu_round(st, t=2.0)
    assert plan.decodes == [p1]
    assert chunks(plan)[0] == (p2, 6, 14, False, True)  # 1 decode + 14 <= 16
    assert chunks(plan)[1] == (p3, 0, 1, False, False)
    assert p2 in st.gpu_running and p2.generated == 1


def test_step5_hard_token_limit_caps_prefill_chunk():
    """A.1 step 5c: the hard token limit caps a batch below the profiled batched-token limit."""
    st = make_state(gpu=64, gpu_token_limit=64, gpu_hard_token_limit=10)
    p = gpu_waiting(st, make_req(20, 4))
    plan = schedule(st)
    assert chunks(plan) == [(p, 0, 10, False, False)]


def test_step5_hard_token_limit_caps_decodes():
    """A.1 step 5c: the hard token limit also bounds the GPU decodes of one batch."""
    st = make_state(gpu=64, gpu_hard_token_limit=2)
    a, b, _ = (gpu_running(st, make_req(8, 4, 1)) for _ in range(3))
    plan = schedule(st)
    assert plan.decodes == [a, b]


def test_step5_staging_capacity_limits_prefill_to_cpu():
    """A.1 step 5d: Prefill-to-CPU prompts are admitted only while single-layer staging blocks
    remain for their chunk."""
    st = make_state(gpu=1, staging_blocks=3)
    p1 = gpu_waiting(st, make_req(8, 4))  # 2 staging blocks
    gpu_waiting(st, make_req(8, 4))  # 2 more > 1 left
    plan = schedule(st)
    assert chunks(plan) == [(p1, 0, 8, True, True)]


def test_step5_prefill_to_gpu_if_prompt_fits_hbm_else_to_cpu():
    """A.1 step 5e: a prompt whose KV fits the HBM left goes Prefill-to-GPU (HBM blocks), the
    next one no longer fits and goes Prefill-to-CPU (host blocks)."""
    st = make_state(gpu=5)
    p1 = gpu_waiting(st, make_req(16, 4))  # 4 blocks <= 5
    p2 = gpu_waiting(st, make_req(8, 4))  # 2 blocks > 1
    plan = schedule(st)
    assert chunks(plan) == [(p1, 0, 16, False, True), (p2, 0, 8, True, True)]
    commit(st, plan)
    assert st.hbm.used == 4 and st.host.used == 2
    assert p1 in st.gpu_prefilling and not p1.to_cpu
    assert p2 in st.cpu_waiting and p2.to_cpu


def test_step5_later_prompts_follow_first_prefill_to_cpu():
    """A.1 step 5f: once a prompt goes Prefill-to-CPU, later prompts of the same round follow
    it even if they would fit HBM."""
    st = make_state(gpu=5)
    p1 = gpu_waiting(st, make_req(24, 4))  # 6 blocks > 5
    p2 = gpu_waiting(st, make_req(4, 4))  # 1 block would fit
    plan = schedule(st)
    assert chunks(plan) == [(p1, 0, 24, True, True), (p2, 0, 4, True, True)]


def test_step5_prefill_to_cpu_respects_host_decode_admission_limit():
    """A.1 step 5g: Prefill-to-CPU is refused once CPU-owned requests plus this round's
    host-bound prompts reach host_max_requests."""
    st = make_state(gpu=1, host_max_requests=2)
    cpu_waiting(st, make_req(4, 4, 1))
    p1 = gpu_waiting(st, make_req(8, 4))
    gpu_waiting(st, make_req(8, 4))
    plan = schedule(st)
    assert chunks(plan) == [(p1, 0, 8, True, True)]


def test_step5_prefill_to_cpu_respects_migration_reserve():
    """A.1 step 5g: Prefill-to-CPU is refused when its host blocks plus B_migration would break
    Eq. 2 (2 + reserve 11 > 12), though host.free alone would take it."""
    st = make_state(gpu=3, host=12)
    gpu_running(st, make_req(4, 40, 1))  # 1/1/11 -> reserve 11 over 3 HBM blocks
    gpu_waiting(st, make_req(8, 4))  # 2 blocks > 1 HBM left
    plan = schedule(st)
    assert plan.prefills == []


def test_step5_prefill_to_cpu_respects_cpu_growth():
    """A.1 step 5g: Prefill-to-CPU is refused when its host blocks plus the B_growth of the
    CPU-running requests would break Eq. 2 (1 + 2 + 9 > 11)."""
    st = make_state(gpu=1, host=11)
    cpu_running(st, make_req(4, 36, 1))  # 1 block, peak 10: growth 9
    gpu_waiting(st, make_req(8, 4))
    plan = schedule(st)
    assert plan.prefills == []


def test_step5_prefill_to_cpu_counts_same_round_planned_blocks():
    """A.1 step 5g: host blocks planned for earlier Prefill-to-CPU prompts of the round count
    in the envelope (B_planned): 3 + 2 > 4 refuses the second prompt."""
    st = make_state(gpu=1, host=4)
    p1 = gpu_waiting(st, make_req(12, 4))  # 3 host blocks
    gpu_waiting(st, make_req(8, 4))  # 2 host blocks
    plan = schedule(st)
    assert chunks(plan) == [(p1, 0, 12, True, True)]


def test_step5_prefill_to_gpu_respects_extended_reserve():
    """A.1 step 5 / Eq. 2: a Prefill-to-GPU whose peak would raise B_migration beyond what the
    host envelope can hold is not admitted."""
    st = make_state(gpu=4, host=5)
    gpu_waiting(st, make_req(4, 20))  # 1 block fits HBM, peak 6 > 4: reserve 6 > host 5
    plan = schedule(st)
    assert plan.prefills == []


# --------------------------------------------------------------------------------- step 6


def test_step6_residual_swap_in_after_prefills():
    """A.1 step 6a: a round without swap-out uses HBM left after prefill admission to swap in a
    ready CPU-waiting request (CPU batch not full, so no early pass)."""
    st = make_state(gpu=64, cpu_batch_limit=4)
    cpu_running(st, make_req(8, 8, 1))
    w = cpu_waiting(st, make_req(8, 4, 1))
    p = gpu_waiting(st, make_req(8, 4))
    plan = schedule(st)
    assert chunks(plan) == [(p, 0, 8, False, True)]
    assert plan.swap_ins == [w] and w in plan.decodes


def test_step6_marks_cpu_running_when_waiting_queue_was_empty():
    """A.1 step 6b: with an empty CPU waiting queue, CPU-running requests that fit are marked
    for a deferred swap-in; ownership does not change."""
    st = make_state(gpu=64)
    r1 = cpu_running(st, make_req(8, 8, 1))
    r2 = cpu_running(st, make_req(8, 8, 1))
    plan = schedule(st)
    assert plan.marks == [r1, r2] and plan.swap_ins == []
    commit(st, plan)
    assert list(st.marked.values()) == [r1, r2]
    assert st.cpu_running == [r1, r2] and r1.owner is Owner.CPU and st.hbm.used == 0


def test_step6_no_marks_when_cpu_waiting_queue_nonempty():
    """A.1 step 6b: deferred swap-in marks are not placed while the CPU waiting queue holds a
    backlog (even an unready one), so GPU reclamation cannot bypass it."""
    st = make_state(gpu=64)
    cpu_running(st, make_req(8, 8, 1))
    cpu_waiting(st, make_req(8, 8, 1), ready=False)
    plan = schedule(st)
    assert plan.marks == []


def test_step6_mark_reserves_hbm_against_later_prefill():
    """A.1 step 6b: a mark reserves the marked request's HBM (KV + next token), so a later
    round's prompt that would otherwise fit goes Prefill-to-CPU."""
    st = make_state(gpu=8)
    r = cpu_running(st, make_req(16, 4, 1))  # 4 blocks: reserves 5 HBM, peak 5
    assert gpu_round(st).marks == [r]
    p = gpu_waiting(st, make_req(16, 4))  # 4 blocks: 4 <= 8 but 4 > 8 - 5
    plan = schedule(st)
    assert chunks(plan) == [(p, 0, 16, True, True)]


def test_step6_mark_reserves_rows_against_later_prefill():
    """A.1 step 6b: a mark reserves a future GPU row, so a later round at the row limit admits
    no prompt."""
    st = make_state(gpu=64, gpu_max_rows=1)
    r = cpu_running(st, make_req(8, 8, 1))
    assert gpu_round(st).marks == [r]
    gpu_waiting(st, make_req(4, 4))
    plan = schedule(st)
    assert plan.prefills == []


def test_step6_mark_reserves_finish_peak_against_later_swap_in():
    """A.1 step 6b: a mark reserves the marked request's finish-peak HBM, so a later round does
    not swap in a request whose peak fits only without that reservation (6 + 5 > 10)."""
    st = make_state(gpu=10, cpu_batch_limit=4)
    r = cpu_running(st, make_req(8, 16, 1))  # 2 blocks (reserves 3 HBM), peak 6
    assert gpu_round(st).marks == [r]
    cpu_waiting(st, make_req(4, 16, 1))  # 1 block, needs 2 HBM (7 left), peak 5
    plan = schedule(st)
    assert plan.swap_ins == []


def test_step6_swap_out_round_clears_marks():
    """A.1 steps 2/6: a round that evicts gives up its deferred swap-ins: commit clears every
    mark."""
    st = make_state(gpu=6)
    mark(st, cpu_running(st, make_req(8, 8, 1)))
    for _ in range(3):
        gpu_running(st, make_req(8, 4, 1))
    plan = schedule(st)
    assert plan.swap_outs
    commit(st, plan)
    assert not st.marked


# --------------------------------------------------------------------------------- step 7


def test_step7_swap_out_commit_moves_kv_to_host_and_stays_unready():
    """A.1 step 7: a swap-out releases its HBM, allocates host blocks and enters the CPU
    waiting queue unready (GPU-owned, in transit) until `complete_migrations`."""
    st = make_state(gpu=6)
    a, b, c = (gpu_running(st, make_req(8, 4, 1)) for _ in range(3))
    plan = schedule(st)
    commit(st, plan)
    assert st.gpu_running == [a, b] and st.cpu_waiting[0] is c
    assert st.hbm.used == 6 and st.host.used == 2 and len(c.blocks) == 2
    assert not c.ready and c.owner is Owner.GPU and c.transit_to is Owner.CPU
    assert CpuScheduler(st).schedule().wait_for is c
    st.complete_migrations(plan.swap_outs, plan.swap_ins, 2.0)
    assert c.ready and c.owner is Owner.CPU and c.transit_to is None
    assert c.migrations == [(2.0, "swap_out")]
    st.check_invariants()


def test_step7_swap_in_commit_keeps_host_blocks_until_transfer_lands():
    """A.1 step 7: a swap-in allocates HBM for its KV plus the next token before the host
    copy is released; the host blocks are freed only by `complete_migrations`."""
    st = make_state(gpu=16, cpu_batch_limit=4)
    w = cpu_waiting(st, make_req(8, 4, 1))  # 2 host blocks, needs 1 more for its next token
    plan = schedule(st)
    assert plan.swap_ins == [w] and plan.swap_in_blocks == 2
    commit(st, plan)
    assert w in st.gpu_running and w not in st.cpu_waiting
    assert len(w.blocks) == 3 and st.hbm.used == 3
    assert len(w.source_blocks) == 2 and st.host.used == 2
    assert not w.ready and w.owner is Owner.CPU and w.transit_to is Owner.GPU
    st.complete_migrations(plan.swap_outs, plan.swap_ins, 2.0)
    assert st.host.used == 0 and w.source_blocks == []
    assert w.ready and w.owner is Owner.GPU
    st.check_invariants()


def test_step7_prefill_to_cpu_commit_places_unready_request_in_cpu_waiting():
    """A.1 step 7: Prefill-to-CPU allocates persistent host blocks (no HBM), joins the copy
    group and enters the CPU waiting queue unready."""
    st = make_state(gpu=1)
    p = gpu_waiting(st, make_req(8, 4))
    plan = schedule(st)
    commit(st, plan)
    assert list(st.cpu_waiting) == [p] and p not in st.gpu_prefilling
    assert st.host.used == 2 and st.hbm.used == 0 and st.copy_group == [p]
    assert not p.ready and p.owner is Owner.GPU and p.transit_to is Owner.CPU


def test_step7_apply_releases_finished_and_queues_new_decodes():
    """A.1 step 7: apply records the batch's tokens; a decode reaching max_tokens releases its
    HBM and finishes, a completed Prefill-to-GPU joins the GPU queue's tail."""
    st = make_state(gpu=16)
    a = gpu_running(st, make_req(8, 2, 1))  # its next token is its last
    b = gpu_running(st, make_req(8, 8, 1))
    p = gpu_waiting(st, make_req(4, 4))
    gpu_round(st, t=7.0)
    assert a.finished and a.blocks == [] and st.finished == [a]
    assert st.gpu_running == [b, p] and p.generated == 1 and p.token_times == [7.0]
    assert st.hbm.used == len(b.blocks) + len(p.blocks) == 3 + 1
    assert list(b.token_owners) == [Owner.GPU, Owner.GPU]


def test_step7_schedule_does_not_mutate_state():
    """A.1 step 7: a decision is materialized only by commit; schedule alone leaves queues,
    pools and ownership untouched."""
    st = make_state(gpu=6, cpu_batch_limit=4)
    reqs = [gpu_running(st, make_req(8, 4, 1)) for _ in range(3)]
    reqs.append(cpu_waiting(st, make_req(8, 4, 1)))
    reqs.append(gpu_waiting(st, make_req(8, 4)))

    def snapshot():
        return (
            [list(q) for q in (st.gpu_waiting, st.gpu_running, st.cpu_waiting, st.cpu_running)],
            st.hbm.free, st.host.free, st.b_migration,
            [(r.owner, r.ready, tuple(r.blocks)) for r in reqs], dict(st.marked),
        )

    before = snapshot()
    plan = schedule(st)
    assert plan.swap_outs
    assert snapshot() == before


# ------------------------------------------------------ chunked Prefill-to-CPU across rounds


def test_step5_host_admission_limit_counts_chunked_prefill_to_cpu():
    """A.1 step 5g: the host decode-admission limit holds after a round that finishes a
    chunked Prefill-to-CPU prompt and admits another host-bound prompt."""
    st = make_state(gpu=1, host_max_requests=2, gpu_token_limit=8)
    cpu_waiting(st, make_req(4, 4, 1))  # 1 CPU-owned request
    gpu_waiting(st, make_req(12, 4))  # Prefill-to-CPU, chunks 8 + 4
    gpu_waiting(st, make_req(8, 4))  # host-bound as well (2 blocks > 1)
    for t in range(1, 10):
        if st.copy_group:
            st.complete_copy_group(float(t))
        else:
            gpu_round(st, t=float(t))
        assert st.cpu_owned_count() <= st.config.host_max_requests, t


def test_step5_prompts_follow_continuing_prefill_to_cpu():
    """A.1 step 5f: when the round's FIFO scan selects a continuing Prefill-to-CPU chunk first,
    later prompts of the round use the CPU destination too."""
    st = make_state(gpu=2, gpu_token_limit=8)
    p1 = gpu_waiting(st, make_req(12, 4))  # 3 blocks > 2: Prefill-to-CPU, chunks 8 + 4
    gpu_round(st)
    st.complete_copy_group(2.0)
    p2 = gpu_waiting(st, make_req(4, 4))  # 1 block would fit HBM
    plan = schedule(st)
    assert chunks(plan) == [(p1, 8, 4, True, True), (p2, 0, 4, True, True)]
