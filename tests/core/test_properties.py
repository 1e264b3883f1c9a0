"""Property-based tests of the scheduler invariants over random workloads and capacities."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpace_sim.core import Owner, SchedulerConfig

from .driver import Driver

lengths = st.lists(
    st.tuples(st.integers(1, 120), st.integers(1, 40)), min_size=1, max_size=25
)


@st.composite
def scenarios(draw):
    """Random lengths and limits over a roomy host, one that holds every request's finish-peak
    at once (test_liveness draws hosts as small as one request)."""
    reqs = draw(lengths)
    bs = draw(st.sampled_from([4, 8, 16]))
    peaks = [-(-(p + m) // bs) for p, m in reqs]
    biggest = max(peaks)
    gpu = draw(st.integers(max(2, biggest // 3), biggest * 4))
    host = draw(st.integers(sum(peaks), sum(peaks) * 2))
    p = draw(st.integers(0, 6))
    f = draw(st.integers(0, max(0, p - 1))) if p else 0
    config = SchedulerConfig(
        gpu_kv_blocks=gpu,
        host_kv_blocks=host,
        block_size=bs,
        gpu_max_rows=draw(st.integers(1, 8)),
        gpu_token_limit=draw(st.integers(8, 96)),
        gpu_hard_token_limit=draw(st.integers(8, 256)),
        staging_blocks=draw(st.integers(biggest, biggest * 2)),
        cpu_batch_limit=draw(st.integers(1, 6)),
        host_max_requests=draw(st.integers(1, 30)),
        route_p=p,
        route_f=f,
    )
    return config, reqs, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_finishes_once_with_single_ownership(case):
    """Invariants hold after every commit/apply (single ownership, HBM and host pools never
    over-allocated, the Eq. 2 envelope), and every request ends with exactly max_tokens tokens."""
    config, reqs, seed = case
    d = Driver(config, reqs)
    d.run(random.Random(seed))
    for r in d.requests:
        assert r.finished and r.generated == r.max_tokens, r.req_id
        assert r.token_times == sorted(r.token_times)
        assert len(set(r.token_times)) == len(r.token_times), "a token emitted twice"
    assert d.state.hbm.used == 0 and d.state.host.used == 0


@settings(max_examples=40, deadline=None)
@given(scenarios())
def test_same_seed_same_decisions(case):
    """The core is deterministic: the same interleaving gives the same tokens and migrations."""
    config, reqs, seed = case

    def trace():
        d = Driver(config, reqs)
        d.run(random.Random(seed))
        return [(r.token_times, bytes(r.token_owners), r.migrations) for r in d.requests]

    assert trace() == trace()


def test_host_tier_is_used_when_hbm_is_small():
    """With HBM for one request at a time, later prompts go Prefill-to-CPU and decode there."""
    config = SchedulerConfig(gpu_kv_blocks=4, host_kv_blocks=200, block_size=16,
                             gpu_token_limit=512, cpu_batch_limit=8, route_p=0, route_f=0)
    d = Driver(config, [(40, 10)] * 6)
    d.run(random.Random(1))
    owners = b"".join(bytes(r.token_owners) for r in d.requests)
    assert Owner.CPU in owners and Owner.GPU in owners
    assert any(kind == "prefill_to_cpu" for r in d.requests for _, kind in r.migrations)
