"""The round protocol's drivers: each round's kind, what lands, and the journal they write."""

from __future__ import annotations

import pytest

from dualpace_sim.core import CpuScheduler, GpuScheduler, Owner
from dualpace_sim.core.journal import Journal, describe_gpu
from dualpace_sim.core.rounds import CpuDriver, GpuDriver, RoundKind, VllmDriver
from dualpace_sim.core.vllm import VllmConfig, VllmScheduler

from .factories import cpu_running, gpu_running, gpu_waiting, make_req, make_state


def calls(journal: Journal) -> list[tuple[float, str, str]]:
    return [(e.t, e.engine, e.call) for e in journal.entries]


def test_an_empty_state_begins_an_idle_round_and_commits_nothing():
    st = make_state()
    rnd = GpuDriver(GpuScheduler(st)).begin(0.0)
    assert rnd.kind is RoundKind.IDLE and rnd.idle and not rnd.lands and not rnd.moves.any


def test_a_round_behind_the_copy_group_waits_and_landing_hands_it_to_the_cpu():
    """A.1 step 1: the round after a Prefill-to-CPU prompt waits for its copies; `landed`
    completes the group, so the request becomes the CPU's, ready."""
    st = make_state(gpu=1, gpu_max_rows=1)
    p = gpu_waiting(st, make_req(8, 4))  # 2 blocks > 1 free: Prefill-to-CPU
    journal = Journal()
    gpu = GpuDriver(GpuScheduler(st), journal)
    first = gpu.begin(1.0)
    assert first.forward and [c.to_cpu for c in first.plan.prefills] == [True]
    gpu.end(first, 2.0)
    wait = gpu.begin(3.0)
    assert wait.kind is RoundKind.WAIT_FOR_COPIES and wait.lands
    assert p.owner is Owner.GPU and not p.ready
    gpu.landed(wait, 4.0)
    assert p.owner is Owner.CPU and p.ready and st.copy_group == []
    st.check_invariants()
    assert calls(journal) == [(1.0, "gpu", "schedule"), (2.0, "gpu", "apply"),
                              (3.0, "gpu", "schedule"), (4.0, "gpu", "copies_done")]
    assert journal.entries[2].data == {"plan": describe_gpu(wait.plan), "committed": False}


def test_a_swap_out_round_moves_blocks_and_flips_ownership_when_they_land():
    """A round whose victims leave HBM carries the commit's block moves; ownership flips only
    when the backend says the swaps landed."""
    st = make_state(gpu=4, host=64)
    gpu_running(st, make_req(8, 8, generated=1))  # 2 blocks held, 1 more for the next token
    r2 = gpu_running(st, make_req(8, 8, generated=1))  # the eviction tail: the victim
    gpu = GpuDriver(GpuScheduler(st))
    held = list(r2.blocks)
    rnd = gpu.begin(0.0)
    assert rnd.plan.swap_outs == [r2] and rnd.lands
    assert rnd.moves.swap_out == (held, r2.blocks)
    assert r2.owner is Owner.GPU and not r2.ready
    gpu.landed(rnd, 1.0)
    assert r2.owner is Owner.CPU and r2.ready and r2.migrations == [(1.0, "swap_out")]


def test_a_cpu_round_always_commits_and_ends_with_its_tokens():
    st = make_state()
    r = cpu_running(st, make_req(4, 8, generated=1))
    journal = Journal()
    cpu = CpuDriver(CpuScheduler(st), journal)
    rnd = cpu.begin(0.0)
    assert rnd.forward and rnd.plan.batch == [r]
    cpu.end(rnd, 1.0, {r.req_id: 7})
    assert r.generated == 2
    assert calls(journal) == [(0.0, "cpu", "schedule"), (1.0, "cpu", "apply")]
    assert journal.entries[1].data == {"tokens": {r.req_id: 7}}


def test_a_round_that_lands_nothing_refuses_landed():
    sched = VllmScheduler(VllmConfig(gpu_kv_blocks=8, block_size=4))
    sched.submit(make_req(4, 2))
    vllm = VllmDriver(sched)
    rnd = vllm.begin(0.0)
    assert rnd.forward and not rnd.lands
    with pytest.raises(ValueError, match="lands nothing"):
        vllm.landed(rnd, 1.0)
