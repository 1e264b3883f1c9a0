"""DualPace's rounds on the box beside the simulator's own, for one CPU-busy case: the GPU
rounds by class (prefill tokens; with or without a Prefill-to-CPU chunk), the real prefill
rounds' excess over their model by whether a CPU step was in flight, and the CPU rounds by
batch size. "Simulated" is the simulator's round (its `--trace-events` slices, Dense Assists
included) with the `--costs` profile; "model" is `served_rounds`' price of the real plan with
the same profile, assists left out.

    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.sim_vs_real_rounds \\
        --scenario scenarios/h200/cpu-busy/llama-3.1-8b-w2-r3.yaml \\
        --real docs/validation/cpu-busy/w2-r3/real \\
        --costs calibration/h200-spr16/llama-3.1-8b.yaml
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from dualpace_sim.experiments.runner import run_scenario
from dualpace_sim.results.trace_events import CPU_ENGINE, GPU_ENGINE
from dualpace_sim.validation.analysis import run_analysis
from dualpace_sim.validation.analysis.rounds import cpu_steps, gpu_rounds, run_arguments

CPU_BATCHES = ((1, 15), (16, 63), (64, 127), (128, 159), (160, 179), (180, 1 << 30))


def gpu_class(prefill_tokens: int, to_cpu: bool) -> str:
    if not prefill_tokens:
        return "decode only"
    size = ("< 256" if prefill_tokens < 256 else "256-1,023" if prefill_tokens < 1024
            else ">= 1,024")
    return f"{size}, {'to CPU' if to_cpu else 'GPU only'}"


def simulated_slices(scenario: str, costs: str | None = None) -> tuple[list[dict], list[dict]]:
    """The simulator's GPU forwards and CPU rounds (trace slices) for DualPace, with the
    profile `costs` where given (else the scenario's, which moves as the box is re-profiled)."""
    changes: dict[str, object] = {"policies": ["dualpace"]}
    if costs:
        changes["profile"] = str(Path(costs).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        run_scenario(Path(scenario), Path(tmp) / "run", progress=False, trace_events=trace,
                     changes=changes)
        events = json.loads(trace.read_text())["traceEvents"]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e.get("name") == "thread_name"}
    slices = [e for e in events if e.get("ph") == "X"]
    gpu = [e for e in slices if tracks[e["pid"], e["tid"]] == GPU_ENGINE
           and e["name"] == "forward"]
    cpu = [e for e in slices if tracks[e["pid"], e["tid"]] == CPU_ENGINE
           and "batch" in e.get("args", {})]
    return gpu, cpu


def mean_ms(values: list[float]) -> str:
    if not values:
        return f"{'-':>6} {'-':>8}"
    return f"{len(values):>6} {1e3 * statistics.mean(values):8.1f}"


def main() -> None:
    args = run_arguments(__doc__.split("\n\n")[0])
    sim_gpu, sim_cpu = simulated_slices(args.scenario, args.costs)
    sim, real, model = defaultdict(list), defaultdict(list), defaultdict(list)
    for e in sim_gpu:
        a = e["args"]
        sim[gpu_class(a["prefill_tokens"], bool(a["to_cpu"]))].append(e["dur"] / 1e6)
    rounds = list(gpu_rounds(args.scenario, args.real, "dualpace", args.costs))
    for r in rounds:
        k = gpu_class(r.n_tokens if r.prefill else 0, r.to_cpu_tokens > 0)
        real[k].append(r.real_s)
        model[k].append(r.model_s)
    print(f"{'GPU round':22}{'sim n':>6} {'ms':>8}{'real n':>7} {'ms':>8} {'model ms':>9}")
    for k in sorted(set(sim) | set(real)):
        print(f"{k:22}{mean_ms(sim[k])}{mean_ms(real[k])} "
              f"{1e3 * statistics.mean(model[k]) if model[k] else float('nan'):9.1f}")
    print(f"\n{'real prefill rounds':34}{'n':>5}{'median excess ms/layer':>24}")
    for busy in (False, True):
        for to_cpu in (False, True):
            xs = [r for r in rounds if r.prefill and r.cpu_step_in_flight == busy
                  and (r.to_cpu_tokens > 0) == to_cpu]
            if xs:
                excess = statistics.median((r.real_s - r.model_s) / r.n_layers for r in xs)
                label = f"CPU {'busy' if busy else 'idle'}, {'to CPU' if to_cpu else 'GPU only'}"
                print(f"{label:34}{len(xs):>5}{1e3 * excess:24.2f}")
    steps = list(cpu_steps(args.scenario, args.real))
    print(f"\n{'CPU batch':14}{'sim n':>6} {'mean s':>8}{'real n':>7} {'mean s':>8}")
    for lo, hi in CPU_BATCHES:
        s = [e["dur"] / 1e6 for e in sim_cpu if lo <= e["args"]["batch"] <= hi]
        r = [c.real_s for c in steps if lo <= c.batch <= hi]
        label = f"{lo}-{hi}" if hi < 1 << 30 else f">= {lo}"
        print(f"{label:14}{len(s):>6} {statistics.mean(s) if s else float('nan'):8.3f}"
              f"{len(r):>7} {statistics.mean(r) if r else float('nan'):8.3f}")


if __name__ == "__main__":
    run_analysis(main)
