"""The CPU engine's decode step through the runtime's own process, against the cost model.

On the H200 box, real Fused-Assist CPU steps took 1.4-3.3x what the simulator charges for them
(docs/validation/README.md). Those figures came from journals, where a step's time mixes the
CPU engine's own work with waits for the GPU engine's stage boundaries. This benchmark takes
the waits out, so the part of the gap that is the CPU engine's process shows on its own. It
runs the runtime's CPU engine process (`CpuEngineProcess`: shared host pool, packed weights,
Dense Assist through the shared control block) with a thread of this process serving every
assist as soon as it is published, as the GPU engine does at a stage boundary. For each route
and batch it prints the measured step, the model's step from the profile (pre-layer, overhead,
N x (pre-attention + attention), the route's T_r(b)), and their ratio. It splits the step into:

* CPU-local time: the step less the time spent in assists, against the model's CPU terms;
* each assist end to end (CPU-Ready to the worker seeing GPU-Done, buffer copies included),
  against a_w + q + g + a_r; and on the serving side its service (GPU-Running to GPU-Done)
  and the CUDA time within it, against the profile's g.

    python -m benchmarks.cpu_step.vs_model --profile calibration/h200-spr16/llama-3.1-8b.yaml \\
        --cpu-cores 14
    python -m benchmarks.cpu_step.vs_model --roofline rtx4090-xeon4510-12c --model tiny-llama \\
        --device cpu --batches 1 2 --context 32 --steps 2        # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import torch

from benchmarks.profile_args import add_cpu_step_arguments, add_profile_arguments, profile_from
from dualpace_hw.executors.cpu_executor import CpuStep
from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.runtime.assist_server import AssistServer
from dualpace_hw.runtime.cpu_worker import CpuEngineProcess
from dualpace_hw.runtime.engines import Engines
from dualpace_sim.core.routing import Route
from dualpace_sim.costs import CostModel
from dualpace_sim.costs.fit.thresholds import route_cost

ROUTES = (Route.FUSED_ASSIST, Route.FULL_CPU, Route.SPLIT_FINAL)  # the open gap first


def model_step(cm: CostModel, route: Route, b: int, context: int) -> dict[str, float]:
    """The simulator's step (as `cpu_iteration_time`) and its parts, for one route."""
    rc, n = route_cost(cm, b), cm.n_layers
    local = cm.cpu_pre_layer(b) + cm.cpu_iteration_overhead + n * cm.cpu_layer_local(b, b * context)
    if route == Route.FULL_CPU:
        return {"step": local + rc.t_full, "local": local + rc.t_full, "per_assist": 0.0}
    if route == Route.SPLIT_FINAL:
        return {"step": local + rc.t_split, "local": local + n * rc.t_p,
                "per_assist": rc.tbar_lS}
    return {"step": local + rc.t_fused, "local": local,
            "per_assist": rc.t_fused / n}


def assists_per_step(route: Route, n_layers: int) -> int:
    return {Route.FULL_CPU: 0, Route.SPLIT_FINAL: 1, Route.FUSED_ASSIST: n_layers}[route]


class Server:
    """A thread serving Dense Assists the moment they are published (no stage-boundary wait)."""

    def __init__(self, engine: CpuEngineProcess, ex: GpuExecutor, vocab: int) -> None:
        self.server = AssistServer(engine.assist, Engines([], 16, vocab))
        self.ex = ex

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.server.serve(self.ex):
                time.sleep(20e-6)

    def __enter__(self) -> Server:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure(engine: CpuEngineProcess, server: AssistServer, step: CpuStep, steps: int
            ) -> tuple[float, float, float, float]:
    """Median step time and median time in assists over `steps` steps (after one warm-up),
    and per assist on the GPU side, the mean service (GPU-Running to GPU-Done) and its CUDA
    time (0 off CUDA)."""
    engine.step(step, lambda: False)
    calls, service, gpu = server.calls, server.service_s, server.gpu_s
    runs = [engine.step(step, lambda: False) for _ in range(steps)]
    n = max(server.calls - calls, 1)
    return (statistics.median(r.busy_s for r in runs), statistics.median(r.assist_s for r in runs),
            (server.service_s - service) / n, (server.gpu_s - gpu) / n)


