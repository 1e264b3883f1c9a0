"""The CPU decode batch limit (paper §4.3).

Single-layer CPU decode throughput b / (local(b) + t_p(b)) per context length; the limit is the
smallest b whose mean normalized throughput is within δ of the best (the throughput-maximizing
operating region), optionally capped by a latency target: the largest b whose whole CPU
iteration, along the route π_{P,F}(b) of the fitted thresholds, stays under it.
:func:`cpu_limit_from_curves` takes plain numbers so that it can be tested on hand-made curves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dualpace_sim.core.routing import route_for
from dualpace_sim.costs.fit.grid import FitError, check_batch_sizes, profile_batch_sizes
from dualpace_sim.costs.fit.thresholds import route_cost
from dualpace_sim.costs.model import CostModel

DEFAULT_CPU_CONTEXTS = (64, 128, 256, 512, 1024, 2048, 4096)


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
    bs = check_batch_sizes(batch_sizes)
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
    ctxs = check_batch_sizes(contexts)
    if batch_sizes is None:
        top_total, top_b = c.decode_attn.y[-1], c.decode_attn.x[-1]
        batch_sizes = [b for b in profile_batch_sizes(costs.profile)
                       if b * ctxs[-1] <= top_total and b <= top_b]
    bs = check_batch_sizes(batch_sizes)
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
