"""The post-attention routing thresholds (P, F) (paper §4.3, Algorithm 1).

Per profiled CPU batch size b, the route scores ``S_r(b) = T_r(b) + λ_GPU · D_r(b)`` (Eq. 6)
combine the CPU-visible cost of advancing the batch (Eq. 7) with the GPU-main service it
displaces (Eq. 8), built from the primitives of Eq. 11-15. Algorithm 1 then picks the legal
(P, F) whose mean score is within (1 + ε) of the best and that makes the fewest Dense Assist
calls on average. Which route a batch takes under (P, F) (Eq. 5) and which settings are legal
are the core's (:mod:`dualpace_sim.core.routing`): the fit scores the rule the schedulers run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dualpace_sim.core.routing import Route, legal_thresholds, route_for
from dualpace_sim.costs.fit.grid import check_batch_sizes, profile_batch_sizes
from dualpace_sim.costs.model import CostModel
from dualpace_sim.costs.profile import Profile

FULL, SPLIT, FUSED = Route.FULL_CPU.value, Route.SPLIT_FINAL.value, Route.FUSED_ASSIST.value
ROUTES = (FULL, SPLIT, FUSED)


class RoutingCosts(Protocol):
    """What the routing scores read; :class:`CostModel` provides it."""

    n_layers: int

    def cpu_post_attn(self, b: int) -> float: ...
    def cpu_post_layer(self, b: int) -> float: ...
    def cpu_assist_write(self, b: int) -> float: ...
    def cpu_assist_read(self, b: int) -> float: ...
    def cpu_hidden_write(self, b: int) -> float: ...
    def assist_gpu(self, kind: Any, b: int) -> float: ...
    def assist_q(self, kind: Any) -> float: ...
    def assist_o(self, kind: Any) -> float: ...


# --- routing scores (Eq. 6-8, 11-15) ---------------------------------------------------------


@dataclass(frozen=True)
class RouteCost:
    """One batch size's route costs in seconds: CPU-visible T_r and GPU disturbance D_r."""

    b: int
    t_full: float
    t_split: float
    t_fused: float
    d_full: float
    d_split: float
    d_fused: float
    # the per-stage terms behind them
    t_p: float  # CPU-local post-attention
    t_l: float  # CPU-local post-layer (whole model)
    tbar_p: float  # wait-post-attn: a_w + q_p + g_p + a_r
    tbar_lS: float  # h_w + q_lS + g_lS
    tbar_lA: float  # a_w + q_lA + g_lA
    d_p: float  # o_p + g_p
    d_lS: float
    d_lA: float
    q_p: float  # control-path wait of one post-attention assist

    def t(self, route: str) -> float:
        return {FULL: self.t_full, SPLIT: self.t_split, FUSED: self.t_fused}[route]

    def d(self, route: str) -> float:
        return {FULL: self.d_full, SPLIT: self.d_split, FUSED: self.d_fused}[route]


def route_cost(costs: RoutingCosts, b: int) -> RouteCost:
    """Eq. 7, 8 with Eq. 11, 14, 15 for one CPU batch size."""
    n = costs.n_layers
    t_p, t_l = costs.cpu_post_attn(b), costs.cpu_post_layer(b)
    a_w, a_r, h_w = costs.cpu_assist_write(b), costs.cpu_assist_read(b), costs.cpu_hidden_write(b)
    g = {x: costs.assist_gpu(x, b) for x in ("p", "lA", "lS")}
    w = {x: costs.assist_q(x) + g[x] for x in g}  # Eq. 14: CPU-visible wait
    d = {x: costs.assist_o(x) + g[x] for x in g}  # Eq. 14: displaced GPU-main service
    tbar_p = a_w + w["p"] + a_r  # Eq. 15
    tbar_ls = h_w + w["lS"]
    tbar_la = a_w + w["lA"]
    return RouteCost(
        b=b,
        t_full=n * t_p + t_l,
        t_split=n * t_p + tbar_ls,
        t_fused=(n - 1) * tbar_p + tbar_la,
        d_full=0.0,
        d_split=d["lS"],
        d_fused=(n - 1) * d["p"] + d["lA"],
        t_p=t_p, t_l=t_l, tbar_p=tbar_p, tbar_lS=tbar_ls, tbar_lA=tbar_la,
        d_p=d["p"], d_lS=d["lS"], d_lA=d["lA"], q_p=costs.assist_q("p"),
    )


@dataclass
class RouteScores:
    """Per profiled batch size: the three T_r, D_r and S_r = T_r + λ_GPU·D_r (seconds)."""

    batch_sizes: list[int]
    n_layers: int
    lambda_gpu: float
    rows: list[RouteCost]

    def T(self, route: str) -> list[float]:  # noqa: N802 - the paper's symbol
        return [r.t(route) for r in self.rows]

    def D(self, route: str) -> list[float]:  # noqa: N802
        return [r.d(route) for r in self.rows]

    def S(self, route: str) -> list[float]:  # noqa: N802
        return [r.t(route) + self.lambda_gpu * r.d(route) for r in self.rows]

    def score_table(self) -> dict[str, list[float]]:
        return {route: self.S(route) for route in ROUTES}

    # per-stage post-attention comparison: CPU-local t_p vs assisted t̄_p + λ·d_p
    def post_attn_local(self) -> list[float]:
        return [r.t_p for r in self.rows]

    def post_attn_assisted(self) -> list[float]:
        return [r.tbar_p + self.lambda_gpu * r.d_p for r in self.rows]

    def post_attn_crossover(self) -> int | None:
        """The first profiled b from which assisting a post-attention stage is no dearer than
        running it on the CPU (t_p ≥ t̄_p + λ·d_p) for every larger b; ``None`` when it never is.
        Equals ``batch_sizes[0]`` when assisting wins everywhere."""
        local, assisted = self.post_attn_local(), self.post_attn_assisted()
        cross = None
        for b, lo, asst in zip(reversed(self.batch_sizes), reversed(local), reversed(assisted),
                               strict=True):
            if lo < asst:
                break
            cross = b
        return cross

    def break_even_q_p(self) -> list[float]:
        """Per b, the q_p at which one assisted post-attention stage costs as much as a CPU-local
        one: t_p − (a_w + g_p + a_r) − λ·d_p; a larger wait makes the CPU-local stage cheaper."""
        return [r.t_p - (r.tbar_p - r.q_p) - self.lambda_gpu * r.d_p for r in self.rows]


