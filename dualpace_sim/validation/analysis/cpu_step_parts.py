"""Where DualPace's real Fused-Assist CPU steps spend their time, beside the model, by batch
size: the assists' CPU-visible waits (W) and CUDA intervals as served (G) against the profile's
g_x on an idle GPU, and the CPU engine's own work (the step less its waits) against the model's
pre-layer, overhead and N x (pre-attention + attention + assist write + read). A served-to-idle
CUDA ratio above 1 is the GPU engine's kernels running beside the assists; a CPU ratio above 1
is work or slowness of the CPU engine that the profile's stage tables do not hold. Runs that
recorded their steps' phases (`cpu-steps-dualpace.csv.gz`, since session 16) get a second table:
pre-attention and attention as served against their tables, and the rest of the CPU's work.

    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.cpu_step_parts \\
        --scenario scenarios/h200/cpu-busy/llama-3.1-8b-sustained-r5.yaml \\
        --real docs/validation/cpu-busy/session16/sustained-r5/real \\
        --costs calibration/h200-spr16/llama-3.1-8b.yaml
"""

from __future__ import annotations

import argparse
import statistics

from dualpace_sim.validation.analysis import run_analysis
from dualpace_sim.validation.analysis.rounds import FusedAssistStep, cpu_step_parts

BATCHES = ((1, 15), (16, 63), (64, 127), (128, 179), (180, 1 << 30))


def table(steps: list[FusedAssistStep]) -> list[str]:
    lines = [f"{'CPU batch':<10}{'n':>5}{'step ms':>9}{'W ms':>8}{'G ms':>8}{'g ms':>8}"
             f"{'G/g':>6}{'CPU ms':>8}{'model':>8}{'CPU ratio':>11}"]
    for lo, hi in BATCHES:
        group = [s for s in steps if lo <= s.batch <= hi]
        if not group:
            continue

        def mean(values) -> float:
            return statistics.fmean(values) * 1e3

        served, idle = mean(s.served_cuda_s for s in group), mean(s.idle_cuda_s for s in group)
        cpu, model = mean(s.cpu_real_s for s in group), mean(s.cpu_model_s for s in group)
        size = f"{lo}-{hi}" if hi < 1 << 30 else f">= {lo}"
        lines.append(f"{size:<10}{len(group):>5}{mean(s.real_s for s in group):>9.1f}"
                     f"{mean(s.waits_s for s in group):>8.1f}{served:>8.1f}{idle:>8.1f}"
                     f"{served / idle:>6.2f}{cpu:>8.1f}{model:>8.1f}{cpu / model:>11.2f}")
    return lines


def phase_table(steps: list[FusedAssistStep]) -> list[str]:
    """Where the runtime recorded each step's phases: the CPU engine's pre-attention (with its
    KV store) and attention against the profile's tables, and what the rest of its own work
    (setup, embedding, assist buffers, the worker loop) took beyond them."""
    lines = [f"{'CPU batch':<10}{'n':>5}{'pre-attn ms':>12}{'model':>8}{'ratio':>7}"
             f"{'attention ms':>13}{'model':>8}{'ratio':>7}{'rest ms':>9}"]
    for lo, hi in BATCHES:
        group = [s for s in steps if lo <= s.batch <= hi and s.phases is not None]
        if not group:
            continue

        def mean(values) -> float:
            return statistics.fmean(values) * 1e3

        pre = mean(s.phases.pre_attn_s + s.phases.kv_write_s for s in group)
        attn = mean(s.phases.attention_s for s in group)
        pre_m, attn_m = mean(s.model_pre_attn_s for s in group), mean(
            s.model_attention_s for s in group)
        rest = mean(s.cpu_real_s for s in group) - pre - attn
        size = f"{lo}-{hi}" if hi < 1 << 30 else f">= {lo}"
        lines.append(f"{size:<10}{len(group):>5}{pre:>12.1f}{pre_m:>8.1f}{pre / pre_m:>7.2f}"
                     f"{attn:>13.1f}{attn_m:>8.1f}{attn / attn_m:>7.2f}{rest:>9.1f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--real", required=True, help="the real run directory")
    ap.add_argument("--costs", default=None, help="price with this profile (default: the run's)")
    args = ap.parse_args()
    steps = list(cpu_step_parts(args.scenario, args.real, args.costs))
    print(f"{len(steps)} Fused-Assist steps in {args.real}")
    print("\n".join(table(steps)))
    if any(s.phases is not None for s in steps):
        print("\nthe CPU engine's own work, phase by phase (cpu-steps-dualpace.csv.gz)")
        print("\n".join(phase_table(steps)))


if __name__ == "__main__":
    run_analysis(main)
