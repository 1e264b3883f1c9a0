"""Each real GPU round of a validation run beside the cost model's price for the same plan.

The runtime journals every call into the scheduling core; replaying a journal through the core
(`dualpace_sim.results.replay`) gives back each round's plan, so its real time (schedule to apply)
can
be set beside what the simulator charges for that plan. Shared by the analysis scripts here.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dualpace_sim.core.journal import JOURNAL_FILE, Journal
from dualpace_sim.core.neo import NeoPlan, layer_time
from dualpace_sim.core.routing import Route
from dualpace_sim.costs.calibrate import ASSISTS_FILE, read_assist_calls
from dualpace_sim.costs.cpu_step_records import CPU_STEPS_FILE, CpuStepRecord, read_cpu_steps
from dualpace_sim.costs.fit.thresholds import route_cost
from dualpace_sim.costs.record_csv import record_file
from dualpace_sim.results.replay import journal_calls
from dualpace_sim.results.served_rounds import ServedRound, served_rounds
from dualpace_sim.sim.neo import executed_layer_s
from dualpace_sim.validation.validate import load_for_real_run


def run_arguments(description: str) -> argparse.Namespace:
    """The runs an analysis reads: committed H200 runs by rate, and/or --scenario with its
    --real run directory; --costs prices them with another profile of their box."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("rates", nargs="*", help="committed H200 runs, by offered rate")
    ap.add_argument("--scenario")
    ap.add_argument("--real", help="the real run directory of --scenario")
    ap.add_argument("--costs", help="price the runs with this profile of the same box")
    return ap.parse_args()


def selected_runs(args: argparse.Namespace) -> list[tuple[str | None, str, str]]:
    """(rate, or None for --scenario, scenario, real run directory) of each run asked for."""
    runs: list[tuple[str | None, str, str]] = [(rate, *h200_run(rate)) for rate in args.rates]
    if args.scenario:
        runs.append((None, args.scenario, args.real))
    return runs


def h200_run(rate: str) -> tuple[str, str]:
    """(scenario, real run directory) of the committed H200 validation run at `rate` req/s."""
    return (f"scenarios/h200/validation/llama-3.1-8b-r{rate}.yaml",
            f"docs/validation/r{rate}/real")


@dataclass(frozen=True)
class CpuStep:
    batch: int
    route: Route
    real_s: float  # schedule to apply, from the journal
    model_s: float  # the simulator's step for the same plan, without waits for the GPU engine
    start_s: float = 0.0  # its schedule call, on the run's clock


def _replaying(scenario: str, real: str, policy: str, costs: str | None = None):
    # with the profile the run used, or priced with `costs` (another profile of the box)
    loaded = load_for_real_run(scenario, Path(real), Path(costs) if costs else None)[0]
    calls = journal_calls(loaded, policy)[1]
    return loaded.cost, calls, Journal.read(f"{real}/{JOURNAL_FILE.format(policy=policy)}")


def _served_cpu_steps(calls, journal: Journal, batches: bool = False) -> Iterator[tuple]:
    """(schedule time, apply time, rows, route, total context) of each CPU step in `journal`,
    replayed through `calls` (DualPace's); with `batches`, each row's KV tokens and host
    blocks at the step follow (the plan's requests change as the replay goes on)."""
    pending = None
    for e in journal.entries:
        calls(e)
        if e.engine != "cpu":
            continue
        plan = calls.plan("cpu")
        if e.call == "schedule" and plan is not None and not plan.is_empty:
            pending = (e.t, len(plan.batch), plan.route, plan.context)
            if batches:
                pending += (tuple(r.prompt_tokens + r.generated for r in plan.batch),
                            tuple(tuple(r.blocks) for r in plan.batch))
        elif e.call == "apply" and pending is not None:
            start, *rest = pending
            yield start, e.t, *rest
            pending = None


