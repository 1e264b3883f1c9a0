"""Does the host KV pool's layout cost CPU decode attention? The profiler's pool against the
runtime's.

The profiler times CPU decode attention on a one-layer pool of its own (plain process memory),
each request's blocks contiguous (`dualpace_hw/profiler/measure.py`). The runtime's CPU engine
reads a pool of every layer in a shared memfd arena (4 KiB pages where the kernel gives shared
memory no transparent huge pages), with block ids as the allocator hands them out: scattered
once the pool has churned. In served runs on the H200 box the attention phase ran 1.2x its
table from 48 rows up (`docs/validation/README.md`, session 19). This times one step's
attention (the same block table over every layer) per layer, in one process, for:

* `profiler`: the profiler's own measurement (`decode_time` on `cpu_kv_pool`, its windows
  of twice the last-level cache in turn, its timer): the figure the profile's table holds;
* `private_contiguous`: the profiler's layout (a private pool, contiguous ids), two layers in
  turn: where two layers' KV fit the last-level cache it is read from there, which the
  profiler's windows (twice the cache) avoid, so small batches are not its figure;
* `shared_contiguous`: the runtime's arena, contiguous ids;
* `shared_scattered`: the runtime's arena, ids a random permutation of the pool;
* `shared_scattered_varlen`: the same with request lengths drawn uniformly around the mean;
* `shared_scattered_beside_dma` (CUDA only): the same while a copy loop keeps the PCIe link
  busy both ways, as swaps and Prefill-to-CPU copies do at their peak;
* `huge_scattered` / `huge_contiguous`: private memory advised for transparent huge pages,
  the size of the runtime's pool (what a huge-page host pool would give).

    python -m benchmarks.kernels.kv_layout --cpu-cores 14 --out kv_layout.json
    python -m benchmarks.kernels.kv_layout --model tiny-llama --blocks 256 --batches 2 4 \\
        --context 64 --cpu-cores 1 --out /tmp/kv_layout.json        # smoke
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from dualpace_hw import hostinfo
from dualpace_hw.kernels.cpu_attention import (
    cpu_paged_decode_attention,
    hugepage_empty,
    pin_threads,
)
from dualpace_hw.kernels.host_read import host_read_bytes_per_s
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.shm import SharedArena
from dualpace_hw.profiler.grids import Grids
from dualpace_hw.profiler.measure import cpu_kv_pool, decode_time
from dualpace_hw.profiler.timing import Protocol, Timer
from dualpace_sim.costs.shapes import ModelShape

BLOCK = 16


def block_tables(lengths: Sequence[int], ids: torch.Tensor) -> torch.Tensor:
    """Each request's blocks taken in turn from `ids` (so distinct across the batch)."""
    need = [-(-n // BLOCK) for n in lengths]
    if sum(need) > ids.numel():
        raise ValueError(f"--blocks: the batch needs {sum(need)} blocks, the pool holds "
                         f"{ids.numel()}; give more --blocks or fewer --batches/--context")
    tables = torch.zeros(len(lengths), max(need), dtype=torch.int32)
    k = 0
    for i, n in enumerate(need):
        tables[i, :n] = ids[k:k + n]
        k += n
    return tables


def per_layer_s(pool: PagedKVPool, layers: Iterable[int], lengths: Sequence[int],
                ids: torch.Tensor, shape: ModelShape, repeats: int) -> float:
    """Median time of one step's attention over `layers`, per layer."""
    return step_per_layer_s(pool, layers, block_tables(lengths, ids),
                            torch.tensor(lengths, dtype=torch.int32), repeats)


def step_per_layer_s(pool: PagedKVPool, layers: Iterable[int], tables: torch.Tensor,
                     lens: torch.Tensor, repeats: int) -> float:
    """Median time of one step's attention (these block tables and lengths) over `layers`,
    per layer, after one untimed step."""
    layers, shape = list(layers), pool.shape
    q = torch.randn(len(lens), shape.n_heads, shape.head_dim, dtype=torch.bfloat16)

    def step() -> None:
        for layer in layers:
            k, v = pool.layer(layer)
            cpu_paged_decode_attention(q, k, v, tables, lens, validate=layer == layers[0])

    step()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times) / len(layers)


def beside_dma(fn: Callable[[], float]) -> float:
    """`fn()` while a copy loop keeps the PCIe link busy in both directions."""
    host = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    stop = threading.Event()

    def copies() -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not stop.is_set():
                dev.copy_(host, non_blocking=True)
                host.copy_(dev, non_blocking=True)
                stream.synchronize()

    worker = threading.Thread(target=copies)
    worker.start()
    try:
        time.sleep(0.5)
        return fn()
    finally:
        stop.set()
        worker.join()


def profiler_s(shape: ModelShape, blocks: int, batches: Sequence[int], context: int
               ) -> dict[int, float]:
    """Per layer, as `dualpace-hw profile` times the table's points (its pool, windows and
    timer), at each batch of `context` tokens a request."""
    cache = hostinfo.last_level_cache_bytes()
    pool = cpu_kv_pool(shape, blocks, BLOCK, cache)
    pool.data.fill_(0.01)
    grids, timer = Grids.full(), Timer(torch.device("cpu"), Protocol())
    out = {b: decode_time(shape, grids, cpu_paged_decode_attention, timer, pool, "cpu", b,
                          b * context, cache) for b in batches}
    del pool
    return out


def measure(shape: ModelShape, blocks: int, batches: Sequence[int], context: int,
            repeats: int, seed: int) -> dict[str, dict[str, float]]:
    gen = torch.Generator().manual_seed(seed)
    dims = PagedKVPool.dims(shape, blocks, BLOCK)
    arena = SharedArena(SharedArena.bytes_for([(dims, torch.bfloat16)]), "kv-layout")
    storage, _ = arena.empty(dims, torch.bfloat16)
    storage.fill_(0.01)  # every page written, as served KV is before it is read
    shared = PagedKVPool(shape, blocks, BLOCK, dtype=torch.bfloat16, storage=storage)
    private = PagedKVPool(shape, blocks, BLOCK, "cpu", n_layers=2)
    private.data.fill_(0.01)
    contiguous = torch.arange(blocks, dtype=torch.int32)
    every, pair = range(shape.n_layers), [0, 1] * (shape.n_layers // 2 or 1)
    out: dict[str, dict[str, float]] = {}
    profiled = profiler_s(shape, blocks, batches, context)
    for b in batches:
        uniform = [context] * b
        varlen = torch.randint(max(1, context // 5), 2 * context - context // 5 + 1, (b,),
                               generator=gen).tolist()
        scattered = torch.randperm(blocks, generator=gen).to(torch.int32)
        row = {
            "profiler": profiled[b],
            "private_contiguous": per_layer_s(private, pair, uniform, contiguous, shape, repeats),
            "shared_contiguous": per_layer_s(shared, every, uniform, contiguous, shape, repeats),
            "shared_scattered": per_layer_s(shared, every, uniform, scattered, shape, repeats),
            "shared_scattered_varlen": per_layer_s(shared, every, varlen, scattered, shape,
                                                   repeats),
        }
        if torch.cuda.is_available():
            row["shared_scattered_beside_dma"] = beside_dma(functools.partial(
                per_layer_s, shared, every, uniform, scattered, shape, repeats))
        out[str(b)] = row
        print(b, {k: round(v * 1e3, 3) for k, v in row.items()}, flush=True)
    del shared, storage, private
    arena.close()
    huge = PagedKVPool(shape, blocks, BLOCK, dtype=torch.bfloat16,
                       storage=hugepage_empty(dims, torch.bfloat16).fill_(0.01))
    for b in batches:
        scattered = torch.randperm(blocks, generator=gen).to(torch.int32)
        out[str(b)]["huge_scattered"] = per_layer_s(huge, every, [context] * b, scattered,
                                                    shape, repeats)
        out[str(b)]["huge_contiguous"] = per_layer_s(huge, every, [context] * b, contiguous,
                                                     shape, repeats)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--blocks", type=int, default=16384, help="the pool's blocks (the runtime's "
                    "host_kv_blocks; the CPU-busy scenarios use 16,384)")
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--context", type=int, default=1100, help="mean tokens per request")
    ap.add_argument("--cpu-cores", type=int, default=os.cpu_count(), help="the first N cores")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSON")
    args = ap.parse_args(argv)
    cores = list(range(args.cpu_cores))
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    pin_threads(cores)
    shape = ModelShape.from_name(args.model)
    try:
        per_layer = measure(shape, args.blocks, args.batches, args.context, args.repeats,
                            args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    kv_per_token = shape.n_kv_heads * shape.head_dim * 2 * 2
    ratios = {b: {k: v / row["profiler"] for k, v in row.items()}
              for b, row in per_layer.items()}
    report = {"command": "python -m benchmarks.kernels.kv_layout " + " ".join(
        sys.argv[1:] if argv is None else argv),
              "model": args.model, "blocks": args.blocks, "context": args.context,
              "cpu_cores": args.cpu_cores, "host_read_bytes_per_s": host_read_bytes_per_s(),
              "per_layer_s": per_layer,
              "over_profiler": ratios,
              "kv_bytes_per_layer": {b: int(b) * args.context * kv_per_token for b in per_layer}}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    for b, row in ratios.items():
        print(f"batch {b}: over the profiler's figure, the runtime's pool "
              f"{row['shared_scattered']:.2f}x (scattered ids), "
              f"{row['shared_contiguous']:.2f}x (contiguous); huge pages "
              f"{row['huge_scattered']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
