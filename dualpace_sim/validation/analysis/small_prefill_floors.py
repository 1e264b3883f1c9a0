"""Per-layer time of the small prefill rounds of the real runs (fewer than 256 tokens: bound by
the host issuing each layer's kernels), by policy and by whether a CPU step was in flight when
the round was scheduled. Read from the runtime's journals, each round's time less the cost
model's pre-layer, post-layer and overhead; the first three rounds are left out.

    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.small_prefill_floors 4 8 12
    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.small_prefill_floors \
        --scenario scenarios/h200x2/validation/qwen3-14b-r4.yaml \
        --real docs/validation/h200x2/r4/real --costs calibration/h200x2-xeon32/qwen3-14b.yaml

The rates name the committed H200 runs; --scenario/--real any other, priced with the profile it
was made with or --costs.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from dualpace_sim.validation.analysis import run_analysis
from dualpace_sim.validation.analysis.rounds import gpu_rounds, run_arguments, selected_runs


def floors(scenario: str, real: str, policy: str, costs: str | None = None
           ) -> dict[bool, list[float]]:
    out: dict[bool, list[float]] = {True: [], False: []}
    for r in gpu_rounds(scenario, real, policy, costs):
        if r.index >= 3 and r.prefill and r.n_tokens < 256:
            out[r.cpu_step_in_flight].append((r.real_s - r.fixed_s) / r.n_layers)
    return out


def main() -> None:
    args = run_arguments(__doc__.split("\n\n")[0])
    for rate, scenario, real in selected_runs(args):
        label = f"{rate} req/s" if rate else Path(real).parent.name
        for policy in ("dualpace", "vllm"):
            for busy, values in floors(scenario, real, policy, args.costs).items():
                if values:
                    print(f"{label} {policy:8s} CPU step in flight: {str(busy):5s} "
                          f"n={len(values):3d} median {statistics.median(values) * 1e3:.2f} ms")


if __name__ == "__main__":
    run_analysis(main)