@dataclass(frozen=True)
class ServedCpuBatch:
    """One real CPU step's batch as the CPU engine read it: what its attention streamed."""

    start_s: float  # its schedule call, on the run's clock
    end_s: float  # its apply call
    route: Route
    lengths: tuple[int, ...]  # each row's KV tokens, the new one included (context_lens)
    blocks: tuple[tuple[int, ...], ...]  # each row's host blocks (its block table)

    @property
    def context(self) -> int:
        return sum(self.lengths)


def served_cpu_batches(scenario: str, real: str) -> Iterator[ServedCpuBatch]:
    """DualPace's CPU steps in the real run directory `real`, in the order served, each with
    its rows' lengths and block ids as the shared core handed them out (the replay gives the
    same ids the runtime used), so a benchmark can time the very reads a step made."""
    _, calls, journal = _replaying(scenario, real, "dualpace")
    for start, end, _, route, _, lengths, blocks in _served_cpu_steps(calls, journal, True):
        yield ServedCpuBatch(start, end, route, lengths, blocks)


def cpu_steps(scenario: str, real: str) -> Iterator[CpuStep]:
    """DualPace's CPU engine steps in the real run directory `real` of `scenario`, each beside
    the simulator's price for its plan: pre-layer, overhead, N x (pre-attention + attention)
    and the route's T_r(b) (its assists at their profiled cost, no stage-boundary waits)."""
    cost, calls, journal = _replaying(scenario, real, "dualpace")
    for start, end, b, route, context in _served_cpu_steps(calls, journal):
        model = (cost.cpu_pre_layer(b) + cost.cpu_iteration_overhead
                 + cost.n_layers * cost.cpu_layer_local(b, context)
                 + route_cost(cost, b).t(route.value))
        yield CpuStep(b, route, end - start, model, start)


@dataclass(frozen=True)
class FusedAssistStep:
    """A real Fused-Assist CPU step split into its assists and the CPU engine's own work, each
    beside the model (`cpu_step_parts`)."""

    batch: int
    context: int  # the batch's total context
    real_s: float  # schedule to apply, from the journal
    waits_s: float  # its assists' CPU-visible waits, sum of W (CPU-Ready to GPU-Done)
    served_cuda_s: float  # their CUDA intervals as served, sum of G
    idle_cuda_s: float  # the same assists at the profile's g_x (an idle GPU's)
    cpu_model_s: float  # the model's CPU work: pre-layer, overhead, N x (local + write + read)
    model_pre_attn_s: float  # of it, N x pre-attention
    model_attention_s: float  # and N x attention
    phases: CpuStepRecord | None = None  # the runtime's own split, where the run recorded it

    @property
    def cpu_real_s(self) -> float:
        """What the CPU engine spent outside its assists' waits."""
        return self.real_s - self.waits_s


def cpu_step_parts(scenario: str, real: str, costs: str | None = None
                   ) -> Iterator[FusedAssistStep]:
    """DualPace's Fused-Assist steps in the real run directory `real`, each with its assists
    from the run's assist records (`assists-dualpace.csv.gz`, one row per assist in the order
    served: N per Fused-Assist step, one per Split-Final step). Priced with the profile the
    run used, or `costs`. Other routes' steps are passed over. Runs since session 16 also
    record each step's phases (`cpu-steps-dualpace.csv.gz`, one row a step in the same order)."""
    cost, calls, journal = _replaying(scenario, real, "dualpace", costs)
    assists = read_assist_calls(record_file(Path(real), ASSISTS_FILE, "dualpace"))
    recorded = record_file(Path(real), CPU_STEPS_FILE, "dualpace")
    phases = iter(read_cpu_steps(recorded)) if recorded.is_file() else None
    per_route = {Route.FUSED_ASSIST: cost.n_layers, Route.SPLIT_FINAL: 1, Route.FULL_CPU: 0}
    n, used = cost.n_layers, 0
    for start, end, b, route, context in _served_cpu_steps(calls, journal):
        mine = assists[used:used + per_route[route]]
        used += per_route[route]
        if len(mine) != per_route[route] or any(a.rows != b for a in mine):
            raise ValueError(f"{real}: the assist records do not follow the journal's CPU "
                             f"steps at record {used} (a {b}-row {route.value} step)")
        split = next(phases, None) if phases is not None else None
        if split is not None and (split.rows, split.route) != (b, route.value):
            raise ValueError(f"{recorded}: its steps do not follow the journal's (a {b}-row "
                             f"{route.value} step against {split.rows} rows {split.route})")
        if route is not Route.FUSED_ASSIST:
            continue
        idle = (n - 1) * cost.assist_gpu("p", b) + cost.assist_gpu("lA", b)
        own = (cost.cpu_pre_layer(b) + cost.cpu_iteration_overhead
               + n * (cost.cpu_layer_local(b, context) + cost.cpu_assist_write(b)
                      + cost.cpu_assist_read(b)))
        yield FusedAssistStep(b, context, end - start, sum(a.wait_s for a in mine),
                              sum(a.cuda_s for a in mine), idle, own, n * cost.cpu_pre_attn(b),
                              n * cost.cpu_decode_attn(b, context), split)


