"""Profile-guided controls (paper §4.3, Algorithm 1, Appendix B).

Three fits turn a calibration profile into the four scheduler controls:

* **Post-attention routing thresholds (P, F).** Per profiled CPU batch size b, the route scores
  ``S_r(b) = T_r(b) + λ_GPU · D_r(b)`` (Eq. 6) combine the CPU-visible cost of advancing the batch
  (Eq. 7) with the GPU-main service it displaces (Eq. 8), built from the primitives of Eq. 11-15.
  Algorithm 1 then picks the legal (P, F) whose mean score is within (1 + ε) of the best and that
  makes the fewest Dense Assist calls on average.
* **GPU batched-token limit.** Single-layer prefill throughput over a (B, L) grid, grouped by
  n = B·L and averaged, fitted with a non-decreasing least-squares (isotonic) fit; the plateau is
  the mean of the last K fitted points and the limit is the earliest n within δ of it.
* **CPU decode batch limit.** Single-layer CPU decode throughput b / (local(b) + t_p(b)) per
  context length; the limit is the smallest b whose mean normalized throughput is within δ of the
  best (the throughput-maximizing operating region), optionally capped by a latency target.

Everything here is plain Python + numpy/scipy; the generic pieces (:func:`choose_thresholds`,
:func:`isotonic_increasing`, :func:`token_limit_from_curve`, :func:`cpu_limit_from_curves`) take
plain numbers so that they can be tested on hand-made tables.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dualpace_sim.core.routing import Route, route_for
from dualpace_sim.costs.model import CostModel
from dualpace_sim.costs.profile import Controls, ControlsFit, Profile

FULL, SPLIT, FUSED = Route.FULL_CPU.value, Route.SPLIT_FINAL.value, Route.FUSED_ASSIST.value
ROUTES = (FULL, SPLIT, FUSED)

DEFAULT_PREFILL_BATCHES = tuple(2**i for i in range(7))  # 1..64
DEFAULT_PREFILL_LENGTHS = tuple(2**i for i in range(4, 13))  # 16..4096
DEFAULT_CPU_CONTEXTS = (64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_ITERATION_CONTEXT = 1024


class FitError(ValueError):
    """The profile cannot support a fit (too few points, an unreachable latency target ...)."""


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
    bs = _check_batch_sizes(batch_sizes)
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


def profile_batch_sizes(profile: Profile) -> list[int]:
    """B: the integer batch sizes of the profile's CPU post_attn table."""
    xs = profile.cpu.post_attn.x
    out = sorted({int(round(x)) for x in xs if x >= 1})
    if len(out) < 1:
        raise FitError("cpu.post_attn.x holds no batch size >= 1")
    return out


def _check_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    bs = [int(b) for b in batch_sizes]
    if not bs:
        raise ValueError("need at least one batch size")
    if any(b < 1 for b in bs) or any(b2 <= b1 for b1, b2 in zip(bs, bs[1:], strict=False)):
        raise ValueError(f"batch sizes must be positive and strictly increasing, got {bs}")
    return bs


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
    bs = _check_batch_sizes(batch_sizes)
    theta = [(0, 0)]
    for p in bs:
        theta.extend((p, f) for f in [0, *bs] if f < p)
    return theta


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
    bs = _check_batch_sizes(batch_sizes)
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


# --- isotonic fit and the GPU batched-token limit -----------------------------------------------


def _pav(y: Sequence[float], w: Sequence[float] | None = None) -> np.ndarray:
    """Pool-adjacent-violators: the weighted least-squares non-decreasing fit of y."""
    ys = [float(v) for v in y]
    ws = [1.0] * len(ys) if w is None else [float(v) for v in w]
    # blocks of (mean, weight, count)
    means: list[float] = []
    weights: list[float] = []
    counts: list[int] = []
    for v, wt in zip(ys, ws, strict=True):
        means.append(v)
        weights.append(wt)
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m2, w2, c2 = means.pop(), weights.pop(), counts.pop()
            m1, w1, c1 = means.pop(), weights.pop(), counts.pop()
            wt_sum = w1 + w2
            means.append((m1 * w1 + m2 * w2) / wt_sum)
            weights.append(wt_sum)
            counts.append(c1 + c2)
    return np.repeat(np.array(means), counts)


