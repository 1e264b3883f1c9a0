"""NEO's real iterations against the simulator's price, by class: GPU-only or pipelined, with
prefills or decodes only, with swaps or not. For each class: iterations, real and modelled
totals, the median of real / model, and the median real and modelled time of one layer (the
iteration less the model's fixed part and swaps, over the layers). `predicted` is the model
NEO decides with (its tables alone); `model` is what the simulator charges: the same with the
host's floor for issuing each sub-batch's layer eagerly (`dualpace_sim.sim.neo`).

    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.neo_rounds \\
        --scenario scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml \\
        --real docs/validation/cpu-busy/r3/real [--costs PROFILE]

--costs prices the run with another profile of its box (one that measured
neo.eager_decode_layer_s, say).
"""

from __future__ import annotations

import statistics

from dualpace_sim.validation.analysis import run_analysis
from dualpace_sim.validation.analysis.rounds import (
    NeoRound,
    neo_rounds,
    run_arguments,
    selected_runs,
)


def round_class(r: NeoRound) -> str:
    plan = r.plan
    mode = "pipelined" if plan.pipelined else "GPU-only"
    work = "prefill" if any(b.prefills for b in plan.batches) else "decode"
    swaps = ", swaps" if plan.swap_outs or plan.swap_ins else ""
    return f"{mode}, {work}{swaps}"


def main() -> None:
    args = run_arguments(__doc__.split("\n\n")[0])
    print(f"{'NEO iterations':25}{'n':>6}{'real s':>9}{'predicted s':>13}{'model s':>9}"
          f"{'median real/model':>19}{'layer ms: real':>16}{'model':>9}")
    for _, scenario, real in selected_runs(args):
        by: dict[str, list[NeoRound]] = {}
        for r in neo_rounds(scenario, real, args.costs):
            by.setdefault(round_class(r), []).append(r)
        every = [r for rs in by.values() for r in rs]
        for name, rs in [*sorted(by.items()), ("all", every)]:
            print(f"{name:25}{len(rs):>6}{sum(r.real_s for r in rs):>9.2f}"
                  f"{sum(r.predicted_s for r in rs):>13.2f}{sum(r.model_s for r in rs):>9.2f}"
                  f"{statistics.median(r.real_s / r.model_s for r in rs):>19.2f}"
                  f"{statistics.median(r.layer_real_s for r in rs) * 1e3:>16.3f}"
                  f"{statistics.median(r.executed_layer_s for r in rs) * 1e3:>9.3f}")


if __name__ == "__main__":
    run_analysis(main)
