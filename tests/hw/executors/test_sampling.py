"""Seeded sampling: the hash is splitmix64's, its uniforms are uniform, a draw follows the
filtered softmax (temperature, top-k, top-p) and never leaves it, and a batch samples as its
rows would one by one, greedy rows untouched."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dualpace_hw.executors.sampling import (
    CANDIDATES,
    SamplingParams,
    filtered,
    mix64,
    perturb,
    sample,
    uniform,
)

LOGITS = torch.tensor([[0.0, 1.0, 2.0, -1.0, 0.5, -3.0, 1.0, 0.25]])
DRAWS = 6000


def test_mix64_is_splitmix64():
    # splitmix64 seeded 0: the first two outputs mix the state after one and two golden steps
    golden = 0x9E3779B97F4A7C15
    assert mix64(golden) == 0xE220A8397B1DCDAF
    assert mix64(2 * golden) == 0x6E789E6AA1B965F4


def test_uniforms_are_uniform_open_and_differ_by_seed_and_position():
    us = [uniform(7, pos) for pos in range(20_000)]
    assert all(0.0 < u < 1.0 for u in us)
    assert stats.kstest(us, "uniform").pvalue > 1e-3
    assert len({uniform(s, p) for s in range(30) for p in range(30)}) == 900


def frequencies(params: SamplingParams) -> torch.Tensor:
    counts = torch.zeros(LOGITS.shape[1])
    for pos in range(DRAWS):
        counts[sample(LOGITS, [(params, pos)])[0]] += 1
    return counts


def reference_filtered(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """One row, filtered the plain way: top-k by value, then the top-p nucleus of the rest."""
    x = logits.float() / p.temperature
    if 0 < p.top_k < x.numel():
        x = x.masked_fill(x < torch.topk(x, p.top_k).values[-1], float("-inf"))
    if p.top_p < 1.0:
        order = torch.argsort(x, descending=True, stable=True)
        probs = torch.softmax(x[order], dim=-1)
        outside = order[torch.cumsum(probs, dim=-1) - probs >= p.top_p]
        x = x.clone()
        x[outside] = float("-inf")
    return x


@pytest.mark.parametrize("params", [SamplingParams(1.0, seed=3), SamplingParams(0.5, seed=4),
                                    SamplingParams(1.0, top_k=3, seed=5),
                                    SamplingParams(1.2, top_p=0.7, seed=6),
                                    SamplingParams(0.8, top_p=0.9, top_k=4, seed=7)])
def test_draws_follow_the_filtered_softmax_and_never_leave_it(params):
    want = torch.softmax(reference_filtered(LOGITS[0], params), dim=-1)
    got = frequencies(params)
    assert (got[want == 0] == 0).all()
    kept = want > 0
    chi = stats.chisquare(got[kept].numpy(), (want[kept] * DRAWS).numpy())
    assert chi.pvalue > 1e-3, (got / DRAWS, want)


rows_params = st.one_of(
    st.none(),
    st.builds(SamplingParams, st.floats(0.05, 3.0), st.sampled_from([1.0, 0.95, 0.5, 0.1]),
              st.sampled_from([0, 1, 3, 50]), st.integers(0, 1 << 62)))


@settings(max_examples=40, deadline=None)
@given(st.lists(rows_params, min_size=1, max_size=6), st.integers(0, 1 << 20))
def test_a_batch_samples_as_its_rows_do_alone_and_leaves_greedy_rows(params, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(params), 64, generator=g).to(torch.bfloat16)
    rows = [None if p is None else (p, 10 + i) for i, p in enumerate(params)]
    out = perturb(logits, rows)
    assert out.dtype == logits.dtype
    alone = [sample(logits[i:i + 1], [row])[0] for i, row in enumerate(rows)]
    assert out.argmax(dim=-1).tolist() == alone == sample(logits, rows)
    for i, p in enumerate(params):
        if p is None:
            assert torch.equal(out[i], logits[i])
        else:
            assert torch.equal(filtered(logits[i:i + 1], [p])[0],
                               reference_filtered(logits[i], p))


def kept_near_boundary(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Tokens whose place in the nucleus float rounding may decide: the mass before them
    within 1e-5 of top_p."""
    x = reference_filtered(logits, SamplingParams(p.temperature, 1.0, p.top_k, p.seed))
    order = torch.argsort(x, descending=True, stable=True)
    probs = torch.softmax(x[order], dim=-1)
    near = torch.zeros_like(x, dtype=torch.bool)
    near[order] = ((torch.cumsum(probs, dim=-1) - probs) - p.top_p).abs() < 1e-5
    return near


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["peaked", "flat", "ties"]), rows_params.filter(lambda p: p is not None),
       st.integers(0, 1 << 20))
def test_a_row_filtered_over_its_candidates_is_filtered_as_by_a_whole_sort(shape, p, seed):
    # 4x the candidates: peaked rows end inside them; flat ones, and ties at the lowest
    # candidate's logit, need the whole row
    g = torch.Generator().manual_seed(seed)
    n = 4 * CANDIDATES
    logits = {"peaked": torch.randn(n, generator=g) * 4,
              "flat": torch.randn(n, generator=g) * 0.01,
              "ties": torch.randint(0, 3, (n,), generator=g).float()}[shape]
    got = filtered(logits[None], [p])[0]
    want = reference_filtered(logits, p)
    sure = ~kept_near_boundary(logits, p)
    assert torch.equal(got.isinf()[sure], want.isinf()[sure])
    assert torch.equal(got[sure & ~want.isinf()], want[sure & ~want.isinf()])