def print_row(r: dict) -> None:
    assist = (f"{r['per_assist_s'] * 1e3:>11.3f}{r['model_per_assist_s'] * 1e3:>8.3f}"
              if r["model_per_assist_s"] else f"{'-':>11}{'-':>8}")
    served = (f"{r['service_per_assist_s'] * 1e3:>9.3f}{r['cuda_per_assist_s'] * 1e3:>8.3f}"
              if r["model_per_assist_s"] else f"{'-':>9}{'-':>8}")
    print(f"{r['route']:<13}{r['batch']:>5}{r['step_s'] * 1e3:>10.2f}"
          f"{r['model_step_s'] * 1e3:>9.2f}{r['step_s'] / r['model_step_s']:>7.2f}"
          f"{r['local_s'] / r['model_local_s']:>13.2f}{assist}{served}", flush=True)


def write_json(args: argparse.Namespace, model: str, cores: list[int] | None,
               rows: list[dict]) -> None:
    with open(args.json, "w") as f:
        json.dump({"profile": args.profile or f"roofline {args.roofline}", "model": model,
                   "context": args.context, "cpu_cores": str(cores), "rows": rows}, f, indent=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_profile_arguments(ap)
    add_cpu_step_arguments(ap)
    ap.add_argument("--routes", nargs="+", default=[r.value for r in ROUTES],
                    choices=[r.value for r in ROUTES], help="routes to time, in this order")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    profile = profile_from(ap, args)
    cm, shape = CostModel(profile), profile.model
    bs, dev = profile.block_size, torch.device(args.device)
    cores_all = sorted(os.sched_getaffinity(0))
    cores = cores_all[:args.cpu_cores] if args.cpu_cores else None
    nb = -(-args.context // bs)
    top = max(args.batches)
    weights = ModelWeights.random(shape, seed=0, device=dev)
    engine = CpuEngineProcess(weights, shape, top * nb, bs, max_rows=top, cores=cores)
    if cores and set(cores_all) - set(cores):
        os.sched_setaffinity(0, set(cores_all) - set(cores))  # as the runtime does
        torch.set_num_threads(len(set(cores_all) - set(cores)))
    ex = GpuExecutor(Model(shape, weights), PagedKVPool(shape, 1, bs, device=dev), TokenStore(),
                     engine.host_pool)
    rows = []
    print(f"set up in {time.perf_counter() - t0:.1f} s (weights, packed CPU weights, host pool)")
    print(f"{'route':<13}{'b':>5}{'step ms':>10}{'model':>9}{'ratio':>7}{'local ratio':>13}"
          f"{'assist ms':>11}{'model':>8}{'served':>9}{'cuda':>8}", flush=True)
    try:
        with Server(engine, ex, shape.vocab_size) as srv:
            for route in map(Route, args.routes):
                for b in args.batches:
                    step = CpuStep(route, list(range(b)), [1] * b, [args.context - 1] * b,
                                   [list(range(i * nb, (i + 1) * nb)) for i in range(b)])
                    real, in_assists, service, cuda = measure(engine, srv.server, step,
                                                              args.steps)
                    model = model_step(cm, route, b, args.context)
                    k = assists_per_step(route, shape.n_layers)
                    rows.append({
                        "route": route.value, "batch": b, "context": args.context,
                        "step_s": real, "model_step_s": model["step"],
                        "local_s": real - in_assists, "model_local_s": model["local"],
                        "per_assist_s": in_assists / k if k else 0.0,
                        "model_per_assist_s": model["per_assist"],
                        "service_per_assist_s": service, "cuda_per_assist_s": cuda,
                    })
                    print_row(rows[-1])
                    if args.json:  # as it goes: a run cut short keeps its rows
                        write_json(args, shape.name, cores, rows)
    finally:
        engine.close()
    for route in args.routes:
        ratios = [r["step_s"] / r["model_step_s"] for r in rows if r["route"] == route]
        print(f"{route} step, measured / model: median {statistics.median(ratios):.2f} "
              f"(1.00 = the simulator charges what the runtime's CPU engine takes)")


if __name__ == "__main__":
    main()
