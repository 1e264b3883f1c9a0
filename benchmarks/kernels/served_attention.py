"""Is the profile's CPU decode-attention table what a served step's attention costs?

In the CPU-busy runs on the H200 box the CPU engine's attention phase ran 0.67-0.89x the
profile's table (`docs/validation/README.md`, session 23), while the run's own speed check, the
profiler's measurement at the table's grid points in the same lease, found 0.92-0.96x. So the
table is off for the steps a run serves, not only for the lease. This benchmark replays a real
run's journal through the shared core to get back each CPU step's batch (every row's KV length
and host block ids, as the runtime read them), takes a sample of those steps, and times, per
layer, for each:

* `recorded`: the run's own attention phase (`cpu-steps-dualpace.csv.gz`) over the layers;
* `table`: the profile's table read log-log, as the cost model read it before session 24;
* `table_linear_context`: the same table as the cost model reads it now, linearly in the
  context (attention streams the KV it reads, so it is affine in the context; log-log
  interpolation between grid points 16x apart overstates it);
* `profiler`: the profiler's own measurement at the step's (rows, total context): equal
  lengths, contiguous blocks, its one-layer pool and windows, its timer;
* `served`: the step's very lengths and block ids in a pool of the runtime's layout and size
  (every layer, a shared memfd arena), each layer read in turn as a step reads them;

each of the last two with the OpenMP threads floating over the engine's cores (as
`dualpace-hw profile` and the run's speed check time them) and then pinned one per core (as the
runtime's CPU engine runs: `pin_threads`). It ends with the table's own grid points in the
serving range, floating and pinned, beside their tabled values.

    python -m benchmarks.kernels.served_attention \\
        --scenario scenarios/h200/cpu-busy/llama-3.1-8b-sustained-r3.yaml \\
        --real docs/validation/cpu-busy/session23/sustained-r3/real \\
        --costs calibration/h200-spr16/llama-3.1-8b.yaml --cpu-cores 14 --out served.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.kernels.kv_layout import step_per_layer_s
from dualpace_hw import hostinfo
from dualpace_hw.kernels.cpu_attention import cpu_paged_decode_attention, pin_threads
from dualpace_hw.kernels.host_read import host_read_bytes_per_s
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.shm import SharedArena
from dualpace_hw.profiler.grids import Grids
from dualpace_hw.profiler.measure import cpu_kv_pool, decode_time
from dualpace_hw.profiler.timing import Protocol, Timer
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.costs.cpu_step_records import CPU_STEPS_FILE, read_cpu_steps
from dualpace_sim.costs.model import CostModel, Interp2D
from dualpace_sim.costs.profile import Profile, load_profile
from dualpace_sim.costs.record_csv import record_file
from dualpace_sim.validation.analysis.rounds import ServedCpuBatch, served_cpu_batches

BINS = ((1, 15), (16, 47), (48, 95), (96, 159), (160, 1 << 30))
GRID_ROWS, GRID_TOTALS = (16, 64, 256), (16384, 262144)


def sample(steps: Sequence[tuple[ServedCpuBatch, float]], n: int
           ) -> list[tuple[ServedCpuBatch, float]]:
    """About n steps spread evenly over the run, as many from each batch-size bin as it
    holds up to n / len(BINS)."""
    out = []
    for lo, hi in BINS:
        group = [s for s in steps if lo <= len(s[0].lengths) <= hi]
        take = min(len(group), max(1, n // len(BINS)))
        out += [group[round(i * (len(group) - 1) / max(1, take - 1))] for i in range(take)]
    return out


def served_s(pool: PagedKVPool, batch: ServedCpuBatch, repeats: int) -> float:
    """Per layer: the step's rows over their own blocks, every layer in turn."""
    bs = pool.block_size
    need = [(n - 1) // bs + 1 for n in batch.lengths]
    tables = torch.zeros(len(need), max(need), dtype=torch.int32)
    for i, (k, ids) in enumerate(zip(need, batch.blocks, strict=True)):
        tables[i, :k] = torch.tensor(ids[:k], dtype=torch.int32)
    return step_per_layer_s(pool, range(pool.n_layers), tables,
                            torch.tensor(batch.lengths, dtype=torch.int32), repeats)


def measure(profile: Profile, chosen: list[tuple[ServedCpuBatch, float]], host_blocks: int,
            cores: list[int], repeats: int) -> tuple[list[dict], list[dict]]:
    shape, bs = profile.model, profile.block_size
    cost = CostModel(profile)
    loglog = Interp2D("cpu.decode_attn", profile.cpu.decode_attn)
    cache = hostinfo.last_level_cache_bytes()
    grids, timer = Grids.full(), Timer(torch.device("cpu"), Protocol())
    def window(rows: int, total: int) -> int:  # the blocks decode_time's plan takes
        return rows * -(-min(max(1, total // rows), grids.max_request_context) // bs)

    largest = max([window(len(b.lengths), b.context) for b, _ in chosen]
                  + [window(r, t) for r in GRID_ROWS for t in GRID_TOTALS])
    windows = cpu_kv_pool(shape, largest, bs, cache)
    windows.data.fill_(0.01)
    dims = PagedKVPool.dims(shape, host_blocks, bs)
    arena = SharedArena(SharedArena.bytes_for([(dims, torch.bfloat16)]), "served-attention")
    storage, _ = arena.empty(dims, torch.bfloat16)
    storage.fill_(0.01)  # every page written, as served KV is before it is read
    pool = PagedKVPool(shape, host_blocks, bs, dtype=torch.bfloat16, storage=storage)
    rows = [{"rows": len(b.lengths), "context": b.context, "route": b.route.value,
             "recorded": recorded / shape.n_layers,
             "table": loglog(len(b.lengths), b.context),
             "table_linear_context": cost.cpu_decode_attn(len(b.lengths), b.context)}
            for b, recorded in chosen]
    grid = [{"rows": r, "context": t, "tabled": profile.cpu.decode_attn.z[
        profile.cpu.decode_attn.x.index(r)][profile.cpu.decode_attn.y.index(t)]}
        for r in GRID_ROWS for t in GRID_TOTALS
        if r in profile.cpu.decode_attn.x and t in profile.cpu.decode_attn.y]
    for mode in ("floating", "pinned"):
        if mode == "pinned":
            pin_threads(cores)
        for row, (b, _) in zip(rows, chosen, strict=True):
            row[f"profiler_{mode}"] = decode_time(shape, grids, cpu_paged_decode_attention,
                                                  timer, windows, "cpu", len(b.lengths),
                                                  b.context, cache)
            row[f"served_{mode}"] = served_s(pool, b, repeats)
            print({k: (round(v * 1e3, 3) if isinstance(v, float) else v)
                   for k, v in row.items()}, flush=True)
        for g in grid:
            g[mode] = decode_time(shape, grids, cpu_paged_decode_attention, timer, windows,
                                  "cpu", g["rows"], g["context"], cache)
    del pool, storage
    arena.close()
    return rows, grid


def summary(rows: list[dict], grid: list[dict]) -> list[str]:
    cols = ["recorded", "table_linear_context", "profiler_floating", "profiler_pinned",
            "served_floating", "served_pinned"]
    lines = ["per layer, over the table (median of the steps in each bin):",
             f"{'rows':<10}{'n':>4}" + "".join(f"{c:>22}" for c in cols)]
    for lo, hi in BINS:
        group = [r for r in rows if lo <= r["rows"] <= hi]
        if group:
            size = f"{lo}-{hi}" if hi < 1 << 30 else f">= {lo}"
            lines.append(f"{size:<10}{len(group):>4}" + "".join(
                f"{statistics.median(r[c] / r['table'] for r in group):>22.2f}" for c in cols))
    lines.append("grid points, measured over tabled: " + ", ".join(
        f"({g['rows']}, {g['context']}) floating {g['floating'] / g['tabled']:.2f} pinned "
        f"{g['pinned'] / g['tabled']:.2f}" for g in grid))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--real", required=True, help="the real run directory (DualPace's journal "
                    "and cpu-steps record)")
    ap.add_argument("--costs", help="the profile whose table is judged (default: the run's)")
    ap.add_argument("--steps", type=int, default=30, help="served steps to time")
    ap.add_argument("--cpu-cores", type=int, default=os.cpu_count(), help="the first N cores, "
                    "as the runtime's CPU engine takes them")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True, help="JSON")
    args = ap.parse_args(argv)
    real = Path(args.real)
    recorded = record_file(real, CPU_STEPS_FILE, "dualpace")
    if not recorded.is_file():
        print(f"error: {recorded}: no CPU-step record (runs since session 16 write it)",
              file=sys.stderr)
        return 2
    profile = load_profile(args.costs or real / "profile.yaml")
    loaded = load_scenario(args.scenario)
    steps = list(zip(served_cpu_batches(args.scenario, args.real),
                     (r.attention_s for r in read_cpu_steps(recorded)), strict=True))
    cores = list(range(args.cpu_cores))
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    rows, grid = measure(profile, sample(steps, args.steps), loaded.config.host_kv_blocks,
                         cores, args.repeats)
    lines = summary(rows, grid)
    print("\n".join(lines))
    report = {"command": "python -m benchmarks.kernels.served_attention " + " ".join(
        sys.argv[1:] if argv is None else argv), "cpu_cores": args.cpu_cores,
        "host_read_bytes_per_s": host_read_bytes_per_s(),
        "steps": rows, "grid": grid, "summary": lines}
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
