"""Profile-guided controls: Algorithm 1, the routing scores, the plateau and CPU-limit fits."""

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpace_sim.core.routing import check_thresholds
from dualpace_sim.core.routing import route_for as core_route_for
from dualpace_sim.costs import CostModel, load_profile
from dualpace_sim.costs.fit import (
    FULL,
    FUSED,
    SPLIT,
    FitError,
    _pav,
    choose_thresholds,
    cpu_iteration_time,
    cpu_latency_limit,
    cpu_limit_from_curves,
    fit_controls,
    isotonic_increasing,
    route_for,
    route_scores,
    shift_assist_wait,
    threshold_candidates,
    token_limit_from_curve,
    with_controls,
)
from dualpace_sim.costs.profile import Controls, ProfileError, check_magnitudes

ROOT = Path(__file__).resolve().parents[2]
RTX4090 = ROOT / "calibration/roofline/rtx4090-xeon4510-12c/llama-3.1-8b.yaml"
COMMITTED = sorted((ROOT / "calibration/roofline").glob("*/*.yaml"))


@pytest.fixture(scope="module")
def rtx():
    return load_profile(RTX4090)


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
    mean = sum(table[route_for(b, choice.p, choice.f)][i] for i, b in enumerate(bs)) / len(bs)
    assert choice.score == pytest.approx(mean)


@pytest.mark.parametrize(("p", "f"), [(0, 0), (32, 16), (32, 0), (8, 7)])
def test_route_rule_matches_the_simulator(p, f):
    for b in range(1, 70):
        assert route_for(b, p, f) == core_route_for(b, p, f).value


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


# --- isotonic fit and the GPU token limit --------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=30))
def test_isotonic_fit_is_non_decreasing_least_squares(ys):
    fitted = isotonic_increasing(ys)
    assert np.all(np.diff(fitted) >= -1e-9 * (1 + np.abs(fitted[:-1])))
    assert fitted.sum() == pytest.approx(sum(ys), abs=1e-6 * (1 + sum(map(abs, ys))))
    assert np.allclose(_pav(ys), fitted, rtol=1e-9, atol=1e-9)


def test_isotonic_keeps_a_monotone_curve_and_pools_violators():
    assert list(isotonic_increasing([1.0, 2.0, 2.0, 5.0])) == [1.0, 2.0, 2.0, 5.0]
    assert list(_pav([1.0, 3.0, 2.0, 4.0])) == [1.0, 2.5, 2.5, 4.0]
    assert list(_pav([3.0, 2.0, 1.0])) == [2.0, 2.0, 2.0]


TOKENS = [2**i for i in range(4, 17)]  # 16..65536


def _knee_curve(knee: int) -> list[float]:
    return [300e3 * min(n / knee, 1.0) for n in TOKENS]


@pytest.mark.parametrize("knee", [256, 1024, 4096])
def test_plateau_knee_exact(knee):
    fit = token_limit_from_curve(TOKENS, _knee_curve(knee), k=5, delta=0.01)
    assert fit.limit == knee
    assert fit.plateau == pytest.approx(300e3)


def test_plateau_knee_noisy_and_declining_tail():
    rng = np.random.default_rng(7)
    clean = np.array(_knee_curve(1024))
    clean[-3:] *= [0.98, 0.96, 0.93]  # attention-heavy shapes fall off, as in panel (d)
    noisy = clean * (1 + rng.normal(0, 0.003, clean.size))
    fit = token_limit_from_curve(TOKENS, noisy, k=5, delta=0.01)
    assert 512 <= fit.limit <= 2048
    assert np.all(np.diff(fit.fitted) >= 0)
    assert fit.plateau == pytest.approx(np.mean(fit.fitted[-5:]))


def test_plateau_needs_k_points():
    with pytest.raises(FitError, match="at least k=5"):
        token_limit_from_curve([1, 2, 4], [1.0, 2.0, 3.0], k=5)


# --- CPU decode batch limit ----------------------------------------------------------------------

CPU_BS = [2**i for i in range(11)]  # 1..1024


def test_cpu_limit_peaked_curve_picks_the_peak():
    # throughput rises to a peak at 256 then falls (cache/bandwidth contention), per context
    curves = [[b / (1 + (b / 256) ** 2) * s for b in CPU_BS] for s in (1.0, 0.7, 0.4)]
    pick = cpu_limit_from_curves(CPU_BS, curves, delta=0.01)
    assert pick.best == 256 and pick.limit == 256
    assert pick.best_per_context == [256, 256, 256]


