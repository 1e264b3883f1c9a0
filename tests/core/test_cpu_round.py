"""Unit tests of the CPU engine round (paper Appendix A.2), one rule per test.

Block size 4; `blocks/peak/growth` in comments are host blocks held, finish-peak b̂ and b̂ - b.
"""

from __future__ import annotations

from dualpace_sim.core import CpuResult, CpuScheduler, Owner, Route

from .factories import cpu_round, cpu_running, cpu_waiting, make_req, make_state, mark


def schedule(st):
    return CpuScheduler(st).schedule()


def commit(st, plan):
    CpuScheduler(st).commit(plan)
    st.check_invariants()


# --------------------------------------------------------------------------------- step 2


def test_step2_running_requests_retained_first_in_fifo_order():
    """A.2 step 2a: running requests are retained in FIFO order before any waiting request;
    at the batch limit the oldest running request keeps its place."""
    st = make_state(cpu_batch_limit=1)
    r1 = cpu_running(st, make_req(8, 8, 1))
    r2 = cpu_running(st, make_req(8, 8, 1))
    cpu_waiting(st, make_req(8, 8, 1))
    plan = schedule(st)
    assert plan.batch == [r1] and plan.held_back == [r2] and plan.admitted == 0


def test_step2_running_precede_admitted_waiting_in_batch():
    """A.2 steps 2a/3: with room for everyone the batch is the running requests in order
    followed by the waiting prefix."""
    st = make_state(cpu_batch_limit=3)
    r1 = cpu_running(st, make_req(8, 8, 1))
    r2 = cpu_running(st, make_req(8, 8, 1))
    w = cpu_waiting(st, make_req(8, 8, 1))
    plan = cpu_round(st)
    assert plan.batch == [r1, r2, w] and plan.admitted == 1
    assert st.cpu_running == [r1, r2, w] and not st.cpu_waiting


def test_step2_marked_running_request_yielded_and_nothing_admitted():
    """A.2 step 2b: a running request marked for swap-in is yielded to the front of the CPU
    waiting queue with its host KV kept, and no waiting request is admitted that round."""
    st = make_state()
    r1 = cpu_running(st, make_req(8, 8, 1))
    r2 = mark(st, cpu_running(st, make_req(8, 8, 1)))
    w = cpu_waiting(st, make_req(8, 8, 1))
    plan = schedule(st)
    assert plan.batch == [r1] and plan.held_back == [r2] and plan.admitted == 0
    commit(st, plan)
    assert list(st.cpu_waiting) == [r2, w] and st.cpu_running == [r1]
    assert r2.req_id in st.marked and r2.owner is Owner.CPU and len(r2.blocks) == 2
    assert st.host.used == 3 + 2 + 2


def test_step2_envelope_boundary_moves_running_suffix_to_waiting_front():
    """A.2 step 2c: when the host envelope incl. B_migration is hit, the whole unscheduled
    running suffix (even a later request that would fit) moves, in order, to the front of the
    waiting queue, and no waiting request is admitted. (The core's envelope reserves the
    waiting requests' growth too, docs/liveness.md, so it never publishes such a B_migration;
    the CPU round's own budget is the paper's and must still hold.)"""
    st = make_state(host=30)
    r1 = cpu_running(st, make_req(8, 8, 1))  # 2/4/2
    r2 = cpu_running(st, make_req(8, 24, 1))  # 2/8/6
    r3 = cpu_running(st, make_req(4, 4, 1))  # 1/2/1
    w = cpu_waiting(st, make_req(4, 4, 1))  # 1/2/1
    st.b_migration = 20  # the GPU's reserve grew: budget 30 - 6 - 20 = 4
    plan = schedule(st)
    assert plan.batch == [r1] and plan.held_back == [r2, r3] and plan.admitted == 0
    CpuScheduler(st).commit(plan)
    assert list(st.cpu_waiting) == [r2, r3, w] and st.cpu_running == [r1]


def test_step2_batch_limit_moves_running_suffix_to_waiting_front():
    """A.2 step 2c: at the CPU batch limit the unscheduled running suffix moves, in order, to
    the front of the waiting queue ahead of older waiting work."""
    st = make_state(cpu_batch_limit=2)
    r1, r2, r3 = (cpu_running(st, make_req(8, 8, 1)) for _ in range(3))
    w = cpu_waiting(st, make_req(8, 8, 1))
    plan = cpu_round(st)
    assert plan.batch == [r1, r2] and plan.held_back == [r3]
    assert list(st.cpu_waiting) == [r3, w]


