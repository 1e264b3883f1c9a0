"""DualPace's real GPU rounds' excess over their model, by the Dense Assists that fell inside
them: is what a busy CPU engine costs the GPU engine its assists, or something else?

A Fused-Assist step asks the GPU engine for one assist a layer and a Split-Final step for one,
spread over the step; a round's expected assists are each overlapping CPU step's share of them
(the journal has the steps' times, not the assists'). "Model" is `served_rounds`' price of the
round's plan, assists left out, so a round's excess holds whatever its assists cost. Prints the
rounds binned by expected assists, and a least-squares fit excess = a + b x assists + c x [the
round holds a Prefill-to-CPU chunk], for prefill rounds (eager) and decode rounds (graphs)
apart.

    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.prefill_excess \\
        --scenario scenarios/h200/cpu-busy/llama-3.1-8b-sustained-r5.yaml \\
        --real docs/validation/cpu-busy/sustained-r5/real \\
        --costs calibration/h200-spr16/llama-3.1-8b.yaml
"""

from __future__ import annotations

import bisect
import statistics

import numpy as np

from dualpace_sim.core.routing import Route
from dualpace_sim.validation.analysis import run_analysis
from dualpace_sim.validation.analysis.rounds import CpuStep, cpu_steps, gpu_rounds, run_arguments

BINS = ((0, 0.5), (0.5, 2), (2, 5), (5, 10), (10, float("inf")))


def assists_per_step(step: CpuStep, n_layers: int) -> int:
    return {Route.FUSED_ASSIST: n_layers, Route.SPLIT_FINAL: 1}.get(step.route, 0)


def expected_assists(steps: list[CpuStep], starts: list[float], n_layers: int, t0: float,
                     t1: float) -> float:
    """The assists of the CPU steps overlapping [t0, t1], each step's spread evenly."""
    n, i = 0.0, max(bisect.bisect_right(starts, t0) - 1, 0)
    while i < len(steps) and steps[i].start_s < t1:
        s = steps[i]
        overlap = min(t1, s.start_s + s.real_s) - max(t0, s.start_s)
        if overlap > 0 and s.real_s > 0:
            n += assists_per_step(s, n_layers) * overlap / s.real_s
        i += 1
    return n


def main() -> None:
    args = run_arguments(__doc__.split("\n\n")[0])
    steps = sorted(cpu_steps(args.scenario, args.real), key=lambda s: s.start_s)
    starts = [s.start_s for s in steps]
    rounds = list(gpu_rounds(args.scenario, args.real, "dualpace", args.costs))
    for prefill in (True, False):
        rs = [r for r in rounds if r.prefill == prefill]
        if not rs:
            continue
        x = np.array([expected_assists(steps, starts, r.n_layers, r.start_s,
                                       r.start_s + r.real_s) for r in rs])
        to_cpu = np.array([float(r.to_cpu_tokens > 0) for r in rs])
        excess = np.array([r.real_s - r.model_s for r in rs])
        a, b, c = np.linalg.lstsq(np.column_stack([np.ones_like(x), x, to_cpu]), excess,
                                  rcond=None)[0]
        kind = "prefill rounds (eager)" if prefill else "decode-only rounds (graphs)"
        print(f"{kind}: {len(rs)}; excess = {1e3 * a:.2f} ms + {1e3 * b:.3f} ms a assist "
              f"+ {1e3 * c:.2f} ms with a Prefill-to-CPU chunk")
        print(f"  {'expected assists':18}{'rounds':>8}{'mean assists':>14}"
              f"{'median excess ms':>18}")
        for lo, hi in BINS:
            m = (x >= lo) & (x < hi)
            if m.any():
                label = f"{lo:g}-{hi:g}" if hi != float("inf") else f">= {lo:g}"
                print(f"  {label:18}{int(m.sum()):>8}{x[m].mean():>14.2f}"
                      f"{1e3 * statistics.median(excess[m]):>18.2f}")


if __name__ == "__main__":
    run_analysis(main)
