"""Property-based tests of the two baselines (vLLM v1, NEO) over random workloads and capacities.

Each case is driven to completion by a simple engine loop (arrivals due at step k are submitted,
then schedule -> apply at time k + 1), calling the scheduler's `check_invariants()` after every
phase. Capacities are chosen so that liveness is guaranteed, and the loop must end within a
bound derived from that guarantee:

- vLLM: every request's finish-peak fits HBM, so the head of `running` is never preempted and
  gains >= 1 computed token per step; steps <= last arrival + Σ (prompt + max_tokens).
- NEO: every finish-peak fits 95% of the GPU pool, every prompt fits the token budget, and the
  host holds 2 x GPU + Σ peaks; then an iteration with any request present always has GPU work
  (a GPU decode, a swap-in, or a GPU prefill), so it emits >= 1 token; steps <= last arrival +
  Σ max_tokens.
"""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpace_sim.core import GpuResult, Request, blocks_for
from dualpace_sim.core.neo import NeoConfig, NeoScheduler, SubBatch, layer_time
from dualpace_sim.core.vllm import VllmConfig, VllmScheduler

from .test_neo import LinearPredictor

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DETERMINISM = settings(max_examples=60, deadline=None,
                       suppress_health_check=[HealthCheck.too_slow])


def _arrivals(reqs, bs):
    """(step, Request) pairs from (prompt, max_tokens, gap) triples; gaps in steps."""
    out, k = [], 0
    for i, (p, m, gap) in enumerate(reqs):
        k += gap
        out.append((k, Request.create(i, float(k), p, m, bs)))
    return out


def _check_finished(requests) -> None:
    for r in requests:
        assert r.finished and r.generated == r.max_tokens, r.req_id
        assert all(x < y for x, y in itertools.pairwise(r.token_times)), "times not increasing"
        assert r.token_times[0] > r.arrival_s and r.blocks == []


# --------------------------------------------------------------------------------- vLLM


@st.composite
def vllm_cases(draw):
    reqs = draw(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30), st.integers(0, 3)),
                         min_size=1, max_size=12))
    bs = draw(st.sampled_from([1, 4, 8, 16]))
    peaks = [blocks_for(p + m, bs) for p, m, _ in reqs]
    gpu = draw(st.integers(max(peaks), max(max(peaks), sum(peaks))))
    config = VllmConfig(gpu_kv_blocks=gpu, block_size=bs,
                        max_num_batched_tokens=draw(st.integers(1, 64)),
                        max_num_seqs=draw(st.integers(1, 8)))
    return config, reqs


def run_vllm(config: VllmConfig, reqs):
    s = VllmScheduler(config)
    pending = _arrivals(reqs, config.block_size)
    requests = [r for _, r in pending]
    bound = pending[-1][0] + sum(p + m for p, m, _ in reqs)
    emitted = {id(r): 0 for r in requests}  # emission events seen by the loop
    k = 0
    while pending or len(s.finished) < len(requests):
        assert k <= bound, f"not finished after {k} steps"
        while pending and pending[0][0] <= k:
            s.submit(pending.pop(0)[1])
        s.check_invariants()
        t = float(k + 1)
        plan = s.schedule(t)
        s.check_invariants()
        rows = plan.decodes + [c.req for c in plan.prefills]
        assert len(rows) == len(set(map(id, rows))), "a request scheduled twice in one step"
        assert all(c.tokens >= 1 for c in plan.prefills)
        assert plan.n_tokens <= config.max_num_batched_tokens
        assert len(s.running) <= config.max_num_seqs
        assert all(r in s.running for r in rows)
        before = {id(r): r.generated for r in rows}
        s.apply(plan, GpuResult(t))
        s.check_invariants()
        for r in rows:
            # A step emits one token exactly when the request caught up with all its tokens.
            caught_up = r.computed == r.prompt_tokens + before[id(r)]
            assert r.generated - before[id(r)] == (1 if caught_up else 0), r.req_id
            assert r.computed < r.prompt_tokens + r.generated
            emitted[id(r)] += r.generated - before[id(r)]
        k += 1
    assert all(emitted[id(r)] == r.max_tokens for r in requests), "a token emitted twice"
    return s, requests, k