# --------------------------------------------------------------------------------- step 3


def test_step3_ready_waiting_prefix_admitted_under_budget():
    """A.2 step 3: the ready FIFO prefix of the waiting queue is admitted while its finish
    growth fits the envelope left after B_used and B_migration (20 - 3 - 13 = 4: two of 2).
    (A B_migration the core's envelope never publishes, as it reserves the waiting requests'
    growth: docs/liveness.md; the CPU round's budget is the paper's and must still hold.)"""
    st = make_state(host=20)
    w1, w2, w3 = (cpu_waiting(st, make_req(4, 8, 1)) for _ in range(3))  # 1/3/2 each
    st.b_migration = 13
    plan = schedule(st)
    assert plan.batch == [w1, w2] and plan.admitted == 2
    CpuScheduler(st).commit(plan)
    assert st.cpu_running == [w1, w2] and list(st.cpu_waiting) == [w3]


def test_step3_waiting_admission_respects_batch_limit():
    """A.2 step 3: waiting requests are admitted only up to the CPU batch limit."""
    st = make_state(cpu_batch_limit=2)
    cpu_running(st, make_req(8, 8, 1))
    w1 = cpu_waiting(st, make_req(8, 8, 1))
    cpu_waiting(st, make_req(8, 8, 1))
    plan = schedule(st)
    assert plan.batch[1:] == [w1] and plan.admitted == 1


# --------------------------------------------------------------------------------- step 4


def test_step4_unready_head_is_not_bypassed():
    """A.2 step 4: an unready head of the waiting queue is not bypassed for a later ready
    request; the engine waits on the head's readiness."""
    st = make_state()
    u = cpu_waiting(st, make_req(8, 8, 1), ready=False)
    cpu_waiting(st, make_req(8, 8, 1))
    plan = schedule(st)
    assert plan.batch == [] and plan.admitted == 0
    assert plan.wait_for is u


def test_step4_marked_head_is_left_for_the_gpu():
    """A.2 steps 2b/4: a yielded (marked) request at the waiting head is not re-admitted by the
    CPU; the engine waits for the GPU to take it."""
    st = make_state()
    m = mark(st, cpu_waiting(st, make_req(8, 8, 1)))
    plan = schedule(st)
    assert plan.batch == [] and plan.wait_for is m


# --------------------------------------------------------------------------------- step 5


def test_step5_commit_materializes_only_next_token_blocks():
    """A.2 step 5: commit allocates only the blocks for the next decode token (not the finish
    peak), and B_growth becomes Σ(b̂ - b) over the batch."""
    st = make_state(host=64)
    r = cpu_running(st, make_req(8, 32, 1))  # 2 blocks, needs 1, peak 10
    w = cpu_waiting(st, make_req(7, 12, 1))  # 2 blocks, needs 0, peak 5
    plan = schedule(st)
    commit(st, plan)
    assert len(r.blocks) == 3 and len(w.blocks) == 2 and st.host.used == 5
    assert st.cpu_growth == (10 - 3) + (5 - 2)


def test_step5_apply_releases_finished_requests_host_blocks():
    """A.2 step 5: apply records the tokens, releases the host KV of finished requests and
    keeps unfinished ones CPU-owned and running."""
    st = make_state(host=64)
    done = cpu_running(st, make_req(8, 2, 1))  # its next token is its last
    live = cpu_running(st, make_req(8, 8, 1))
    sched = CpuScheduler(st)
    plan = sched.schedule()
    sched.commit(plan)
    sched.apply(plan, CpuResult(5.0))
    st.check_invariants()
    assert done.finished and done.blocks == [] and st.finished == [done]
    assert st.cpu_running == [live] and live.owner is Owner.CPU
    assert st.host.used == len(live.blocks) == 3
    assert st.cpu_growth == live.peak_blocks - 3
    assert done.token_times[-1] == 5.0 and done.token_owners[-1] == Owner.CPU


def test_step5_plan_route_follows_routing_policy():
    """A.2 step 5 / Eq. 5: the CPU plan's post-attention route is π_{P,F} of its batch size."""
    st = make_state(route_p=2, route_f=1)
    cpu_running(st, make_req(8, 8, 1))
    cpu_running(st, make_req(8, 8, 1))
    assert schedule(st).route is Route.SPLIT_FINAL
    cpu_running(st, make_req(8, 8, 1))
    assert schedule(st).route is Route.FUSED_ASSIST
