"""What glibc's malloc costs the CPU engine's per-layer temporaries, and what keeping freed
memory (`dualpace_hw.memory.allocator.keep_freed_memory`, which the CPU executor applies)
gives back.

Times one layer's pre-attention stage as the CPU engine runs it (RMSNorm, the packed QKV
projection, RoPE on q and k; `Model.pre_attn` over `pack_model`'s projections) and RoPE alone,
for each row count, in two child processes of the same build: glibc's defaults, then freed
memory kept. Prints each figure's time and minor page faults per call in both, and the ratio it
is judged by: default / kept at 64 rows and above (1.0 means the allocator costs nothing).

    python -m benchmarks.cpu_step.temporaries --model llama-3.1-8b --threads 14
    python -m benchmarks.cpu_step.temporaries --model tiny-llama --rows 1 64 --calls 3   # smoke
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

MODES = ("glibc defaults", "freed memory kept")


def timed(fn, calls: int) -> tuple[float, float]:
    """Median seconds per call and minor page faults per call, after one warm-up call."""
    fn()
    times, faults = [], 0
    for _ in range(calls):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return statistics.median(times), faults / calls


def child(args: argparse.Namespace) -> None:
    """One mode's figures, as JSON on stdout."""
    import torch

    from dualpace_hw.executors.model import Model, ModelWeights
    from dualpace_hw.executors.packed import pack_model
    from dualpace_hw.memory.allocator import keep_freed_memory
    from dualpace_sim.costs.shapes import ModelShape

    if args.child == MODES[1]:
        keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = ModelShape.from_name(args.model)
    model = pack_model(Model(shape, ModelWeights.random(shape, 0, "cpu", n_layers=1)))
    out = {}
    for rows in args.rows:
        h = torch.randn(rows, shape.hidden_size).to(torch.bfloat16)
        pos = torch.arange(rows) + 1000
        q = torch.randn(rows, shape.n_heads, shape.head_dim).to(torch.bfloat16)
        k = torch.randn(rows, shape.n_kv_heads, shape.head_dim).to(torch.bfloat16)
        out[rows] = {
            "pre_attn": timed(lambda: model.pre_attn(0, h, pos), args.calls),  # noqa: B023
            "rope": timed(lambda: (model.rope.apply(q, pos), model.rope.apply(k, pos)),  # noqa: B023
                          args.calls),
        }
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 128, 256, 512])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--calls", type=int, default=20, help="timed calls per figure")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    figures = {}
    for mode in MODES:  # a process each: malloc's settings are the process's
        cmd = [sys.executable, __file__, "--child", mode, "--model", args.model, "--calls",
               str(args.calls), "--rows", *map(str, args.rows)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        figures[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    default, kept = (figures[m] for m in MODES)
    print(f"{args.model}, {args.threads or 'torch default'} threads; ms per call (minor faults "
          "per call)")
    print(f"{'rows':>5} {'stage':9} {'defaults':>18} {'kept':>18} {'ratio':>6}")
    ratios = []
    for rows in map(str, args.rows):
        for stage in ("pre_attn", "rope"):
            (t0, f0), (t1, f1) = default[rows][stage], kept[rows][stage]
            ratio = t0 / t1
            if int(rows) >= 64:
                ratios.append(ratio)
            print(f"{rows:>5} {stage:9} {1e3 * t0:9.3f} ({f0:6.0f}) {1e3 * t1:9.3f} ({f1:6.0f}) "
                  f"{ratio:6.2f}")
    if ratios:
        print(f"defaults / kept at >= 64 rows: median {statistics.median(ratios):.2f}, "
              f"min {min(ratios):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "threads": args.threads, "figures": figures}, f,
                      indent=2)


if __name__ == "__main__":
    main()
