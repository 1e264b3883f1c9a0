"""Real GPU rounds against the cost model, by class: decode only (CUDA graphs), and rounds with
prefill (eager) of fewer than 256, 256 to 1,023 and at least 1,024 tokens. For each class and
policy: rounds, real and modelled totals, and the median of real / model. DualPace's two larger
prefill classes are shown again split by whether the round holds a Prefill-to-CPU chunk.

    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.gpu_round_classes 4 8 12
    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.gpu_round_classes \
        --scenario scenarios/h200x2/validation/qwen3-14b-r4.yaml \
        --real docs/validation/h200x2/r4/real \
        --costs calibration/h200x2-xeon32/qwen3-14b.yaml

The rates name the committed H200 runs; --scenario/--real any other (its policies' journals).
The model is the profile each run was made with, or --costs (a re-profile of the same box).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from dualpace_sim.results.served_rounds import ServedRound
from dualpace_sim.validation.analysis import run_analysis
from dualpace_sim.validation.analysis.rounds import gpu_rounds, run_arguments, selected_runs

CLASSES = ("decode only", "prefill, < 256 tokens", "prefill, 256-1,023", "prefill, >= 1,024")


def round_class(r: ServedRound) -> str:
    if not r.prefill:
        return CLASSES[0]
    return CLASSES[1] if r.n_tokens < 256 else CLASSES[2] if r.n_tokens < 1024 else CLASSES[3]


def main() -> None:
    args = run_arguments(__doc__.split("\n\n")[0])
    print(f"{'rate':>4}  {'policy':9}{'GPU rounds':23}{'n':>6}{'real s':>9}{'model s':>9}"
          f"{'median real/model':>19}")
    for rate, scenario, real in selected_runs(args):
        rate = rate or "-"
        for policy in ("dualpace", "vllm"):
            if not any(Path(real).glob(f"journal-{policy}.*")):
                continue
            by: dict[str, list[ServedRound]] = {c: [] for c in CLASSES}
            for r in gpu_rounds(scenario, real, policy, args.costs):
                by[round_class(r)].append(r)
            rows = [(c, rs) for c, rs in by.items()]
            if policy == "dualpace":  # the prefill classes again, split by Prefill-to-CPU
                rows += [(f"{c[9:]}, {'to CPU' if to_cpu else 'GPU only'}",
                          [r for r in by[c] if bool(r.to_cpu_tokens) == to_cpu])
                         for c in CLASSES[2:] for to_cpu in (True, False)]
            for c, rs in rows:
                if rs:
                    ratio = statistics.median(r.real_s / r.model_s for r in rs)
                    print(f"{rate:>4}  {policy:9}{c:23}{len(rs):>6}"
                          f"{sum(r.real_s for r in rs):>9.2f}{sum(r.model_s for r in rs):>9.2f}"
                          f"{ratio:>19.2f}")


if __name__ == "__main__":
    run_analysis(main)
