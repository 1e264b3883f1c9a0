"""Liveness by construction: every request a policy's up-front check lets through finishes,
under any pool sizes, any interleaving of the two engines and any seed (docs/liveness.md).

The pools are drawn small: HBM as small as two blocks (for vLLM barely larger than the largest
request), DualPace's host barely larger than the largest request, so that the host fills with
waiting work, prompts go Prefill-to-CPU, and requests swap both ways. NEO treats its host as
swap space that it never bounds (BASELINES §A), so its host holds a GPU's worth and every
request's finish-peak; a host too small for that load stops the run with one line
(`NeoHostFull`). Each case's requests pass the same check a scenario gets
(`dualpace_sim.core.servable`), and each run must end with every request finished. CI draws
2,000 cases per policy; ``pytest -m nightly tests/core/test_liveness.py`` draws 20,000.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpace_sim.core import SchedulerConfig, blocks_for
from dualpace_sim.core.neo import NeoConfig, NeoHostFull
from dualpace_sim.core.servable import dualpace_refusal, neo_refusal, vllm_refusal
from dualpace_sim.core.vllm import VllmConfig

from .driver import Driver
from .test_baseline_properties import _check_finished, run_neo, run_vllm
from .test_neo import LinearPredictor

CI_EXAMPLES, NIGHTLY_EXAMPLES = 2_000, 20_000


def examples(n: int):
    return settings(max_examples=n, deadline=None, derandomize=n == CI_EXAMPLES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@st.composite
def dualpace_cases(draw):
    bs = draw(st.sampled_from([4, 8, 16]))
    reqs = draw(st.lists(st.tuples(st.integers(1, 120), st.integers(1, 40)), min_size=1,
                         max_size=12))
    biggest = max(blocks_for(p + m, bs) for p, m in reqs)
    p = draw(st.integers(0, 6))
    config = SchedulerConfig(
        gpu_kv_blocks=draw(st.integers(2, biggest * 3)),
        host_kv_blocks=biggest + draw(st.integers(0, biggest)),  # barely one request and up
        block_size=bs,
        gpu_max_rows=draw(st.integers(1, 8)),
        gpu_token_limit=draw(st.integers(8, 96)),
        gpu_hard_token_limit=draw(st.integers(8, 256)),
        staging_blocks=draw(st.integers(blocks_for(120, bs), 2 * blocks_for(120, bs))),
        cpu_batch_limit=draw(st.integers(1, 6)),
        host_max_requests=draw(st.integers(1, 30)),
        route_p=p,
        route_f=draw(st.integers(0, max(0, p - 1))) if p else 0,
    )
    assert all(dualpace_refusal(config, p, m) is None for p, m in reqs)
    return config, reqs, draw(st.integers(0, 2**32 - 1))


@st.composite
def vllm_cases(draw):
    bs = draw(st.sampled_from([1, 4, 8, 16]))
    reqs = draw(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30), st.integers(0, 3)),
                         min_size=1, max_size=12))
    biggest = max(blocks_for(p + m, bs) for p, m, _ in reqs)
    config = VllmConfig(gpu_kv_blocks=biggest + draw(st.integers(0, 2)), block_size=bs,
                        max_num_batched_tokens=draw(st.integers(1, 64)),
                        max_num_seqs=draw(st.integers(1, 8)))
    assert all(vllm_refusal(config, p, m) is None for p, m, _ in reqs)
    return config, reqs


@st.composite
def neo_cases(draw):
    bs = draw(st.sampled_from([4, 8, 16]))
    gpu = draw(st.integers(2, 40))
    swap_in = round(0.95 * gpu)
    reqs = []
    for _ in range(draw(st.integers(1, 12))):
        tokens = draw(st.integers(2, max(2, swap_in * bs)))  # the finish-peak fits swap-in
        p = draw(st.integers(1, tokens - 1))
        reqs.append((p, tokens - p, draw(st.integers(0, 3))))
    peaks = sum(blocks_for(p + m, bs) for p, m, _ in reqs)
    config = NeoConfig(
        gpu_kv_blocks=gpu,
        host_kv_blocks=gpu + peaks + draw(st.integers(0, 3)),
        block_size=bs,
        max_batch_size=draw(st.integers(1, 8)),
        max_tokens_in_batch=max(p for p, _, _ in reqs) + draw(st.integers(0, 64)),
        linr_s_threshold=draw(st.integers(0, 256)),
    )
    coeff = st.sampled_from([0.0, 0.01, 0.1, 1.0])
    pred = LinearPredictor(a=draw(st.sampled_from([0.5, 2.0, 10.0])), b=draw(coeff),
                           c=draw(coeff), d=draw(coeff), e=draw(coeff),
                           lnch_T=draw(st.sampled_from([0.0, 0.8, 5.0])))
    assert all(neo_refusal(config, p, m) is None for p, m, _ in reqs)
    return config, pred, reqs


def check_dualpace(case) -> None:
    config, reqs, seed = case
    d = Driver(config, reqs)
    d.run(random.Random(seed))  # raises if a request is still unfinished after 200,000 steps
    for r in d.requests:
        assert r.finished and r.generated == r.max_tokens, r.req_id
    assert d.state.hbm.used == 0 and d.state.host.used == 0


def check_vllm(case) -> None:
    config, reqs = case
    _, requests, _ = run_vllm(config, reqs)  # raises past its liveness bound
    _check_finished(requests)


def check_neo(case) -> None:
    config, pred, reqs = case
    _, requests, _ = run_neo(config, pred, reqs)  # raises past its liveness bound
    _check_finished(requests)


@examples(CI_EXAMPLES)
@given(dualpace_cases())
def test_dualpace_finishes_every_admissible_request(case):
    """DualPace: invariants after every step (the driver checks them, the host envelope with
    every host-bound request's growth included), and every request finishes."""
    check_dualpace(case)


@examples(CI_EXAMPLES)
@given(vllm_cases())
def test_vllm_finishes_every_admissible_request(case):
    check_vllm(case)


@examples(CI_EXAMPLES)
@given(neo_cases())
def test_neo_finishes_every_admissible_request(case):
    check_neo(case)


@pytest.mark.nightly
@examples(NIGHTLY_EXAMPLES)
@given(dualpace_cases())
def test_dualpace_liveness_nightly(case):
    check_dualpace(case)


@pytest.mark.nightly
@examples(NIGHTLY_EXAMPLES)
@given(vllm_cases())
def test_vllm_liveness_nightly(case):
    check_vllm(case)


@pytest.mark.nightly
@examples(NIGHTLY_EXAMPLES)
@given(neo_cases())
def test_neo_liveness_nightly(case):
    check_neo(case)


def test_the_two_request_deadlock_of_appendix_a_finishes():
    """The minimal case of Appendix A's deadlock: two simultaneous 592 + 200-token requests,
    HBM of 4 blocks, a host of 76. As written, both are admitted Prefill-to-CPU (37 + 37 of 76
    blocks) and neither's growth (13) fits what is left; every interleaving must finish."""
    config = SchedulerConfig(gpu_kv_blocks=4, host_kv_blocks=76, block_size=16,
                             gpu_token_limit=2048, cpu_batch_limit=8, route_p=0, route_f=0)
    for seed in range(20):
        check_dualpace((config, [(592, 200), (592, 200)], seed))


def test_neo_overflowing_its_host_says_so():
    """A host of one GPU's worth and one prompt is too small for NEO's swap-outs and CPU
    decodes here: the iteration that would overflow it raises NeoHostFull, naming the field."""
    config = NeoConfig(gpu_kv_blocks=4, host_kv_blocks=5, block_size=4, max_batch_size=3,
                       max_tokens_in_batch=5, linr_s_threshold=0)
    reqs = [(1, 10, 0), (4, 10, 0), (1, 6, 3)] + [(1, 1, 0)] * 9
    assert all(neo_refusal(config, p, m) is None for p, m, _ in reqs)
    with pytest.raises(NeoHostFull, match="enlarge scheduler.host_kv_blocks"):
        run_neo(config, LinearPredictor(a=0.5, b=0.0, c=0.0, d=0.0, e=0.0, lnch_T=0.0), reqs)
