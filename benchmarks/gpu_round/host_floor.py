"""Where DualPace's small prefill rounds lose time on the GPU engine's host.

On the H200 box, prefill rounds of fewer than 256 tokens are bound by the host issuing each
layer's kernels, and DualPace's ran 15-20 % slower per layer than vLLM's in two of the three
validation runs, where the profiler's stand-in found DualPace's placement faster
(docs/validation/README.md, item 3). This runs one small mixed round (a 64-token chunk and 8
decodes, as the profiler's `gpu.eager_layer_s`) again and again in each of the ways the
profiler and the runtime run it, in one process, and prints the time per layer of each:

* layer, back to back: the profiler's measurement (`Measurer.eager_prefill_layer`: one
  layer run eagerly, all cores);
* round, all cores: vLLM's engine (`GpuExecutor.execute`);
* round, cores left: the same on the cores `--cpu-cores` leaves, as DualPace's GPU engine has;
* DualPace's loop: stage by stage, polling the Dense Assist control block at each boundary,
  beside the runtime's CPU engine process, alive and idle on its cores, on the cores left.

A round's per-layer time is the round less the model's pre-layer, post-layer and overhead,
over the layers (as `dualpace_sim/validation/analysis/small_prefill_floors.py` reads the journals).

    python -m benchmarks.gpu_round.host_floor --profile calibration/h200-spr16/llama-3.1-8b.yaml \\
        --cpu-cores 14
    python -m benchmarks.gpu_round.host_floor --roofline rtx4090-xeon4510-12c --model tiny-llama \\
        --device cpu --cpu-cores 1 --rounds 3        # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.profile_args import add_profile_arguments, profile_from
from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.profiler.grids import Grids
from dualpace_hw.profiler.measure import Measurer, small_mixed_plan
from dualpace_hw.profiler.timing import Protocol, Timer
from dualpace_hw.runtime.assist_server import AssistServer
from dualpace_hw.runtime.cpu_worker import CpuEngineProcess
from dualpace_hw.runtime.engines import Engines
from dualpace_hw.runtime.processes import on_cores
from dualpace_sim.costs import CostModel


def median_s(fn: Callable[[], None], device: torch.device, rounds: int, warmups: int = 3
             ) -> float:
    """Median wall time of `fn`, each call ending with the device idle."""
    times = []
    for i in range(warmups + rounds):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmups:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_profile_arguments(ap)
    ap.add_argument("--cpu-cores", type=int, required=True,
                    help="cores of the CPU engine (the first N; its GPU engine keeps the rest)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    profile = profile_from(ap, args)
    cm, shape, bs = CostModel(profile), profile.model, profile.block_size
    dev = torch.device(args.device)
    cores = sorted(os.sched_getaffinity(0))
    if not 0 < args.cpu_cores < len(cores):
        ap.error(f"--cpu-cores must leave this process a core (it has {len(cores)})")
    engine_cores, left = cores[:args.cpu_cores], cores[args.cpu_cores:]

    weights = ModelWeights.random(shape, seed=0, device=dev)
    model = Model(shape, weights)
    pool = PagedKVPool(shape, 64, bs, dev)
    tokens = TokenStore()
    plan = small_mixed_plan(tokens, bs, pool.n_blocks)
    fixed = (cm.gpu_pre_layer(plan.n_tokens) + cm.gpu_post_layer(plan.n_sampled)
             + cm.gpu_iteration_overhead)
    n = shape.n_layers

    def per_layer(round_s: float) -> float:
        return (round_s - fixed) / n

    rows: dict[str, float] = {}
    protocol = Protocol()
    measurer = Measurer(shape, dev, Timer(dev, protocol), Timer(torch.device("cpu"), protocol),
                        Grids.quick(), bs, cpu=False)
    rows["layer, back to back (the profile's)"] = measurer.eager_prefill_layer()
    vllm = GpuExecutor(model, pool, tokens, cuda_graphs=False)
    rows["round, all cores (vLLM)"] = per_layer(
        median_s(lambda: vllm.execute(plan), dev, args.rounds))
    with on_cores(left):
        rows["round, cores left"] = per_layer(
            median_s(lambda: vllm.execute(plan), dev, args.rounds))

    engine = CpuEngineProcess(weights, shape, 64, bs, max_rows=8, cores=engine_cores)
    try:
        ex = GpuExecutor(model, pool, tokens, engine.host_pool, cuda_graphs=False)
        server = AssistServer(engine.assist, Engines([], bs, shape.vocab_size))

        def dualpace_round() -> None:
            fw = ex.stages(plan)
            for stage in fw:
                stage()
                server.serve(ex)
            fw.result()

        with on_cores(left):
            rows["DualPace's loop, cores left, CPU engine idle"] = per_layer(
                median_s(dualpace_round, dev, args.rounds))
    finally:
        engine.close()

    base = next(iter(rows.values()))
    print(f"{'how the round runs':<48}{'ms / layer':>11}{'vs profile':>12}")
    for name, v in rows.items():
        print(f"{name:<48}{v * 1e3:>11.3f}{v / base:>12.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": args.profile or f"roofline {args.roofline}",
                       "model": shape.name, "cpu_cores": args.cpu_cores,
                       "per_layer_s": rows}, f, indent=2)


if __name__ == "__main__":
    main()
