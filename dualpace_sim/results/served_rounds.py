"""A real run's GPU rounds beside the cost model's price for the same plans, and the GPU round
overhead they show.

The runtime journals every call into the scheduling core, so replaying a journal
(`replay.journal_calls`) gives back each round's plan; its real time (schedule to apply) can be
set beside what the simulator charges for that plan. The profiler's iteration overhead is a
one-shot host-side timing (the GPU executor building a 64-request decode batch) on a host whose
speed drifts: successive profiles of the H200 box read 0.53-1.03 ms. Decode-only rounds with the
CPU engine idle are the served rounds that hold nothing but their graph-replayed stages and that
overhead, so their median excess over the model is what the profile's overhead misses in
serving; `served_round_overhead` corrects it the way Appendix B corrects q_x and o_x, from the
profiler's own calibration runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dualpace_sim.config.scenario import LoadedScenario
from dualpace_sim.core.journal import JOURNAL_FILE, Journal
from dualpace_sim.core.plans import GpuPlan
from dualpace_sim.costs.profile import Profile, RoundOverheadCalibration
from dualpace_sim.results.replay import journal_calls

# A calibration pass's scenario, beside its run directory (`dualpace-hw profile` lays them out
# so; `dualpace-sim profile calibrate` finds it there).
PASS_SCENARIO = "scenario.yaml"


@dataclass(frozen=True)
class ServedRound:
    """One GPU round of a real run, as served and as priced."""

    index: int  # 0-based, in the run's order
    n_tokens: int
    prefill: bool  # has prefill chunks (runs eagerly; decode-only rounds replay CUDA graphs)
    real_s: float  # schedule to apply, from the journal
    fixed_s: float  # the model's pre-layer + post-layer + round overhead
    layer_s: float  # the model's one layer
    n_layers: int
    cpu_step_in_flight: bool  # DualPace: a CPU step was scheduled and not yet applied
    to_cpu_tokens: int = 0  # of its prefill tokens, those of Prefill-to-CPU chunks
    overhead_s: float = 0.0  # the iteration overhead inside fixed_s (the pricing profile's)
    start_s: float = 0.0  # its schedule call, on the run's clock

    @property
    def model_s(self) -> float:
        return self.fixed_s + self.n_layers * self.layer_s


class NotGpuPlans(ValueError):
    """The journal's GPU plans are not GpuPlans (NEO's iterations): no rounds to price here."""


def served_rounds(loaded: LoadedScenario, run_dir: Path, policy: str) -> Iterator[ServedRound]:
    """`policy`'s GPU rounds in the real run directory `run_dir` of `loaded`, each priced
    with `loaded`'s cost model (the profile the run used, or another profile of its box)."""
    cost = loaded.cost
    _, calls = journal_calls(loaded, policy)
    journal = Journal.read(Path(run_dir) / JOURNAL_FILE.format(policy=policy))
    pending, index, cpu_step = None, 0, False
    beside_cpu = "cpu" in calls.core.drivers  # the GPU engine shares its host with a CPU engine
    for e in journal.entries:
        calls(e)
        if e.engine == "cpu":
            if e.call == "schedule":
                cpu_step = not calls.plan("cpu").is_empty
            elif e.call == "apply":
                cpu_step = False
        elif e.engine == "gpu" and e.call == "schedule":
            plan = calls.plan("gpu")
            if not isinstance(plan, GpuPlan):
                raise NotGpuPlans(f"{policy}'s GPU plans are {type(plan).__name__}s: "
                                 "served_rounds prices GpuPlans (DualPace's, vLLM's)")
            if plan.has_forward and e.data.get("committed", True):
                chunks = [(c.tokens, c.start + c.tokens) for c in plan.prefills]
                layer = cost.gpu_layer(plan.n_tokens, chunks, len(plan.decodes),
                                       plan.decode_context, beside_cpu=beside_cpu)
                fixed = (cost.gpu_pre_layer(plan.n_tokens) + cost.gpu_post_layer(plan.n_sampled)
                         + cost.gpu_round_overhead(len(plan.prefills) + len(plan.decodes)))
                to_cpu = sum(c.tokens for c in plan.prefills if c.to_cpu)
                pending = (e.t, plan.n_tokens, bool(plan.prefills), fixed, layer, cpu_step,
                           to_cpu)
        elif e.engine == "gpu" and e.call == "apply" and pending is not None:
            start, tokens, prefill, fixed, layer, busy, to_cpu = pending
            yield ServedRound(index, tokens, prefill, e.t - start, fixed, layer, cost.n_layers,
                              busy, to_cpu, cost.gpu_iteration_overhead, start)
            index, pending = index + 1, None


# A stall: a round over STALL_S and STALL_RATIO times its model. On the H200 box full garbage
# collections held decode rounds of a few rows (about 5 ms) for 0.19-0.54 s; the longest
# rounds that were only work (a 4,096-token prefill) ran 1.1-1.5x their model.
STALL_S = 0.1
STALL_RATIO = 5.0


def stalls(rounds: Iterable[ServedRound]) -> list[ServedRound]:
    """The rounds in which the engine stalled rather than worked (STALL_S, STALL_RATIO)."""
    return [r for r in rounds if r.real_s > STALL_S and r.real_s > STALL_RATIO * r.model_s]


def served_round_overhead(rounds: Iterable[ServedRound], runs: list[str]
                          ) -> RoundOverheadCalibration | None:
    """The GPU iteration overhead as served: over the decode-only rounds run with the CPU
    engine idle, the median of each round's real time less its modelled stages (its pricing
    overhead plus its excess over the model), at least 0; None when there is no such round."""
    idle = [r for r in rounds if not r.prefill and not r.cpu_step_in_flight]
    if not idle:
        return None
    served = statistics.median(r.overhead_s + r.real_s - r.model_s for r in idle)
    return RoundOverheadCalibration(runs=runs, rounds=len(idle),
                                    measured_s=statistics.median(r.overhead_s for r in idle),
                                    served_s=max(served, 0.0))


def with_served_overhead(profile: Profile, cal: RoundOverheadCalibration) -> Profile:
    """A copy of `profile` whose GPU iteration overhead is the served one, recorded beside it."""
    gpu = profile.gpu.model_copy(update={"iteration_overhead_s": cal.served_s,
                                         "iteration_overhead_calibration": cal})
    return profile.model_copy(update={"gpu": gpu})