def isotonic_increasing(y: Sequence[float], weights: Sequence[float] | None = None) -> np.ndarray:
    """Non-decreasing least-squares fit (scipy's isotonic_regression when present, else PAV)."""
    arr = np.asarray(y, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("need a non-empty 1-D sequence")
    try:
        from scipy.optimize import isotonic_regression  # scipy >= 1.12
    except ImportError:  # pragma: no cover - depends on the installed scipy
        return _pav(arr, weights)
    w = None if weights is None else np.asarray(weights, dtype=float)
    return np.asarray(isotonic_regression(arr, weights=w, increasing=True).x, dtype=float)


@dataclass
class PlateauFit:
    tokens: list[int]
    mean: list[float]
    fitted: list[float]
    plateau: float
    limit: int
    k: int
    delta: float


def token_limit_from_curve(
    tokens: Sequence[int], mean_throughput: Sequence[float], k: int = 5, delta: float = 0.01
) -> PlateauFit:
    """Isotonic fit of throughput over n; plateau = mean of the last K fitted points; the limit is
    the earliest n whose fitted throughput is at least (1 − δ)·plateau."""
    n = [int(v) for v in tokens]
    y = [float(v) for v in mean_throughput]
    if len(n) != len(y):
        raise ValueError(f"{len(n)} token counts but {len(y)} throughputs")
    if any(b <= a for a, b in zip(n, n[1:], strict=False)):
        raise ValueError("token counts must be strictly increasing")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    if len(n) < k:
        raise FitError(f"need at least k={k} token counts for the plateau, got {len(n)}")
    fitted = isotonic_increasing(y)
    plateau = float(np.mean(fitted[-k:]))
    limit = next(t for t, v in zip(n, fitted, strict=True) if v >= (1.0 - delta) * plateau)
    return PlateauFit(n, y, [float(v) for v in fitted], plateau, limit, k, delta)


@dataclass
class PrefillThroughput:
    """GPU single-layer prefill throughput (tokens/s) on the (B, L) grid and its plateau fit."""

    batches: list[int]
    lengths: list[int]
    throughput: list[list[float]]  # [i_B][j_L]; NaN where B·L lies beyond the profiled tokens
    max_tokens: int
    fit: PlateauFit

    @property
    def limit(self) -> int:
        return self.fit.limit


def prefill_throughput(
    costs: CostModel,
    batches: Sequence[int] = DEFAULT_PREFILL_BATCHES,
    lengths: Sequence[int] = DEFAULT_PREFILL_LENGTHS,
    k: int = 5,
    delta: float = 0.01,
    max_tokens: int | None = None,
) -> PrefillThroughput:
    """Prefill B requests of L tokens through one layer: gpu_layer(B·L, [(L, L)]·B, 0, 0).

    Shapes with B·L beyond ``max_tokens`` (default: the largest token count the profile's GPU
    linear tables cover) are left out, so the fit never rests on extrapolated costs.
    """
    g = costs.profile.gpu
    if max_tokens is None:
        max_tokens = int(min(g.pre_attn.x[-1], g.post_attn.x[-1]))
    bs, ls = _check_batch_sizes(batches), _check_batch_sizes(lengths)
    grid = [[math.nan] * len(ls) for _ in bs]
    by_n: dict[int, list[float]] = {}
    for i, b in enumerate(bs):
        for j, length in enumerate(ls):
            n = b * length
            if n > max_tokens:
                continue
            t = costs.gpu_layer(n, [(length, length)] * b, 0, 0)
            if t <= 0:
                raise FitError(f"a GPU layer over {b} prompts of {length} tokens costs {t:g} s "
                                 "in this profile; its gpu tables need costs > 0 to be fitted")
            thr = n / t
            grid[i][j] = thr
            by_n.setdefault(n, []).append(thr)
    tokens = sorted(by_n)
    means = [float(np.mean(by_n[n])) for n in tokens]
    return PrefillThroughput(bs, ls, grid, max_tokens, token_limit_from_curve(tokens, means, k,
                                                                               delta))


# --- CPU decode batch limit -----------------------------------------------------------------------


@dataclass
class CpuCurvePick:
    mean_normalized: list[float]  # per b: mean over contexts of thr(b, ctx) / max_b thr(b, ctx)
    best_per_context: list[int]  # per context: the throughput-maximizing b
    best: int  # argmax of mean_normalized
    limit: int  # smallest b with mean_normalized >= (1 − δ)·max


def cpu_limit_from_curves(
    batch_sizes: Sequence[int], throughput: Sequence[Sequence[float]], delta: float = 0.01
) -> CpuCurvePick:
    """Throughput-maximizing CPU batch from curves ``throughput[context][b]``.

    Each context's curve is normalized by its own maximum so that every context weighs the same;
    the limit is the smallest b whose mean normalized throughput is within δ of the best mean, so
    that a flat top (a compute-saturated CPU) does not push the limit to the largest profiled b.
    """
    bs = _check_batch_sizes(batch_sizes)
    arr = np.asarray(throughput, dtype=float)
    if arr.ndim != 2 or arr.shape[1] != len(bs) or arr.shape[0] == 0:
        raise ValueError(f"throughput must be [contexts][{len(bs)} batch sizes]")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError("throughputs must be finite and > 0")
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    norm = arr / arr.max(axis=1, keepdims=True)
    mean = norm.mean(axis=0)
    best_i = int(np.argmax(mean))
    limit_i = int(np.argmax(mean >= (1.0 - delta) * mean[best_i]))
    return CpuCurvePick([float(v) for v in mean], [bs[int(i)] for i in arr.argmax(axis=1)],
                        bs[best_i], bs[limit_i])


def cpu_iteration_time(costs: CostModel, b: int, context: int, p: int, f: int) -> float:
    """One CPU decode iteration of b requests of ``context`` tokens each along π_{P,F}(b), as the
    simulator runs it: pre-layer + overhead + N·(pre-attn + attention) + the route's T_r(b)
    (GPU queueing is not included)."""
    rc = route_cost(costs, b)
    local = costs.cpu_layer_local(b, b * context)
    pre = costs.cpu_pre_layer(b) + costs.cpu_iteration_overhead
    return pre + costs.n_layers * local + rc.t(route_for(b, p, f))


@dataclass
class CpuDecodeThroughput:
    """CPU single-layer decode throughput (tokens/s) per context and the batch-limit pick."""

    batch_sizes: list[int]
    contexts: list[int]
    throughput: list[list[float]]  # [i_context][j_b]
    pick: CpuCurvePick
    delta: float
    max_iteration_s: float | None = None
    iteration_context: int | None = None
    latency_limit: int | None = None  # largest b meeting max_iteration_s
    limit: int = 0  # the chosen cpu_batch_limit


def cpu_decode_throughput(
    costs: CostModel,
    batch_sizes: Sequence[int] | None = None,
    contexts: Sequence[int] = DEFAULT_CPU_CONTEXTS,
) -> tuple[list[int], list[int], list[list[float]]]:
    """b / (cpu_layer_local(b, b·ctx) + t_p(b)) for each context; batch sizes default to the
    profile's CPU post_attn axis, cut where b·max(ctx) leaves the CPU attention table."""
    c = costs.profile.cpu
    ctxs = _check_batch_sizes(contexts)
    if batch_sizes is None:
        top_total, top_b = c.decode_attn.y[-1], c.decode_attn.x[-1]
        batch_sizes = [b for b in profile_batch_sizes(costs.profile)
                       if b * ctxs[-1] <= top_total and b <= top_b]
    bs = _check_batch_sizes(batch_sizes)
    if len(bs) < 2:
        raise FitError(f"the CPU tables cover too few batch sizes at context {ctxs[-1]}")
    thr = [[b / (costs.cpu_layer_local(b, b * ctx) + costs.cpu_post_attn(b)) for b in bs]
           for ctx in ctxs]
    return bs, ctxs, thr


def cpu_latency_limit(
    costs: CostModel, max_iteration_s: float, context: int, p: int, f: int, max_batch: int
) -> int:
    """The largest b ≤ max_batch whose full CPU iteration (N layers, route π_{P,F}(b), every
    request at ``context`` tokens) takes at most ``max_iteration_s``."""
    if max_iteration_s <= 0:
        raise ValueError(f"max_iteration_s must be > 0, got {max_iteration_s}")
    ok = [b for b in range(1, max_batch + 1)
          if cpu_iteration_time(costs, b, context, p, f) <= max_iteration_s]
    if not ok:
        t1 = cpu_iteration_time(costs, 1, context, p, f)
        raise FitError(f"max_iteration_s={max_iteration_s:g} s is below even one request's CPU "
                       f"iteration ({t1:.4g} s at {context} context tokens)")
    return ok[-1]


# --- everything together ------------------------------------------------------------------------


@dataclass
class FitResult:
    route_p: int
    route_f: int
    gpu_token_limit: int
    cpu_batch_limit: int
    epsilon: float
    lambda_gpu: float
    k: int
    delta: float
    routing: RouteScores
    thresholds: ThresholdChoice
    prefill: PrefillThroughput
    cpu: CpuDecodeThroughput
    n_layers: int
    label: str = ""

    def controls(self) -> dict[str, int]:
        return {"route_p": self.route_p, "route_f": self.route_f,
                "gpu_token_limit": self.gpu_token_limit, "cpu_batch_limit": self.cpu_batch_limit}

    def lines(self) -> list[str]:
        """The four ``name=value`` lines."""
        return [f"{k}={v}" for k, v in self.controls().items()]


def fit_controls(
    profile: Profile,
    epsilon: float = 0.0025,
    lambda_gpu: float = 1.0,
    k: int = 5,
    delta: float = 0.01,
    *,
    batch_sizes: Sequence[int] | None = None,
    prefill_batches: Sequence[int] = DEFAULT_PREFILL_BATCHES,
    prefill_lengths: Sequence[int] = DEFAULT_PREFILL_LENGTHS,
    cpu_contexts: Sequence[int] = DEFAULT_CPU_CONTEXTS,
    max_iteration_s: float | None = None,
    iteration_context: int = DEFAULT_ITERATION_CONTEXT,
) -> FitResult:
    """Fit the four controls of paper §4.3 from a profile (defaults: the paper's ε, λ, K, δ)."""
    if lambda_gpu < 0:
        raise ValueError(f"lambda_gpu must be >= 0, got {lambda_gpu}")
    costs = CostModel(profile)
    # The default grids stay inside the profile's tables; a user-given grid that leaves them is
    # reported by the cost model's CostExtrapolationWarning.
    bs = profile_batch_sizes(profile) if batch_sizes is None else batch_sizes
    routing = route_scores(costs, bs, lambda_gpu)
    choice = choose_thresholds(routing.batch_sizes, routing, costs.n_layers, epsilon)
    prefill = prefill_throughput(costs, prefill_batches, prefill_lengths, k, delta)
    cbs, ctxs, thr = cpu_decode_throughput(costs, None, cpu_contexts)
    pick = cpu_limit_from_curves(cbs, thr, delta)
    cpu = CpuDecodeThroughput(cbs, ctxs, thr, pick, delta, limit=pick.limit)
    if max_iteration_s is not None:
        # The latency cap can only lower the throughput pick: past it larger batches add latency
        # and no throughput.
        cap = cpu_latency_limit(costs, max_iteration_s, iteration_context, choice.p, choice.f,
                                cbs[-1])
        cpu.max_iteration_s, cpu.iteration_context, cpu.latency_limit = (
            max_iteration_s, iteration_context, cap)
        cpu.limit = min(pick.limit, cap)
    return FitResult(
        route_p=choice.p, route_f=choice.f, gpu_token_limit=prefill.limit,
        cpu_batch_limit=cpu.limit, epsilon=epsilon, lambda_gpu=lambda_gpu, k=k, delta=delta,
        routing=routing, thresholds=choice, prefill=prefill, cpu=cpu, n_layers=costs.n_layers,
        label=f"{profile.box.name} / {profile.model.name}",
    )


def with_controls(profile: Profile, result: FitResult, date: str | None = None) -> Profile:
    """A copy of ``profile`` whose ``controls`` hold the fitted values and the fit parameters."""
    fit = ControlsFit(
        epsilon=result.epsilon, lambda_gpu=result.lambda_gpu, k=result.k, delta=result.delta,
        date=date or dt.date.today().isoformat(),
        max_iteration_s=result.cpu.max_iteration_s,
        iteration_context=result.cpu.iteration_context,
    )
    controls = Controls(**result.controls(), fit=fit)
    return profile.model_copy(update={"controls": controls})