def test_cpu_limit_saturating_curve_takes_the_smallest_within_delta():
    curves = [[b / (b + c) for b in CPU_BS] for c in (4.0, 8.0)]
    pick = cpu_limit_from_curves(CPU_BS, curves, delta=0.01)
    assert pick.best == 1024
    mean = np.asarray(pick.mean_normalized)
    i = CPU_BS.index(pick.limit)
    assert mean[i] >= 0.99 * mean.max() > mean[i - 1]


def test_cpu_latency_cap(rtx):
    cm = CostModel(rtx)
    cap = cpu_latency_limit(cm, 0.5, 1024, 0, 0, max_batch=1024)
    assert cpu_iteration_time(cm, cap, 1024, 0, 0) <= 0.5 < cpu_iteration_time(cm, cap + 1, 1024,
                                                                               0, 0)
    result = fit_controls(rtx, max_iteration_s=0.5, iteration_context=1024)
    assert result.cpu.latency_limit == cap
    assert result.cpu_batch_limit == min(cap, result.cpu.pick.limit)
    tight = fit_controls(rtx, max_iteration_s=0.2)
    assert tight.cpu_batch_limit == tight.cpu.latency_limit < tight.cpu.pick.limit
    with pytest.raises(FitError, match="below even one request"):
        fit_controls(rtx, max_iteration_s=1e-4)


def test_cpu_iteration_time_follows_the_route(rtx):
    cm = CostModel(rtx)
    b, ctx = 16, 512
    pre = cm.cpu_pre_layer(b) + cm.cpu_iteration_overhead + 32 * cm.cpu_layer_local(b, b * ctx)
    full = pre + 32 * cm.cpu_post_attn(b) + cm.cpu_post_layer(b)
    assert cpu_iteration_time(cm, b, ctx, 32, 16) == pytest.approx(full)
    assert cpu_iteration_time(cm, b, ctx, 0, 0) < full  # Fused-Assist on this roofline


# --- the whole fit -------------------------------------------------------------------------------


def test_fit_rtx4090_roofline(rtx):
    result = fit_controls(rtx)
    assert result.controls() == {"route_p": 0, "route_f": 0, "gpu_token_limit": 512,
                                 "cpu_batch_limit": 152}
    assert result.lines()[0] == "route_p=0"
    assert result.prefill.fit.tokens[-1] == 16384  # grid stays inside the GPU token tables
    assert math.isnan(result.prefill.throughput[-1][-1])  # 64 x 4096 is beyond them


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fit_every_committed_profile(path):
    profile = load_profile(path)
    check_magnitudes(profile, str(path))
    result = fit_controls(profile)
    check_thresholds(result.route_p, result.route_f)
    assert result.gpu_token_limit in result.prefill.fit.tokens
    assert result.cpu_batch_limit in result.cpu.batch_sizes


def test_with_controls_fills_controls_and_keeps_provenance(rtx, tmp_path):
    result = fit_controls(rtx, epsilon=0.01)
    fitted = with_controls(rtx, result, date="2026-12-01")
    assert fitted.provenance == rtx.provenance and rtx.controls is None
    c = fitted.controls
    assert (c.route_p, c.route_f, c.gpu_token_limit, c.cpu_batch_limit) == (0, 0, 512, 152)
    assert (c.fit.epsilon, c.fit.lambda_gpu, c.fit.k, c.fit.delta) == (0.01, 1.0, 5, 0.01)
    path = tmp_path / "p.yaml"
    fitted.save(path)
    assert load_profile(path) == fitted


def test_controls_fit_schema_is_strict():
    fit = {"epsilon": 0.0025, "lambda_gpu": 1.0, "k": 5, "delta": 0.01, "date": "2026-12-01"}
    Controls.model_validate({"route_p": 32, "route_f": 16, "fit": fit})
    with pytest.raises(ValueError, match="extra"):
        Controls.model_validate({"fit": {**fit, "lamda": 1}})
    with pytest.raises(ValueError):
        Controls.model_validate({"fit": {**fit, "delta": 1.5}})


def test_milliseconds_are_detected(rtx):
    data = rtx.model_dump(mode="json")
    data["gpu"]["post_attn"]["y"] = [v * 1e3 for v in data["gpu"]["post_attn"]["y"]]
    ms = type(rtx).model_validate(data)
    with pytest.raises(ProfileError, match=r"^x\.yaml: gpu\.post_attn\.y: .*expected seconds"):
        check_magnitudes(ms, "x.yaml")
    data = rtx.model_dump(mode="json")
    data["link"]["h2d_bytes_per_s"] = 25.2
    with pytest.raises(ProfileError, match="link.h2d_bytes_per_s: .*bytes per second"):
        check_magnitudes(type(rtx).model_validate(data), "x.yaml")
