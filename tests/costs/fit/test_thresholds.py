"""The routing thresholds (P, F): the route scores of Eq. 6-8 and Algorithm 1 over them."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpace_sim.core.routing import check_thresholds, route_for
from dualpace_sim.costs.fit.thresholds import (
    FULL,
    FUSED,
    SPLIT,
    choose_thresholds,
    route_scores,
    shift_assist_wait,
    threshold_candidates,
)

# --- Algorithm 1 ---------------------------------------------------------------------------------


def test_epsilon_window_admits_a_worse_score_with_fewer_calls():
    # B = [1, 2]: (2, 0) = Split, Split is the exact minimum; (2, 1) = Full, Split is 0.1% dearer
    # and makes half the assist calls.
    scores = {FULL: [100.2, 100.0], SPLIT: [100.0, 100.0], FUSED: [200.0, 200.0]}
    exact = choose_thresholds([1, 2], scores, n_layers=10, epsilon=0.0)
    assert (exact.p, exact.f) == (2, 0) and exact.regret == 0
    tight = choose_thresholds([1, 2], scores, n_layers=10, epsilon=0.0005)
    assert (tight.p, tight.f) == (2, 0)
    loose = choose_thresholds([1, 2], scores, n_layers=10, epsilon=0.0025)
    assert (loose.p, loose.f) == (2, 1)
    assert (loose.best.p, loose.best.f) == (2, 0)
    assert loose.regret == pytest.approx(0.001)
    assert loose.avg_calls == 0.5


def test_fewest_calls_then_lowest_score_even_over_a_lower_p():
    # N = 2, B = [1, 2, 3]. Window (ε = 5%): (2, 0) score 9.7 with 4/3 calls, (3, 0) score 10.0
    # and (2, 1) score 10.033 both with 1 call. Fewest calls drops (2, 0); the lower score then
    # picks (3, 0) although (2, 1) has the lower P.
    scores = {FULL: [11.0, 100.0, 100.0], SPLIT: [10.0, 10.0, 10.0], FUSED: [20.0, 20.0, 9.1]}
    choice = choose_thresholds([1, 2, 3], scores, n_layers=2, epsilon=0.05)
    window = {(c.p, c.f): c for c in choice.window}
    assert set(window) == {(2, 0), (3, 0), (2, 1)}
    assert window[(2, 0)].avg_calls == pytest.approx(4 / 3)
    assert window[(3, 0)].avg_calls == window[(2, 1)].avg_calls == 1
    assert (choice.best.p, choice.best.f) == (2, 0)
    assert (choice.p, choice.f) == (3, 0)
    assert choice.score == pytest.approx(10.0)


def test_lowest_p_breaks_a_tie_of_calls_and_score():
    # N = 1: Split-Final and Fused-Assist both make one call; all scores equal.
    flat = {FULL: [5.0, 5.0], SPLIT: [1.0, 1.0], FUSED: [1.0, 1.0]}
    choice = choose_thresholds([1, 2], flat, n_layers=1, epsilon=0.0)
    assert {(c.p, c.f) for c in choice.window} == {(0, 0), (1, 0), (2, 0)}
    assert (choice.p, choice.f) == (0, 0)
    # Fused-Assist is bad at b = 2, so P must be 2; (2, 0) and (2, 1) then tie on calls and score
    # (with every route counted as one call) and the lower F wins.
    scores = {FULL: [1.0, 1.0], SPLIT: [1.0, 1.0], FUSED: [1.0, 100.0]}
    same_calls = {FULL: 1, SPLIT: 1, FUSED: 1}
    choice = choose_thresholds([1, 2], scores, n_layers=1, epsilon=0.0, calls=same_calls)
    assert {(c.p, c.f) for c in choice.window} == {(2, 0), (2, 1)}
    assert (choice.p, choice.f) == (2, 0)
    # with the paper's calls (Full-CPU 0) the fewer calls of (2, 1) decide instead
    assert (choose_thresholds([1, 2], scores, n_layers=1, epsilon=0.0).p,
            choose_thresholds([1, 2], scores, n_layers=1, epsilon=0.0).f) == (2, 1)


def test_theta_is_exactly_the_legal_pairs():
    bs = [1, 2, 4, 8]
    theta = threshold_candidates(bs)
    assert len(theta) == len(set(theta)) == 1 + sum(range(1, len(bs) + 1))
    for p, f in theta:
        check_thresholds(p, f)
        assert (p, f) == (0, 0) or (p in bs and f in [0, *bs] and f < p)
    expected = {(0, 0)} | {(p, f) for p in bs for f in [0, *bs] if f < p}
    assert set(theta) == expected


score_lists = st.lists(st.floats(0.01, 1000.0), min_size=4, max_size=4)


@settings(max_examples=60, deadline=None)
@given(full=score_lists, split=score_lists, fused=score_lists,
       n=st.integers(1, 80), eps=st.sampled_from([0.0, 0.0025, 0.05]))
def test_choice_is_legal_and_obeys_the_rules(full, split, fused, n, eps):
    bs = [1, 3, 16, 64]
    choice = choose_thresholds(bs, {FULL: full, SPLIT: split, FUSED: fused}, n, eps)
    check_thresholds(choice.p, choice.f)
    assert (choice.p, choice.f) in threshold_candidates(bs)
    best = min(c.score for c in choice.candidates)
    assert choice.best.score == best
    assert choice.score <= (1 + eps) * best
    # nothing in the window makes fewer calls, or as few with a lower score
    for c in choice.window:
        assert (c.avg_calls, c.score) >= (choice.avg_calls, choice.score)
    # the reported score is the mean along π_{P,F}
    table = {FULL: full, SPLIT: split, FUSED: fused}
    mean = sum(table[route_for(b, choice.p, choice.f).value][i] for i, b in enumerate(bs)) / len(bs)
    assert choice.score == pytest.approx(mean)


def test_bad_score_tables_are_refused():
    with pytest.raises(ValueError, match="lacks route"):
        choose_thresholds([1, 2], {FULL: [1, 1], SPLIT: [1, 1]}, 4)
    with pytest.raises(ValueError, match="2 batch sizes"):
        choose_thresholds([1, 2], {FULL: [1], SPLIT: [1, 1], FUSED: [1, 1]}, 4)
    with pytest.raises(ValueError, match="finite"):
        choose_thresholds([1, 2], {FULL: [1, math.nan], SPLIT: [1, 1], FUSED: [1, 1]}, 4)
    with pytest.raises(ValueError, match="strictly increasing"):
        choose_thresholds([2, 1], {FULL: [1, 1], SPLIT: [1, 1], FUSED: [1, 1]}, 4)


# --- routing scores ------------------------------------------------------------------------------


class FakeCosts:
    """Round numbers (seconds) so every term of Eq. 7, 8, 11-15 can be checked by hand."""

    n_layers = 4

    def cpu_post_attn(self, b):  # t_p
        return 10.0 * b

    def cpu_post_layer(self, b):  # t_l
        return 7.0 * b

    def cpu_assist_write(self, b):  # a_w
        return 0.1 * b

    def cpu_assist_read(self, b):  # a_r
        return 0.2 * b

    def cpu_hidden_write(self, b):  # h_w
        return 0.3 * b

    def assist_gpu(self, kind, b):  # g_x
        return {"p": 1.0, "lA": 2.0, "lS": 3.0}[kind] * b

    def assist_q(self, kind):
        return {"p": 0.01, "lA": 0.02, "lS": 0.03}[kind]

    def assist_o(self, kind):
        return {"p": 0.004, "lA": 0.005, "lS": 0.006}[kind]


def test_route_score_formulas():
    r = route_scores(FakeCosts(), [1, 2], lambda_gpu=0.5)
    row = r.rows[1]  # b = 2
    t_p, t_l, a_w, a_r, h_w = 20.0, 14.0, 0.2, 0.4, 0.6
    w_p, w_la, w_ls = 0.01 + 2.0, 0.02 + 4.0, 0.03 + 6.0
    d_p, d_la, d_ls = 0.004 + 2.0, 0.005 + 4.0, 0.006 + 6.0
    tbar_p, tbar_ls, tbar_la = a_w + w_p + a_r, h_w + w_ls, a_w + w_la
    assert row.t_full == pytest.approx(4 * t_p + t_l)
    assert row.t_split == pytest.approx(4 * t_p + tbar_ls)
    assert row.t_fused == pytest.approx(3 * tbar_p + tbar_la)
    assert (row.d_full, row.d_split) == (0.0, pytest.approx(d_ls))
    assert row.d_fused == pytest.approx(3 * d_p + d_la)
    assert r.S(FULL)[1] == pytest.approx(4 * t_p + t_l)
    assert r.S(SPLIT)[1] == pytest.approx(4 * t_p + tbar_ls + 0.5 * d_ls)
    assert r.S(FUSED)[1] == pytest.approx(3 * tbar_p + tbar_la + 0.5 * (3 * d_p + d_la))
    assert r.post_attn_local()[1] == t_p
    assert r.post_attn_assisted()[1] == pytest.approx(tbar_p + 0.5 * d_p)
    # q_p at which an assisted stage would cost as much as the CPU-local one
    assert r.break_even_q_p()[1] == pytest.approx(t_p - (a_w + 2.0 + a_r) - 0.5 * d_p)


def test_crossover_and_assist_wait_shift():
    costs = FakeCosts()
    # assisted post-attention: 1.3 b + 0.01 + λ(b + 0.004) vs local 10 b: assist wins everywhere
    assert route_scores(costs, [1, 2, 4]).post_attn_crossover() == 1
    # a 20 s control-path wait makes local cheaper up to b = 2 (local 20 vs 2.3·2 + 20.014 at
    # b = 2; 40 vs 29.2 at b = 4)
    shifted = route_scores(shift_assist_wait(costs, 20.0), [1, 2, 4])
    assert shifted.post_attn_crossover() == 4
    assert route_scores(shift_assist_wait(costs, 1e6), [1, 2, 4]).post_attn_crossover() is None


def test_rtx4090_roofline_assists_everywhere(rtx):
    r = route_scores(rtx)
    assert r.batch_sizes[0] == 1 and r.batch_sizes[-1] == 2048
    assert all(lo > asst for lo, asst in zip(r.post_attn_local(), r.post_attn_assisted(),
                                             strict=True))
    choice = choose_thresholds(r.batch_sizes, r, r.n_layers, 0.0025)
    assert (choice.p, choice.f) == (0, 0)
