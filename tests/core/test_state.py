"""The shared state's running totals: kept up to date by the rounds, checked against a full
recomputation (`EngineState.check_invariants`, which the driver calls after every phase)."""

from __future__ import annotations

import random

import pytest

from dualpace_sim.core import SchedulerConfig

from .driver import Driver

# Small HBM and a row limit below the queue: swap-outs, swap-ins, Prefill-to-CPU prompts and
# rounds that decode only part of the GPU queue all happen, so every update path runs.
CONFIG = SchedulerConfig(gpu_kv_blocks=12, host_kv_blocks=400, block_size=4, gpu_max_rows=3,
                         gpu_token_limit=24, gpu_hard_token_limit=3, staging_blocks=16,
                         cpu_batch_limit=3, route_p=0, route_f=0)
LENGTHS = [(5 + 7 * i % 23, 3 + 5 * i % 17) for i in range(24)]


def run_part_way(seed: int, steps: int) -> Driver:
    d = Driver(CONFIG, LENGTHS)
    rng = random.Random(seed)
    for _ in range(steps):
        d.do(rng.choice(d.actions()))
    return d


@pytest.mark.parametrize("seed", range(6))
def test_the_totals_match_a_recomputation_after_every_phase(seed):
    """Every phase of a run through evictions, swap-ins, Prefill-to-CPU and partial rounds
    leaves the totals equal to their full sums (the driver checks after each phase)."""
    d = Driver(CONFIG, LENGTHS)
    d.run(random.Random(seed))
    kinds = {kind for r in d.requests for _, kind in r.migrations}
    assert {"swap_out", "swap_in", "prefill_to_cpu"} <= kinds
    assert any(0 < len(p.decodes) < 3 for p in d.gpu_plans), "no partial GPU round ran"
    st = d.state
    assert (st.gpu_context, st.gpu_growing, st.waiting_growth, st.gpu_queue_peak) == (0, [], 0, 0)


@pytest.mark.parametrize("total, bump", [
    ("gpu_context", 1), ("waiting_growth", 1), ("gpu_queue_peak", -1),
])
def test_a_drifting_total_is_caught(total, bump):
    d = run_part_way(0, 120)
    st = d.state
    st.check_invariants()
    setattr(st, total, getattr(st, total) + bump)
    with pytest.raises(AssertionError):
        st.check_invariants()


def test_a_growing_list_out_of_step_with_the_queue_is_caught():
    """The growing requests must be exactly those whose next step needs a block, in queue
    order: the commit allocates in that order, so block ids stay those of a full scan."""
    for steps in range(40, 400):
        d = run_part_way(1, steps)
        st = d.state
        if st.gpu_growing:
            break
    else:
        pytest.fail("the queue never had a request waiting for a block")
    st.check_invariants()
    missing = st.gpu_growing.pop()
    with pytest.raises(AssertionError, match="GPU growing"):
        st.check_invariants()
    st.gpu_growing.append(missing)
    st.check_invariants()
    if len(st.gpu_growing) > 1:
        st.gpu_growing.reverse()
        with pytest.raises(AssertionError, match="GPU growing"):
            st.check_invariants()


def test_a_mark_anywhere_but_on_a_cpu_owned_request_is_caught():
    """Marks live only in EngineState.marked: one on a GPU-owned or finished request, or under
    another id, fails the invariant check."""
    d, rng = Driver(CONFIG, LENGTHS), random.Random(0)
    st = d.state
    for _ in range(20_000):
        d.do(rng.choice(d.actions()))
        if st.gpu_running and st.finished and st.cpu_running:
            break
    else:
        pytest.fail("the run never had GPU-running, CPU-running and finished requests at once")
    st.check_invariants()
    for r in (st.gpu_running[0], st.finished[0]):
        st.marked[r.req_id] = r
        with pytest.raises(AssertionError, match="mark on request"):
            st.check_invariants()
        del st.marked[r.req_id]
    r = st.cpu_running[0]
    st.marked[r.req_id + 10_000] = r
    with pytest.raises(AssertionError, match="mark on request"):
        st.check_invariants()