@SETTINGS
@given(vllm_cases())
def test_vllm_every_request_finishes_with_exactly_max_tokens(case):
    """vLLM v1: invariants after every step; every request ends with exactly max_tokens tokens
    at strictly increasing times (no token twice, even across recompute preemptions); the
    loop ends within the liveness bound and HBM is empty at the end."""
    config, reqs = case
    s, requests, _ = run_vllm(config, reqs)
    _check_finished(requests)
    assert s.hbm.used == 0 and not s.running and not s.waiting
    assert sorted(r.req_id for r in s.finished) == list(range(len(reqs)))


@DETERMINISM
@given(vllm_cases())
def test_vllm_is_deterministic(case):
    """vLLM v1: the same workload and configuration give the same token times and
    preemptions."""
    config, reqs = case

    def trace():
        _, requests, steps = run_vllm(config, reqs)
        return steps, [(r.token_times, r.migrations) for r in requests]

    assert trace() == trace()


# --------------------------------------------------------------------------------- NEO


@st.composite
def neo_cases(draw):
    bs = draw(st.sampled_from([4, 8, 16]))
    gpu = draw(st.integers(2, 40))
    room = round(0.95 * gpu) * bs  # tokens under the swap-in threshold
    n = draw(st.integers(1, 12))
    reqs = []
    for _ in range(n):
        p = draw(st.integers(1, min(200, room - 1)))
        m = draw(st.integers(1, min(40, room - p)))
        reqs.append((p, m, draw(st.integers(0, 3))))
    peaks = [blocks_for(p + m, bs) for p, m, _ in reqs]
    max_prompt = max(p for p, _, _ in reqs)
    config = NeoConfig(
        gpu_kv_blocks=gpu,
        host_kv_blocks=2 * gpu + sum(peaks) + draw(st.integers(0, 20)),
        block_size=bs,
        max_batch_size=draw(st.integers(1, 8)),
        max_tokens_in_batch=max_prompt + draw(st.integers(0, 64)),
        linr_s_threshold=draw(st.integers(0, 256)),
    )
    coeff = st.sampled_from([0.0, 0.01, 0.1, 1.0])
    pred = LinearPredictor(a=draw(st.sampled_from([0.5, 2.0, 10.0])), b=draw(coeff),
                           c=draw(coeff), d=draw(coeff), e=draw(coeff),
                           lnch_T=draw(st.sampled_from([0.0, 0.8, 5.0])))
    return config, pred, reqs


def _check_neo_plan(s: NeoScheduler, config: NeoConfig, plan) -> None:
    assert not (plan.swap_outs and plan.swap_ins), "swap-in in a swap-out iteration"
    assert len(plan.batches) <= 2
    rows = [r for b in plan.batches
            for r in b.gpu_prefills + b.cpu_prefills + b.gpu_decodes + b.cpu_decodes]
    assert len(rows) == len(set(map(id, rows))), "a request twice in one iteration"
    assert sum(len(b) for b in plan.batches) <= config.max_batch_size
    assert sum(b.width for b in plan.batches) <= config.max_tokens_in_batch
    if plan.batches:
        b0 = plan.batches[0]
        assert b0.gpu_decodes or b0.prefills, "an iteration without GPU work"
    if plan.pipelined:
        b1 = plan.batches[1]
        assert b1.cpu_decodes and not (b1.gpu_decodes or b1.prefills)
    # GPU decodes always run: every request now in gpu_q is in the iteration.
    assert all(r in rows for r in s.gpu_q) if plan.batches else not s.gpu_q
    assert all(r in s.cpu_q for b in plan.batches for r in b.cpu_decodes)
    assert s.hbm.used <= config.gpu_kv_blocks and s.host.used <= config.host_kv_blocks


def run_neo(config: NeoConfig, pred: LinearPredictor, reqs):
    s = NeoScheduler(config, pred)
    pending = _arrivals(reqs, config.block_size)
    requests = [r for _, r in pending]
    bound = pending[-1][0] + sum(m for _, m, _ in reqs)
    k, t = 0, 0.0
    kinds = set()
    while pending or len(s.finished) < len(requests):
        assert k <= bound, f"not finished after {k} iterations"
        while pending and pending[0][0] <= k:
            s.submit(pending.pop(0)[1])
        now = max(t, float(k))
        plan = s.schedule(now)
        s.check_invariants()
        _check_neo_plan(s, config, plan)
        kinds.add(len(plan.batches))
        t = now + 1.0 + layer_time(plan, pred)  # the iteration ends after its predicted time
        before = {id(r): r.generated for r in requests}
        s.apply(plan, t)
        s.check_invariants()
        rows = {id(r) for b in plan.batches for r in b.prefills + b.gpu_decodes + b.cpu_decodes}
        for r in requests:  # exactly one token per scheduled request, none for the others
            assert r.generated - before[id(r)] == (id(r) in rows), r.req_id
        k += 1
    return s, requests, kinds