def route_scores(
    costs: RoutingCosts | Profile, batch_sizes: Sequence[int] | None = None, lambda_gpu: float = 1.0
) -> RouteScores:
    """S_r(b) for every b in ``batch_sizes`` (default: the profile's CPU post_attn x-axis)."""
    if isinstance(costs, Profile):
        profile = costs
        costs = CostModel(profile)
        if batch_sizes is None:
            batch_sizes = profile_batch_sizes(profile)
    if batch_sizes is None:
        raise ValueError("batch_sizes is required unless a Profile is given")
    bs = check_batch_sizes(batch_sizes)
    return RouteScores(bs, costs.n_layers, lambda_gpu, [route_cost(costs, b) for b in bs])


class _ShiftedWait:
    """A cost view whose assist control-path waits q_x are larger by a constant."""

    def __init__(self, costs: RoutingCosts, extra_s: float) -> None:
        self._costs, self._extra = costs, extra_s
        self.n_layers = costs.n_layers

    def __getattr__(self, name: str) -> Any:
        return getattr(self._costs, name)

    def assist_q(self, kind: Any) -> float:
        return self._costs.assist_q(kind) + self._extra


def shift_assist_wait(costs: RoutingCosts, extra_s: float) -> RoutingCosts:
    """``costs`` with ``extra_s`` added to every q_x: a what-if for the stage-boundary wait of a
    busy GPU, which a measured q_x includes (Appendix B, end-to-end calibration) and a roofline
    q_x does not."""
    if extra_s < 0:
        raise ValueError(f"extra_s must be >= 0, got {extra_s}")
    return _ShiftedWait(costs, extra_s)


# --- Algorithm 1 -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    p: int
    f: int
    score: float  # ThresholdScore: mean over B of S_{π(b)}(b)
    avg_calls: float  # AvgAssistCalls


@dataclass
class ThresholdChoice:
    """Algorithm 1's answer with what led to it."""

    p: int
    f: int
    score: float
    avg_calls: float
    best: Candidate  # the exact score minimum
    epsilon: float
    candidates: list[Candidate] = field(repr=False)  # all of Θ
    window: list[Candidate] = field(repr=False)  # Θ_ε

    @property
    def regret(self) -> float:
        """Relative cost of the choice over the exact minimum."""
        return self.score / self.best.score - 1.0 if self.best.score > 0 else 0.0


def threshold_candidates(batch_sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Θ = {(0,0)} ∪ {(P,F) | P ∈ B, F ∈ B ∪ {0}, F < P} (Algorithm 1, line 1)."""
    bs = check_batch_sizes(batch_sizes)
    return [(0, 0)] + [(p, f) for p in bs for f in [0, *bs] if legal_thresholds(p, f)]


def choose_thresholds(
    batch_sizes: Sequence[int],
    scores: Mapping[str, Sequence[float]] | RouteScores,
    n_layers: int,
    epsilon: float = 0.0025,
    calls: Mapping[str, float] | None = None,
) -> ThresholdChoice:
    """Algorithm 1 over a score table ``{route: [S_route(b) for b in B]}``.

    Keeps the candidates within (1 + ε)·BestScore and returns the one with the fewest average
    assist calls (``calls``; default the paper's Full-CPU 0, Split-Final 1, Fused-Assist N), then
    the lowest score, then the lowest P, then the lowest F.
    """
    if isinstance(scores, RouteScores):
        scores = scores.score_table()
    bs = check_batch_sizes(batch_sizes)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    table = {}
    for route in ROUTES:
        if route not in scores:
            raise ValueError(f"score table lacks route {route!r}")
        col = [float(v) for v in scores[route]]
        if len(col) != len(bs):
            raise ValueError(f"{route}: {len(col)} scores for {len(bs)} batch sizes")
        if any(not math.isfinite(v) for v in col):
            raise ValueError(f"{route}: scores must be finite")
        table[route] = col
    calls = dict(calls) if calls is not None else {FULL: 0, SPLIT: 1, FUSED: n_layers}
    m = len(bs)
    cands = []
    for p, f in threshold_candidates(bs):
        total, n_calls = 0.0, 0
        for i, b in enumerate(bs):
            route = route_for(b, p, f)
            total += table[route][i]
            n_calls += calls[route]
        cands.append(Candidate(p, f, total / m, n_calls / m))
    best = min(cands, key=lambda c: (c.score, c.p, c.f))
    bound = (1.0 + epsilon) * best.score
    window = [c for c in cands if c.score <= bound]
    pick = min(window, key=lambda c: (c.avg_calls, c.score, c.p, c.f))
    return ThresholdChoice(pick.p, pick.f, pick.score, pick.avg_calls, best, epsilon, cands,
                           window)
