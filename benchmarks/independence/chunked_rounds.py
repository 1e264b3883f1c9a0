"""Rounds with prefill chunks, eager against the chunked rounds' layer graphs.

A round with a prefill chunk used to run eagerly, and on the H200 box its host issued it more
slowly than the GPU ran it. Served stage by stage (`run_forward`, the host at most a stage
ahead, as DualPace serves Dense Assists) that gap showed in every stage. This measures, for a
few mixed rounds (one chunk, some decodes), each way: the round's wall time run whole, its
kernels' time and the host's stream synchronizations a round (torch.profiler, CUDA), then,
for the rounds DualPace serves beside its CPU engine, served rounds a second alone and beside
Fused-Assist steps of the CPU engine (`cpu_independence.beside_fused_assist`). It prints the
ratio it is judged by: served rounds a second beside the CPU engine, graphs over eager.

    python -m benchmarks.independence.chunked_rounds --model llama-3.1-8b --cpu-cores 14 \\
        --json out.json
    python -m benchmarks.independence.chunked_rounds --model tiny-llama --device cpu --smoke   # CI
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.independence.cpu_engine import (
    BS,
    beside_fused_assist,
    cpu_step,
    engine_beside,
    gpu_plan,
)
from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_sim.core.routing import Route
from dualpace_sim.costs.shapes import ModelShape

ROUNDS = ((512, 64, 2048), (1024, 32, 1024), (256, 128, 1024), (2048, 0, 2048))
SMOKE = ((16, 2, 32),)


def round_ms(ex: GpuExecutor, plan, sync, n: int) -> float:
    """A whole round's wall time, the median of 3 runs of `n` back to back."""
    ex.execute(plan)
    sync()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            ex.execute(plan)
        sync()
        times.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(times)


def profiled(ex: GpuExecutor, plan, sync) -> dict[str, float]:
    """Kernel milliseconds and stream synchronizations a round, over two rounds."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ex.cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(2):
            ex.execute(plan)
        sync()
    events = prof.key_averages()
    syncs = sum(e.count for e in events if e.key == "cudaStreamSynchronize")
    kernels = sum(e.self_device_time_total for e in events
                  if e.device_type == torch.autograd.DeviceType.CUDA)
    return {"stream_syncs_per_round": syncs / 2, "kernel_ms_per_round": kernels / 2e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cpu-cores", type=int, default=None,
                    help="cores of the CPU engine (the last N; the rest run this process)")
    ap.add_argument("--batch", type=int, default=48, help="CPU batch of the Fused-Assist steps")
    ap.add_argument("--context", type=int, default=2048, help="tokens per CPU row")
    ap.add_argument("--steps", type=int, default=6, help="CPU steps timed beside each")
    ap.add_argument("--smoke", action="store_true", help="one tiny round (tests)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    shape, dev = ModelShape.from_name(args.model), torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    weights = ModelWeights.random(shape, seed=0, device=dev)
    engine = engine_beside(weights, shape, args.batch, args.context, args.cpu_cores)
    step = cpu_step(args.batch, args.context, Route.FUSED_ASSIST)
    out: dict[str, dict[str, float]] = {}
    try:
        for chunk, decodes, context in SMOKE if args.smoke else ROUNDS:
            tokens = TokenStore()
            blocks = decodes * -(-context // BS) + -(-(chunk + 1) // BS)
            plan = gpu_plan(tokens, shape.vocab_size, chunk, decodes, context)
            for graphs in (False, True):
                ex = GpuExecutor(Model(shape, weights), PagedKVPool(shape, blocks, BS,
                                                                    device=dev),
                                 tokens, engine.host_pool, chunked_graphs=graphs)
                key = f"{chunk}+{decodes}@{context} {'graphs' if graphs else 'eager'}"
                r = {"round_ms_alone": round_ms(ex, plan, sync, 3 if args.smoke else 20)}
                r.update(profiled(ex, plan, sync))
                if decodes and chunk <= 512:  # the rounds DualPace serves beside its CPU engine
                    r.update(beside_fused_assist(ex, plan, engine, step, sync, args.steps))
                out[key] = r
                print(key + ": " + ", ".join(f"{k} {v:.4g}" for k, v in r.items()), flush=True)
                del ex
    finally:
        engine.close()
    for key in out:
        if key.endswith(" graphs") and "gpu_served_rounds_per_s_beside_fused" in out[key]:
            eager = out[key.replace(" graphs", " eager")]
            ratio = (out[key]["gpu_served_rounds_per_s_beside_fused"]
                     / eager["gpu_served_rounds_per_s_beside_fused"])
            print(f"{key[:-7]}: served rounds a second beside Fused-Assist steps, graphs over "
                  f"eager: {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
