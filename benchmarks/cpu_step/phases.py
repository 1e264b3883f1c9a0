"""The CPU engine's decode step phase by phase, against the profiled stages it is priced from.

Through the runtime's CPU engine process the step's CPU-local part (pre-attention and
attention, every layer) cost 1.3-1.6x the model on the H200 box, and 1.35x in serving
(benchmarks/results/cpu_step/README.md); three suspects were ruled out there. This benchmark
runs the same `CpuExecutor` step in this process, pinned to the CPU engine's cores, with each
phase of it timed: pre-attention, the KV write, attention, the Dense Assists (served in-process
by a GPU executor, no handshake) or the CPU post-attention, the post-layer, and the rest (the
step's own Python between them). Each phase is set beside what the profile charges for it, so
the phase that outruns its stage shows, and whether the excess also appears outside the CPU
engine's process. The host KV pool is held as the runtime holds it, in a shared memfd arena
(pinned under CUDA), or with `--pool private` as the profiler holds its own (plain process
memory, which transparent huge pages may back where a shared mapping gets 4 KB pages): running
both tells whether the pool's pages are part of the excess.

    python -m benchmarks.cpu_step.phases --profile calibration/h200-spr16/llama-3.1-8b.yaml \\
        --cpu-cores 14
    python -m benchmarks.cpu_step.phases --roofline rtx4090-xeon4510-12c --model tiny-llama \\
        --device cpu --batches 1 2 --context 32 --steps 2        # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from benchmarks.profile_args import add_cpu_step_arguments, add_profile_arguments, profile_from
from dualpace_hw.executors import cpu_executor
from dualpace_hw.executors.cpu_executor import CpuExecutor, CpuStep
from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.executors.packed import pack_model
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.shm import SharedArena
from dualpace_hw.memory.tokens import TokenStore
from dualpace_sim.core.routing import Route
from dualpace_sim.costs import CostModel, ModelShape

PHASES = ("pre_attn", "kv_write", "attention", "assists", "post_attn", "post_layer")


class Clock:
    """Seconds per phase, summed over one step; the wrapped calls are synchronous."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)

    def wrap(self, phase: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[phase] += time.perf_counter() - start
        return timed


def instrument_stages(model: Model, clock: Clock) -> None:
    """Time the model's stages and the attention kernel (the module-level name the executor
    calls): once per process, whatever pools the executors over this model hold."""
    model.pre_attn = clock.wrap("pre_attn", model.pre_attn)
    model.post_attn = clock.wrap("post_attn", model.post_attn)
    model.post_layer = clock.wrap("post_layer", model.post_layer)
    cpu_executor.cpu_paged_decode_attention = clock.wrap(
        "attention", cpu_executor.cpu_paged_decode_attention)


def instrument_executor(ex: CpuExecutor, clock: Clock) -> None:
    """Time one executor's KV writes and its assists."""
    ex.pool.write = clock.wrap("kv_write", ex.pool.write)
    if ex.assist is not None:
        for name in ("assist_post_attn", "assist_fused_final", "assist_post_layer"):
            setattr(ex.assist, name, clock.wrap("assists", getattr(ex.assist, name)))


def host_kv_pool(shape: ModelShape, blocks: int, block_size: int, kind: str, device: str
                 ) -> PagedKVPool:
    """The host KV pool: in a shared memfd arena, pinned under CUDA, as `CpuEngineProcess`
    allocates it ("shared"; "shared-huge" asks for transparent huge pages), or in plain process
    memory ("private")."""
    if kind == "private":
        pool = PagedKVPool(shape, blocks, block_size, "cpu")
        if device.startswith("cuda"):  # page-locked in place for the migrator's async copies
            data = pool.data
            err = torch.cuda.cudart().cudaHostRegister(data.data_ptr(),
                                                       data.numel() * data.element_size(), 0)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister of the private pool failed: error {err}")
        return pool
    dims = PagedKVPool.dims(shape, blocks, block_size)
    arena = SharedArena(SharedArena.bytes_for([(dims, torch.bfloat16)]), "dualpace-phases",
                        huge_pages=kind == "shared-huge")
    storage, _ = arena.empty(dims, torch.bfloat16)
    if device.startswith("cuda"):
        arena.pin()
    return PagedKVPool(shape, blocks, block_size, dtype=torch.bfloat16, storage=storage)


def huge_pages() -> str:
    """This box's transparent-huge-page settings (anonymous memory; shared memory)."""
    base = "/sys/kernel/mm/transparent_hugepage/"
    try:
        return "; ".join(open(base + f).read().strip() for f in ("enabled", "shmem_enabled"))
    except OSError:
        return "unknown"


def huge_pages_in_use() -> str:
    """How much anonymous and shared memory huge pages back now (/proc/meminfo)."""
    try:
        with open("/proc/meminfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return "unknown"
    return "; ".join(ln.split(":")[0] + " " + ln.split(":")[1].strip() for ln in lines
                     if ln.startswith(("AnonHugePages", "ShmemHugePages", "ShmemPmdMapped")))


def model_phases(cm: CostModel, route: Route, b: int, context: int) -> dict[str, float]:
    """What the simulator charges for each phase of one step (seconds)."""
    n, total = cm.n_layers, b * context
    attention = cm.cpu_decode_attn(b, total)
    phases = {"pre_attn": n * (cm.cpu_layer_local(b, total) - attention),
              "attention": n * attention, "kv_write": 0.0, "assists": 0.0,
              "post_attn": 0.0, "post_layer": 0.0}
    if route == Route.FULL_CPU:
        phases["post_attn"] = n * cm.cpu_post_attn(b)
        phases["post_layer"] = cm.cpu_post_layer(b)
    else:  # Fused-Assist: every post-attention stage and the post-layer on the GPU
        a_w, a_r = cm.cpu_assist_write(b), cm.cpu_assist_read(b)
        phases["assists"] = ((n - 1) * (a_w + cm.assist_q("p") + cm.assist_gpu("p", b) + a_r)
                             + a_w + cm.assist_q("lA") + cm.assist_gpu("lA", b))
    phases["step"] = (sum(phases.values()) + cm.cpu_pre_layer(b)
                      + cm.cpu_iteration_overhead)
    return phases


def measure(ex: CpuExecutor, clock: Clock, step: CpuStep, steps: int) -> dict[str, float]:
    """Per phase, the median over `steps` steps (after one warm-up) of its seconds in a step."""
    ex.run(step)
    runs = []
    for _ in range(steps):
        clock.spent.clear()
        start = time.perf_counter()
        ex.run(step)
        runs.append({"step": time.perf_counter() - start, **clock.spent})
    out = {p: statistics.median(r.get(p, 0.0) for r in runs) for p in ("step", *PHASES)}
    out["rest"] = statistics.median(r["step"] - sum(r.get(p, 0.0) for p in PHASES)
                                    for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_profile_arguments(ap)
    add_cpu_step_arguments(ap)
    ap.add_argument("--routes", nargs="+", default=[Route.FUSED_ASSIST.value, Route.FULL_CPU.value],
                    choices=[Route.FUSED_ASSIST.value, Route.FULL_CPU.value])
    ap.add_argument("--pool", nargs="+", choices=["shared", "shared-huge", "private"],
                    default=["shared"],
                    help="the host KV pool in a shared arena as the runtime has it (default), "
                         "the same asking for huge pages (madvise), or in plain process memory "
                         "as the profiler has it; several are timed in turn in one process")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    profile = profile_from(ap, args)
    cm, shape, bs = CostModel(profile), profile.model, profile.block_size
    cores = sorted(os.sched_getaffinity(0))[:args.cpu_cores] if args.cpu_cores else None
    nb = -(-args.context // bs)
    top = max(args.batches)
    t0 = time.perf_counter()
    gpu_weights = ModelWeights.random(shape, seed=0, device=args.device)  # CPU draws: minutes
    gpu_model = Model(shape, gpu_weights)
    cpu_model = pack_model(Model(shape, gpu_weights.map(lambda t: t.cpu())))
    print(f"set up in {time.perf_counter() - t0:.1f} s (weights, packed CPU weights)")
    clock, rows = Clock(), []
    instrument_stages(cpu_model, clock)
    print(f"transparent huge pages: {huge_pages()}")
    print(f"{'pool':<12}{'route':<13}{'b':>4}  phase ms: measured (model)")
    for pool in args.pool:  # one process, one set of weights: only the pool differs
        host_pool = host_kv_pool(shape, top * nb, bs, pool, args.device)
        gpu = GpuExecutor(gpu_model, PagedKVPool(shape, 1, bs, device=args.device),
                          TokenStore(), host_pool)
        ex = CpuExecutor(cpu_model, host_pool, tokens=None, assist=gpu, cores=cores)
        instrument_executor(ex, clock)
        for route in map(Route, args.routes):
            for b in args.batches:
                step = CpuStep(route, list(range(b)), [1] * b, [args.context - 1] * b,
                               [list(range(i * nb, (i + 1) * nb)) for i in range(b)])
                real = measure(ex, clock, step, args.steps)
                model = model_phases(cm, route, b, args.context)
                rows.append({"pool": pool, "route": route.value, "batch": b,
                             "context": args.context, "measured_s": real, "model_s": model})
                cells = [f"{p} {real[p] * 1e3:.2f} ({model[p] * 1e3:.2f})"
                         for p in ("step", *PHASES) if real[p] or model[p]]
                print(f"{pool:<12}{route.value:<13}{b:>4}  " + ", ".join(cells)
                      + f", rest {real['rest'] * 1e3:.2f}", flush=True)
                if args.json:  # as it goes: a run cut short keeps its rows
                    with open(args.json, "w") as f:
                        json.dump({"profile": args.profile or f"roofline {args.roofline}",
                                   "model": shape.name, "cpu_cores": str(cores),
                                   "huge_pages": huge_pages(), "huge_pages_in_use":
                                   huge_pages_in_use(), "rows": rows}, f, indent=2)
        print(f"{pool}: huge pages in use: {huge_pages_in_use()}", flush=True)
        del ex, gpu, host_pool


if __name__ == "__main__":
    main()