def gpu_rounds(scenario: str, real: str, policy: str, costs: str | None = None
               ) -> Iterator[ServedRound]:
    """One policy's GPU rounds in the real run directory `real` of `scenario` (priced with
    the profile the run used, or `costs` where given): `dualpace_sim.results.served_rounds`."""
    loaded = load_for_real_run(scenario, Path(real), Path(costs) if costs else None)[0]
    return served_rounds(loaded, Path(real), policy)


@dataclass(frozen=True)
class NeoRound:
    """A NEO iteration with a forward: its plan, its real time and the simulator's price."""

    index: int  # 0-based, in the run's order
    plan: NeoPlan
    real_s: float  # schedule to apply (its swaps, forward and CPU prefills' copies)
    fixed_s: float  # the model's pre-layer + post-layer + iteration overhead
    predicted_layer_s: float  # what NEO decided with (its tables: layer_time)
    executed_layer_s: float  # what the simulator charges (with the host's eager floor)
    swap_s: float  # the model's time for its swaps (both directions at once, before the forward)
    n_layers: int

    @property
    def model_s(self) -> float:
        """The simulator's price of the iteration, as `NeoNode` charges it (its CPU prefills'
        copies land under the forward)."""
        return self.swap_s + self.fixed_s + self.n_layers * self.executed_layer_s

    @property
    def predicted_s(self) -> float:
        """The same with the predictor's layer time (the model before the eager floor)."""
        return self.swap_s + self.fixed_s + self.n_layers * self.predicted_layer_s

    @property
    def layer_real_s(self) -> float:
        """What one layer took in the real run, if the fixed part and swaps were as modelled."""
        return (self.real_s - self.swap_s - self.fixed_s) / self.n_layers


def neo_rounds(scenario: str, real: str, costs: str | None = None) -> Iterator[NeoRound]:
    """NEO's iterations with a forward in the real run directory `real` of `scenario` (priced
    with the profile `costs` where given), each beside the simulator's price for its plan."""
    cost, calls, journal = _replaying(scenario, real, "neo", costs)
    tables, block = calls.state.p, cost.kv_block_bytes
    pending, index = None, 0
    for e in journal.entries:
        calls(e)
        if e.engine != "gpu":
            continue
        plan = calls.plan("gpu")
        if e.call == "schedule" and plan.batches:
            width = sum(b.width for b in plan.batches)
            rows = sum(len(b) for b in plan.batches)
            fixed = (cost.gpu_pre_layer(width) + cost.gpu_post_layer(rows)
                     + cost.gpu_round_overhead(rows))
            swap = max(cost.d2h_time(plan.swap_out_blocks * block),
                       cost.h2d_time(plan.swap_in_blocks * block))
            pending = (e.t, plan, fixed, layer_time(plan, tables),
                       executed_layer_s(plan, tables, cost), swap)
        elif e.call == "apply" and pending is not None:
            start, plan, fixed, predicted, executed, swap = pending
            yield NeoRound(index, plan, e.t - start, fixed, predicted, executed, swap,
                           cost.n_layers)
            index, pending = index + 1, None
