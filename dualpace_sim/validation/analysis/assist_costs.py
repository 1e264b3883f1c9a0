"""Dense Assist as a DualPace run served it, beside what its profile charges, and the
validation with the run's serving-level assist costs in the profile.

From the run's own engine counters (summary.json): per assist, the wait for the GPU engine's
stage boundary (CPU-Ready to GPU-Running), the service (GPU-Running to GPU-Done), its CUDA
interval and the host part of the service. From the profile: q_x, o_x and g_x(b) averaged over
the run's CPU batches (each Fused-Assist step: N - 1 post-attention assists and one final). Then
a what-if profile with q = wait + host part, o = host part and g scaled to the served CUDA time
(Appendix B's Q and O from the run's totals: one group, not per batch-row group, since runs
before session 9 did not record each assist), written to --write-profile for
`dualpace-sim validate --costs`.

    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.assist_costs \\
        --scenario scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml \\
        --real docs/validation/cpu-busy/r3/real --write-profile /tmp/served-assists.yaml
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from dualpace_sim.costs import CostModel, load_profile
from dualpace_sim.costs.profile import PerAssistPath
from dualpace_sim.validation.analysis import run_analysis
from dualpace_sim.validation.analysis.rounds import cpu_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--real", required=True, help="the real run directory of --scenario")
    ap.add_argument("--write-profile", type=Path, default=None)
    args = ap.parse_args()
    summary = json.loads((Path(args.real) / "summary.json").read_text())
    engine = next(s for s in summary if s["policy"] == "dualpace")["engine"]
    n = engine["assist_calls"]
    wait, service, cuda = (engine[k] / n for k in
                           ("assist_wait_s", "assist_service_s", "assist_gpu_s"))
    host = service - cuda
    profile = load_profile(Path(args.real) / "profile.yaml")
    cm = CostModel(profile)
    steps = list(cpu_steps(args.scenario, args.real))
    layers = cm.n_layers
    g = statistics.fmean(((layers - 1) * cm.assist_gpu("p", s.batch)
                          + cm.assist_gpu("lA", s.batch)) / layers for s in steps)
    print(f"{n} assists over {len(steps)} CPU steps (median batch "
          f"{statistics.median(s.batch for s in steps):g})")
    print(f"served, per assist: stage-boundary wait {wait * 1e3:.3f} ms, service "
          f"{service * 1e3:.3f} ms, CUDA {cuda * 1e3:.3f} ms, host part {host * 1e3:.3f} ms")
    print(f"profile, per assist: q_p {cm.assist_q('p') * 1e3:.4f} ms, o_p "
          f"{cm.assist_o('p') * 1e3:.4f} ms, g over the run's batches {g * 1e3:.3f} ms "
          f"(served CUDA / g = {cuda / g:.2f})")
    if args.write_profile:
        a = profile.assist
        q, o, k = wait + host, host, cuda / g
        per = {x: PerAssistPath(p=v, lA=v, lS=v) for x, v in (("q", q), ("o", o))}
        scaled = {t: getattr(a, t).model_copy(update={"y": [y * k for y in getattr(a, t).y]})
                  for t in ("g_p", "g_lA", "g_lS")}
        profile.model_copy(update={"assist": a.model_copy(update={**per, **scaled})}).save(
            args.write_profile)
        print(f"wrote {args.write_profile}: q = o + wait = {q * 1e3:.3f} ms, o = "
              f"{o * 1e3:.3f} ms, g x {k:.2f}")


if __name__ == "__main__":
    run_analysis(main)