@SETTINGS
@given(neo_cases())
def test_neo_every_request_finishes_with_exactly_max_tokens(case):
    """NEO: invariants after every iteration (single queue per request, pool accounting,
    owners), per-iteration limits, GPU decodes always in the iteration, no swap-in in a
    swap-out iteration; every request ends with exactly max_tokens tokens at strictly
    increasing times within the liveness bound, and both pools are empty at the end."""
    config, pred, reqs = case
    s, requests, _ = run_neo(config, pred, reqs)
    _check_finished(requests)
    assert s.hbm.used == 0 and s.host.used == 0
    assert not (s.waiting or s.gpu_q or s.cpu_q)


@DETERMINISM
@given(neo_cases())
def test_neo_is_deterministic(case):
    """NEO: the same workload, configuration and predictor give the same token times, token
    owners and migrations."""
    config, pred, reqs = case

    def trace():
        _, requests, _ = run_neo(config, pred, reqs)
        return [(r.token_times, bytes(r.token_owners), r.migrations) for r in requests]

    assert trace() == trace()


class SawtoothPredictor(LinearPredictor):
    """linr_T(s) = a + b * (s % 3): positive but not monotone, so a CPU decode can also sink
    the other sub-batch's slack after earlier ones were admitted."""

    def linr_T(self, width: int) -> float:
        return self.a + self.b * (width % 3)


class FullWalkNeo(NeoScheduler):
    """NEO's candidate walk as NEO's code runs it: every CPU-queue request shorter than the
    last rejected one is tried, also after the other sub-batch's slack has failed."""

    def _scan_cpu_queue(self, b0, budget):
        p, b1 = self.p, SubBatch()
        batches, nxt, min_out = (b0, b1), 1, None
        for r in self.cpu_q:
            if not budget.take(1):
                break
            if min_out is not None and r.kv_tokens_after_step >= min_out:
                budget.refund(1)
                continue
            batches[nxt].add_cpu_decode(r)
            rem = (p.linr_T(b1.width) + b0.gpu_attn(p) - b0.cpu_time(p),
                   p.linr_T(b0.width) + b1.gpu_attn(p) - b1.cpu_time(p))
            if min(rem) < 0:
                batches[nxt].pop_cpu_decode()
                budget.refund(1)
                min_out = r.kv_tokens_after_step
            else:
                nxt = 1 if rem[1] > rem[0] else 0
        return b1


def _plan_rows(plan) -> tuple:
    lists = [[b.gpu_prefills, b.cpu_prefills, b.gpu_decodes, b.cpu_decodes]
             for b in plan.batches] + [[plan.swap_outs, plan.swap_ins]]
    return tuple(tuple(r.req_id for r in rs) for group in lists for rs in group)


@SETTINGS
@given(neo_cases(), st.booleans())
def test_neo_scan_decides_as_the_full_walk(case, sawtooth):
    """NEO's scan stops once the other sub-batch's slack fails; every iteration (its batches,
    their requests, swaps and layer time) is the one the full walk over the CPU queue gives."""
    config, pred, reqs = case
    if sawtooth:
        pred = SawtoothPredictor(**dataclasses.asdict(pred))
    bound = sum(gap for _, _, gap in reqs) + sum(m for _, m, _ in reqs)  # as in run_neo
    runs = []
    for cls in (NeoScheduler, FullWalkNeo):
        s, pending, plans, t = cls(config, pred), _arrivals(reqs, config.block_size), [], 0.0
        for k in itertools.count():
            if not pending and len(s.finished) == len(reqs):
                break
            assert k <= bound, f"not finished after {k} iterations"
            while pending and pending[0][0] <= k:
                s.submit(pending.pop(0)[1])
            plan = s.schedule(max(t, float(k)))
            s.check_invariants()
            t = max(t, float(k)) + 1.0 + layer_time(plan, pred)
            plans.append((_plan_rows(plan), layer_time(plan, pred)))
            s.apply(plan, t)
            s.check_invariants()
        runs.append(plans)
    assert runs[0] == runs[1]
