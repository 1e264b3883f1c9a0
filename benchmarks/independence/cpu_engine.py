"""Does the CPU engine keep its pace while the GPU engine is saturated?

The runtime's CPU engine executes in its own process (dualpace_hw.runtime.cpu_worker) so that the
GPU engine's Python (kernel launches, stage loop) cannot hold it up through the GIL. This measures
that: the CPU engine's decode steps per second alone, then while a thread of this process drives the
GPU executor flat out with mixed prefill+decode batches (`--eager-chunked`: without the chunked
rounds' layer graphs, the most Python per GPU second), and the ratio, judged against 0.90. For
contrast it measures the same CPU executor run in a thread of this process (the design the runtime
does not use), and the GPU engine's rounds per second alone vs beside the CPU engine (host memory
and PCIe interference).

The GPU engine's side is measured twice. Beside Full-CPU steps (no Dense Assist) it runs whole
rounds; beside Fused-Assist steps it runs them as the runtime serves them (`run_forward`: stage
by stage, the host at most a stage ahead, the CPU engine's assists served at the boundaries),
once with the assists on the executor's assist stream and once on the compute stream (as
before session 14: served DualPace prefill rounds were 1.5x their model while the CPU engine
decoded, docs/validation/README.md). Eager mixed rounds are where that shows: the host issues
a stage in about the time the GPU runs it, so a stage the GPU waits for is a stage lost.

    python -m benchmarks.independence.cpu_engine --model llama-3.1-8b --cpu-cores 14
    python -m benchmarks.independence.cpu_engine --model tiny-llama --device cpu --steps 5   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import torch

from dualpace_hw.executors.cpu_executor import CpuExecutor, CpuStep
from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.executors.packed import pack_model
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.runtime.assist_server import AssistServer, run_forward
from dualpace_hw.runtime.cpu_worker import CpuEngineProcess
from dualpace_hw.runtime.engines import Engines
from dualpace_hw.runtime.processes import cores_off
from dualpace_sim.core import GpuPlan, PrefillChunk, Request
from dualpace_sim.core.routing import Route
from dualpace_sim.costs.shapes import ModelShape

BS = 16


def cpu_step(batch: int, context: int, route: Route = Route.FULL_CPU) -> CpuStep:
    """A step of `batch` rows at `context` tokens each, over disjoint host blocks."""
    nb = -(-context // BS)
    return CpuStep(route, list(range(batch)), [1] * batch, [context - 1] * batch,
                   [list(range(i * nb, (i + 1) * nb)) for i in range(batch)])


def gpu_plan(tokens: TokenStore, vocab: int, chunk: int, decodes: int, context: int) -> GpuPlan:
    """A mixed GPU batch: one `chunk`-token prefill chunk and `decodes` decodes at `context`."""
    nb = -(-context // BS)
    plan = GpuPlan()
    for i in range(decodes):
        r = Request.create(i, 0.0, context - 1, 16, BS)
        r.blocks = list(range(i * nb, (i + 1) * nb))
        r.generated += 1  # a decoded token; its time is never recorded
        tokens.add(i, torch.randint(0, vocab, (context,)).tolist())
        plan.decodes.append(r)
    p = Request.create(decodes, 0.0, chunk + 1, 16, BS)
    p.blocks = list(range(decodes * nb, decodes * nb + -(-(chunk + 1) // BS)))
    tokens.add(decodes, torch.randint(0, vocab, (chunk + 1,)).tolist())
    plan.prefills.append(PrefillChunk(p, 0, chunk, False, False))
    plan.decode_context = decodes * context
    return plan


class GpuLoad:
    """A thread running one GPU round (`round_fn`) flat out, until stopped."""

    def __init__(self, round_fn, sync) -> None:
        self.round_fn, self.sync = round_fn, sync
        self.rounds = 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.round_fn()
            self.rounds += 1

    def rate(self, seconds: float) -> float:
        """Rounds per second over `seconds` of running alone (before start())."""
        self.round_fn()
        self.sync()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            self.round_fn()
            n += 1
        self.sync()
        return n / (time.perf_counter() - t0)

    def __enter__(self) -> GpuLoad:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        self.t0, self.r0 = time.perf_counter(), self.rounds
        return self

    def __exit__(self, *exc) -> None:
        self.achieved = (self.rounds - self.r0) / (time.perf_counter() - self.t0)
        self._stop.set()
        self._thread.join()


def beside_fused_assist(ex: GpuExecutor, plan: GpuPlan, engine: CpuEngineProcess,
                        step: CpuStep, sync, steps: int) -> dict[str, float]:
    """The GPU engine's served rounds alone and beside Fused-Assist steps (their assists on
    the assist stream, then on the compute stream), and those steps' rate beside each and
    beside a GPU engine that only serves their assists."""
    channel = AssistServer(engine.assist, Engines([], BS, ex.shape.vocab_size))
    served = GpuLoad(lambda: run_forward(ex, ex.stages(plan), channel, paced=True), sync)
    serving_only = GpuLoad(lambda: channel.serve(ex) or time.sleep(20e-6), lambda: None)
    own_stream = ex.assist_stream

    def fused_step():
        return engine.step(step, lambda: False).tokens

    out = {"gpu_served_rounds_per_s_alone": served.rate(3.0)}
    channel.expecting = True  # the CPU engine is in Fused-Assist steps from here on
    with serving_only:
        out["cpu_fused_steps_per_s_alone"] = steps_per_s(fused_step, steps)
    for key, stream in (("", own_stream), ("_compute_stream", None)):
        ex.assist_stream = stream
        calls, waited = channel.calls, channel.wait_s
        with served:
            out[f"cpu_fused_steps_per_s_gpu_busy{key}"] = steps_per_s(fused_step, steps)
        out[f"gpu_served_rounds_per_s_beside_fused{key}"] = served.achieved
        out[f"gpu_kept_fused{key}"] = (served.achieved
                                       / out["gpu_served_rounds_per_s_alone"])
        out[f"assist_wait_ms{key}"] = 1e3 * (channel.wait_s - waited) / max(
            channel.calls - calls, 1)
    ex.assist_stream = own_stream
    channel.expecting = False
    out["cpu_kept_fused"] = (out["cpu_fused_steps_per_s_gpu_busy"]
                             / out["cpu_fused_steps_per_s_alone"])
    return out


def steps_per_s(run_step, steps: int) -> float:
    run_step()  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run_step()
        times.append(time.perf_counter() - t0)
    return 1 / statistics.median(times)


def engine_beside(weights: ModelWeights, shape: ModelShape, batch: int, context: int,
                  cpu_cores: int | None) -> CpuEngineProcess:
    """A CPU engine process for steps of `batch` rows at `context` tokens on the last
    `cpu_cores` cores, and this process moved to the rest with as many OpenMP threads, as the
    runtime's `on_cores` does (the session-14 figures were measured with the default team, a
    thread per core of the box, on those 2 cores, where the GPU engine's assist copies ran)."""
    cores = sorted(os.sched_getaffinity(0))[-cpu_cores:] if cpu_cores else None
    engine = CpuEngineProcess(weights, shape, batch * -(-context // BS), BS, max_rows=batch,
                              cores=cores)
    own = cores_off(cores)
    if own:
        os.sched_setaffinity(0, own)
        torch.set_num_threads(len(own))
    return engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cpu-cores", type=int, default=None,
                    help="cores of the CPU engine (the last N; the rest run this process)")
    ap.add_argument("--batch", type=int, default=32, help="CPU batch")
    ap.add_argument("--context", type=int, default=1024, help="tokens per CPU/GPU row")
    ap.add_argument("--gpu-chunk", type=int, default=512, help="prefill chunk in GPU batches")
    ap.add_argument("--gpu-decodes", type=int, default=64, help="decodes in GPU batches")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--eager-chunked", action="store_true",
                    help="run the mixed rounds eagerly, without the chunked rounds' graphs")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    shape = ModelShape.from_name(args.model)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    weights = ModelWeights.random(shape, seed=0, device=dev)
    engine = engine_beside(weights, shape, args.batch, args.context, args.cpu_cores)
    cores = list(engine.cores) if engine.cores else None
    tokens = TokenStore()
    gpu_blocks = args.gpu_decodes * -(-args.context // BS) + -(-(args.gpu_chunk + 1) // BS)
    ex = GpuExecutor(Model(shape, weights), PagedKVPool(shape, gpu_blocks, BS, device=dev),
                     tokens, engine.host_pool,
                     chunked_graphs=False if args.eager_chunked else None)
    plan = gpu_plan(tokens, shape.vocab_size, args.gpu_chunk, args.gpu_decodes, args.context)
    load = GpuLoad(lambda: ex.execute(plan), sync)
    step = cpu_step(args.batch, args.context)
    out: dict[str, float | str] = {"model": args.model, "batch": args.batch,
                                   "context": args.context, "cpu_cores": str(cores)}
    try:
        def process_step():
            return engine.step(step, lambda: False).tokens

        out["gpu_rounds_per_s_alone"] = load.rate(3.0)
        out["cpu_process_steps_per_s_alone"] = steps_per_s(process_step, args.steps)
        with load:
            out["cpu_process_steps_per_s_gpu_busy"] = steps_per_s(process_step, args.steps)
        out["gpu_rounds_per_s_beside_cpu"] = load.achieved
        out["process_kept"] = (out["cpu_process_steps_per_s_gpu_busy"]
                               / out["cpu_process_steps_per_s_alone"])
        out["gpu_kept"] = out["gpu_rounds_per_s_beside_cpu"] / out["gpu_rounds_per_s_alone"]
        # Contrast: the same executor in a thread of this process.
        local = CpuExecutor(pack_model(Model(shape, weights.to("cpu"))), engine.host_pool,
                            tokens=None, cores=cores)
        result: dict[str, float] = {}

        def in_thread(key: str) -> None:
            result[key] = steps_per_s(lambda: local.run(step), args.steps)

        for key, busy in (("alone", False), ("gpu_busy", True)):
            t = threading.Thread(target=in_thread, args=(key,))
            if busy:
                with load:
                    t.start()
                    t.join()
            else:
                t.start()
                t.join()
            out[f"cpu_thread_steps_per_s_{key}"] = result[key]
        out["thread_kept"] = result["gpu_busy"] / result["alone"]
        out.update(beside_fused_assist(ex, plan, engine, cpu_step(
            args.batch, args.context, Route.FUSED_ASSIST), sync, args.steps))
    finally:
        engine.close()
    for k, v in out.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    print(f"CPU engine decode rate kept while the GPU engine is saturated: "
          f"{out['process_kept']:.1%} (target >= 90%); in a thread instead: "
          f"{out['thread_kept']:.1%}")
    print(f"GPU engine's served-round rate kept beside Fused-Assist steps: "
          f"{out['gpu_kept_fused']:.1%} with the assists on their own stream (target >= 90%), "
          f"{out['gpu_kept_fused_compute_stream']:.1%} on the compute stream; the CPU engine "
          f"kept {out['cpu_kept_fused']:.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
