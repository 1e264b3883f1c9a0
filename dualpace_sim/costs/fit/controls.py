"""The four scheduler controls fitted together from a profile, and written back into it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from dualpace_sim.costs.fit.cpu_limit import (
    DEFAULT_CPU_CONTEXTS,
    CpuDecodeThroughput,
    cpu_decode_throughput,
    cpu_latency_limit,
    cpu_limit_from_curves,
)
from dualpace_sim.costs.fit.grid import profile_batch_sizes
from dualpace_sim.costs.fit.thresholds import (
    RouteScores,
    ThresholdChoice,
    choose_thresholds,
    route_scores,
)
from dualpace_sim.costs.fit.token_limit import (
    DEFAULT_PREFILL_BATCHES,
    DEFAULT_PREFILL_LENGTHS,
    PrefillThroughput,
    prefill_throughput,
)
from dualpace_sim.costs.model import CostModel
from dualpace_sim.costs.profile import Controls, ControlsFit, Profile

DEFAULT_ITERATION_CONTEXT = 1024


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
