"""What a busy CPU engine costs DualPace's GPU engine in serving, beyond the Dense Assists it
serves: the real GPU rounds against the cost model, with and without a CPU step in flight.

    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.engine_interference \
        --scenario scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml \
        --real docs/validation/cpu-busy/r3/real

Rounds with Prefill-to-CPU chunks are left out (their attention is its own question:
gpu_round_classes.py). The GPU engine serves every assist between its own stages, inside its
rounds, so beside a CPU step a round is longer than its model by the assists it served; the
run's summary counts their service time (`engine.assist_service_s`). If the rounds beside a CPU
step exceed their model by no more than that, the busy CPU engine slows the GPU engine by
nothing the assists do not already explain.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from dualpace_sim.validation.analysis import run_analysis
from dualpace_sim.validation.analysis.rounds import gpu_rounds, run_arguments, selected_runs


def main() -> None:
    args = run_arguments(__doc__.split("\n\n")[0])
    for rate, scenario, real in selected_runs(args):
        name = f"{rate} req/s" if rate else Path(real).parent.name
        summary = next(s for s in json.loads((Path(real) / "summary.json").read_text())
                       if s["policy"] == "dualpace")
        rounds = [r for r in gpu_rounds(scenario, real, "dualpace", args.costs)
                  if not r.to_cpu_tokens]
        excess = 0.0
        for busy in (False, True):
            rs = [r for r in rounds if r.cpu_step_in_flight == busy]
            if not rs:
                continue
            real_s, model_s = sum(r.real_s for r in rs), sum(r.model_s for r in rs)
            ratio = statistics.median(r.real_s / r.model_s for r in rs)
            where = "beside a CPU step" if busy else "CPU engine idle  "
            print(f"{name} GPU rounds {where}: n={len(rs):>6} real {real_s:7.2f} s, model "
                  f"{model_s:7.2f} s, median real/model {ratio:.3f}")
            if busy:
                excess = real_s - model_s
        served = summary["engine"]["assist_service_s"]
        calls = summary["engine"]["assist_calls"]
        verdict = ("within what the assists cost: no slowdown beyond them"
                   if excess <= served else
                   f"{excess - served:.2f} s beyond what the assists cost")
        print(f"{name} excess beside a CPU step {excess:.2f} s; the run's {calls} assists were "
              f"served in {served:.2f} s: {verdict}")


if __name__ == "__main__":
    run_analysis(main)
