"""The CPU tier at the box's limits: dense stages, CPU steps, engine independence, prefill.

Every figure is set beside a limit measured in the same run:

* limits: a streaming read of a 4 GiB buffer with the CPU engine's threads (DRAM read
  bandwidth) and a large bf16 GEMM (the AMX peak as torch's oneDNN reaches it);
* dense: the CPU executor's projections (QKV, O, gate/up, down, LM head) at 1-1,024 rows, our
  kernel (`PackedDense`, and each of its paths) beside plain `F.linear`, as time, GB/s of
  weights, TF/s and the ratios to the two limits. Weights cycle through copies spanning twice
  the last-level cache, so no stage is timed from cache;
* steps: Full-CPU and Fused-Assist decode steps through the runtime's CPU engine process,
  against the cost model (`benchmarks.cpu_step.vs_model`), rows in the order given;
* independence: `benchmarks.independence.cpu_engine`'s two ratios (each engine's pace kept
  beside the other);
* prefill: GPU prefill attention (the executor's flash varlen path, and the masked SDPA it
  replaced) against the roofline's price for the same chunk and context.

    python -m benchmarks.kernels.cpu_tier --profile calibration/h200-spr16/llama-3.1-8b.yaml \\
        --cpu-cores 14 --out benchmarks/results/kernels/h200-spr16-cpu_tier.md
    python -m benchmarks.kernels.cpu_tier --model tiny-llama --device cpu --quick \\
        --sections limits dense
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dualpace_hw.executors.packed import (
    PackedDense,
    amx_tile_peak,
    dense_isas,
    pack_weight,
    packed_linear,
)
from dualpace_hw.kernels.cpu_attention import extension_info, pin_threads
from dualpace_hw.kernels.host_read import host_read_bytes_per_s
from dualpace_sim.costs import ModelShape, load_profile

ROWS = (1, 2, 4, 8, 16, 32, 48, 63, 64, 65, 96, 128, 256, 512, 1024)
QUICK_ROWS = (1, 4, 64, 65, 256)
STEP_ROWS = (1, 2, 4, 8, 16, 32, 48, 63, 64, 65, 96, 128, 256, 512)
MIN_S = 0.15  # seconds each dense figure is timed over (at least 3 calls)
LLC_BYTES = 300 << 20  # the H200 box's last-level cache; --llc-mib for another box


def timeit(fn, min_s: float = 0.3, min_iters: int = 3) -> float:
    """Median seconds per call after one warm-up call."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def take_cores(n: int | None) -> list[int]:
    """This process on the CPU engine's cores (the first n), one OpenMP thread per core."""
    cores = sorted(os.sched_getaffinity(0))[: n or None]
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    pin_threads(cores)
    return cores


# ------------------------------------------------------------------------------ limits
def limits(quick: bool) -> dict[str, float | str]:
    """DRAM read GB/s (the runtime's streaming read, all threads, as `dualpace-hw profile`
    and `run` record it, over a larger buffer); the AMX peak as the best large bf16 GEMM
    on the box (torch's oneDNN matmul, or our kernel's fastest path, whichever is faster); and
    the tiles' own ceiling (tile multiplies alone), which no GEMM reaches."""
    read = host_read_bytes_per_s((1 << 30) if quick else (4 << 30)) / 1e9
    size = 1024 if quick else 8192
    a = torch.randn(size, 4096).to(torch.bfloat16)
    b = torch.randn(4096, size).to(torch.bfloat16)
    flops = 2 * size * size * 4096
    gemms = {"torch.matmul": flops / timeit(lambda: torch.matmul(a, b), 1.0) / 1e12}
    fast = [i for i in dense_isas() if i != "portable"]
    if fast:
        packed = pack_weight(b.t().contiguous())
        gemms[f"dense kernel ({fast[0]})"] = flops / timeit(
            lambda: packed_linear(a, packed, size, fast[0]), 1.0) / 1e12
    best = max(gemms, key=gemms.get)
    return {"read_gbs": read, "peak_tflops": gemms[best],
            "peak_gemm": f"{best}, bf16 [{size}, 4096] x [4096, {size}]",
            "gemm_tflops": gemms, "amx_tile_tflops": amx_tile_peak() / 1e12}


# ------------------------------------------------------------------------------ dense
def dense_stages(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """name -> (out_features, in_features) of one layer's projections and the LM head."""
    return {"qkv": (shape.q_dim + 2 * shape.kv_dim, shape.hidden_size),
            "o": (shape.hidden_size, shape.q_dim),
            "gate_up": (2 * shape.intermediate_size, shape.hidden_size),
            "down": (shape.hidden_size, shape.intermediate_size),
            "lm_head": (shape.vocab_size, shape.hidden_size)}


class Ring:
    """Copies of one weight spanning twice the last-level cache, called in turn."""

    def __init__(self, w: torch.Tensor, llc_bytes: int) -> None:
        n = max(1, -(-2 * llc_bytes // (w.numel() * w.element_size())))
        self.plain = [w] + [w.clone() for _ in range(n - 1)]
        self.packed = [pack_weight(x) for x in self.plain] if dense_isas() else []
        self.dense = [PackedDense(x, keep_plain=True) for x in self.plain]
        self.i = 0

    def next(self) -> int:
        self.i = (self.i + 1) % len(self.plain)
        return self.i


def dense(shape: ModelShape, rows: tuple[int, ...], lim: dict, llc_bytes: int) -> list[dict]:
    isas = [i for i in dense_isas() if i != "portable"]
    print(f"\ndense stages ({shape.name}, bf16, {torch.get_num_threads()} threads; paths "
          f"{isas or 'none: F.linear only'}); limits {lim['read_gbs']:.1f} GB/s, "
          f"{lim['peak_tflops']:.2f} TF/s", flush=True)
    print(f"{'stage':>8}{'rows':>6}{'ms':>9}{'GB/s':>8}{'TF/s':>7}{'bw':>6}{'peak':>6}"
          f"{'F.linear ms':>12}{'x':>6}  each path, ms", flush=True)
    out = []
    g = torch.Generator().manual_seed(0)
    for name, (n_out, n_in) in dense_stages(shape).items():
        w = ((torch.rand(n_out, n_in, generator=g) - 0.5) / n_in ** 0.5).to(torch.bfloat16)
        ring = Ring(w, llc_bytes)
        del w
        wbytes = n_out * n_in * 2
        for m in rows:
            x = torch.randn(m, n_in, generator=g).to(torch.bfloat16)
            t = timeit(lambda x=x, ring=ring: ring.dense[ring.next()](x), MIN_S)
            t_lin = timeit(lambda x=x, ring=ring: F.linear(x, ring.plain[ring.next()]), MIN_S)
            # each path beside the one PackedDense picks (AVX512-BF16 only where it is a
            # candidate, few rows: its 4-row micro-kernel re-reads the weight per 4 rows)
            per_isa = {i: timeit(lambda x=x, i=i, ring=ring, n=n_out: packed_linear(
                x, ring.packed[ring.next()], n, i), MIN_S)
                for i in isas if {"avx512bf16": m <= 16, "brgemm": m <= 128}.get(i, True)}
            if "amx" in isas:  # the weight prefetch's worth
                per_isa["amx, no prefetch"] = timeit(lambda x=x, ring=ring, n=n_out: packed_linear(
                    x, ring.packed[ring.next()], n, "amx", 0), MIN_S)
            r = {"stage": name, "rows": m, "out": n_out, "in": n_in, "ms": t * 1e3,
                 "gbs": wbytes / t / 1e9, "tflops": 2 * m * n_out * n_in / t / 1e12,
                 "f_linear_ms": t_lin * 1e3, "speedup_vs_f_linear": t_lin / t,
                 "isa_ms": {i: v * 1e3 for i, v in per_isa.items()},
                 "path": ring.dense[0].isa if ring.dense[0].is_packed else "F.linear"}
            r["bw_ratio"] = r["gbs"] / lim["read_gbs"]
            r["peak_ratio"] = r["tflops"] / lim["peak_tflops"]
            out.append(r)
            print(f"{name:>8}{m:>6}{r['ms']:>9.3f}{r['gbs']:>8.1f}{r['tflops']:>7.2f}"
                  f"{r['bw_ratio']:>6.2f}{r['peak_ratio']:>6.2f}{r['f_linear_ms']:>12.3f}"
                  f"{r['speedup_vs_f_linear']:>6.2f}  "
                  + "  ".join(f"{k} {v * 1e3:.3f}" for k, v in per_isa.items()), flush=True)
        del ring
    return out


# ------------------------------------------------------------------------------ the others
def run_script(script: str, args: list[str], json_path: Path, timeout_s: float) -> dict | None:
    """Another benchmark, a module, in its own process (its own cores and CUDA context); its
    JSON, or None when it failed or ran out of time (its output is printed either way)."""
    cmd = [sys.executable, "-m", script, *args, "--json", str(json_path)]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    try:
        subprocess.run(cmd, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        print(f"{script}: stopped after {timeout_s:.0f} s", flush=True)
    if json_path.exists():
        return json.loads(json_path.read_text())
    return None


ISSUED = 10  # prefill attention calls issued back to back for one synchronization


def prefill(shape: ModelShape, device: str, quick: bool, roofline: str | None) -> list[dict]:
    """The GPU executor's prefill attention (flash varlen) and the masked SDPA it replaced,
    against the roofline's price, for 512-8,192-token chunks.

    Flash is timed two ways: as the runtime issues it since session 15 (its lengths uploaded
    with the round's inputs, calls back to back with one synchronization for `ISSUED` of them:
    what a round's GPU spends when its host runs ahead), which the roofline ratio uses; and
    one call with its own synchronization and lengths upload (the host-bound latency, the
    figure before session 16)."""
    from dualpace_hw.kernels.attention import (
        flash_lengths,
        masked_prefill_attention,
        prefill_attention,
    )
    from dualpace_hw.memory.kv import PagedKVPool
    from dualpace_sim.costs import CostModel, load_spec, synthesize

    cm = CostModel(synthesize(load_spec(roofline), shape)) if roofline else None
    chunks = (512, 2048) if quick else (512, 1024, 2048, 4096, 8192)
    contexts = (2048,) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    bs = 16
    pool = PagedKVPool(shape, max(contexts) // bs, bs, device=device, n_layers=1)
    kc, vc = pool.layer(0)
    kc.normal_(), vc.normal_()
    table = torch.arange(max(contexts) // bs, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = []
    print(f"\nprefill attention ({shape.name}, {device}); roofline {roofline}", flush=True)
    print(f"{'chunk':>6}{'context':>8}{'flash ms':>10}{'1 call':>10}{'SDPA ms':>10}"
          f"{'roofline ms':>12}"
          f"{'over':>7}", flush=True)
    for chunk in chunks:
        for ctx in contexts:
            if ctx < chunk:
                continue
            q = torch.randn(chunk, shape.n_heads, shape.head_dim, dtype=torch.bfloat16,
                            device=device)

            def timed(fn, q=q, chunk=chunk, ctx=ctx):
                def call():
                    fn(q, kc, vc, table, ctx - chunk)
                    sync()
                return timeit(call, 0.2)

            cu = torch.tensor(flash_lengths(chunk, ctx), dtype=torch.int32, device=device)

            def issued(q=q, chunk=chunk, ctx=ctx, cu=cu):
                for _ in range(ISSUED):
                    prefill_attention(q, kc, vc, table, ctx - chunk, cu)
                sync()

            t = timeit(issued, 0.2) / ISSUED
            t_sync = timed(prefill_attention)
            t_old = timed(masked_prefill_attention)
            roof = cm.gpu_prefill_attn(chunk, ctx) if cm else None
            r = {"chunk": chunk, "context": ctx, "flash_ms": t * 1e3,
                 "flash_synchronous_ms": t_sync * 1e3, "sdpa_ms": t_old * 1e3,
                 "roofline_ms": roof * 1e3 if roof else None,
                 "over_roofline": t / roof if roof else None}
            out.append(r)
            print(f"{chunk:>6}{ctx:>8}{t * 1e3:>10.3f}{t_sync * 1e3:>10.3f}{t_old * 1e3:>10.3f}"
                  + (f"{roof * 1e3:>12.3f}{t / roof:>7.2f}" if roof else ""), flush=True)
    return out


# ------------------------------------------------------------------------------ report
def summary(res: dict) -> dict[str, object]:
    s: dict[str, object] = {}
    d = res.get("dense") or []
    if d:
        le64 = [r["bw_ratio"] for r in d if r["rows"] <= 64]
        ge256 = [r["peak_ratio"] for r in d if r["rows"] >= 256]
        s["dense_min_bw_ratio_le64"] = min(le64) if le64 else None
        s["dense_min_peak_ratio_ge256"] = min(ge256) if ge256 else None
        tile = res["limits"].get("amx_tile_tflops")
        if tile and ge256:
            s["dense_min_tile_ceiling_ratio_ge256"] = min(
                r["tflops"] / tile for r in d if r["rows"] >= 256)
        s["dense_min_speedup_vs_f_linear"] = min(r["speedup_vs_f_linear"] for r in d)
        s["dense_monotonic_in_rows"] = all(
            b["ms"] >= a["ms"] * 0.97 for a, b in zip(d, d[1:], strict=False)
            if a["stage"] == b["stage"])
    ind = res.get("independence") or {}
    if ind:
        s["gpu_kept_beside_cpu"] = ind.get("gpu_kept")
        s["cpu_kept_beside_gpu"] = ind.get("process_kept")
    p = [r["over_roofline"] for r in res.get("prefill") or [] if r["over_roofline"]]
    if p:
        s["prefill_attn_max_over_roofline"] = max(p)
    steps = (res.get("steps") or {}).get("rows") or []
    if steps:
        ratios = [r["step_s"] / r["model_step_s"] for r in steps]
        s["step_ratio_min"], s["step_ratio_max"] = min(ratios), max(ratios)
    return s


def to_markdown(res: dict) -> str:
    lim, s = res.get("limits", {}), res["summary"]
    lines = ["# The CPU tier at the box's limits", "", f"Made by `{res['command']}`.", "",
             f"- box: {res['box']}", f"- torch {res['torch']}, extension {res['extension']}",
             f"- limits: DRAM read {lim.get('read_gbs', 0):.1f} GB/s (streaming read, "
             f"{res['threads']} threads); AMX peak {lim.get('peak_tflops', 0):.2f} TF/s "
             f"({lim.get('peak_gemm')}; large GEMMs {lim.get('gemm_tflops')}); the tiles' own "
             f"ceiling {lim.get('amx_tile_tflops', 0):.2f} TF/s", "", "## Summary", "",
             "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |"
              for k, v in s.items()]
    if res.get("dense"):
        lines += ["", "## Dense stages", "", "Time, weight GB/s, TF/s, the ratios to the "
                  "read bandwidth and the AMX peak, and plain `F.linear` on the same weights.",
                  "", "| stage | rows | path | ms | GB/s | TF/s | bw ratio | peak ratio | "
                  "F.linear ms | speedup |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["dense"]:
            lines.append(f"| {r['stage']} | {r['rows']} | {r['path']} | {r['ms']:.3f} | "
                         f"{r['gbs']:.1f} | {r['tflops']:.2f} | {r['bw_ratio']:.2f} | "
                         f"{r['peak_ratio']:.2f} | {r['f_linear_ms']:.3f} | "
                         f"{r['speedup_vs_f_linear']:.2f} |")
    steps = res.get("steps") or {}
    if steps.get("rows"):
        lines += ["", "## CPU steps against the model", "", f"Context {steps.get('context')} "
                  f"tokens a row; rows in the order run.", "",
                  "| route | rows | step ms | model ms | ratio |", "|---|---|---|---|---|"]
        for r in steps["rows"]:
            lines.append(f"| {r['route']} | {r['batch']} | {r['step_s'] * 1e3:.1f} | "
                         f"{r['model_step_s'] * 1e3:.1f} | "
                         f"{r['step_s'] / r['model_step_s']:.2f} |")
    if res.get("independence"):
        lines += ["", "## Engine independence", "", "```",
                  json.dumps(res["independence"], indent=1), "```"]
    if res.get("prefill"):
        lines += ["", "## GPU prefill attention against the roofline", "",
                  f"Flash as the runtime issues it ({ISSUED} calls back to back, lengths "
                  "uploaded once), and one call with its own synchronization.", "",
                  "| chunk | context | flash ms | one call ms | masked SDPA ms | roofline ms | "
                  "over |", "|---|---|---|---|---|---|---|"]
        for r in res["prefill"]:
            roof = f"{r['roofline_ms']:.3f} | {r['over_roofline']:.2f}" if r["roofline_ms"] \
                else "- | -"
            lines.append(f"| {r['chunk']} | {r['context']} | {r['flash_ms']:.3f} | "
                         f"{r['flash_synchronous_ms']:.3f} | {r['sdpa_ms']:.3f} | {roof} |")
    return "\n".join(lines) + "\n"


def write(res: dict, out: Path | None) -> None:
    res["summary"] = summary(res)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
        out.write_text(to_markdown(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--profile", help="the box's measured profile (its model; the steps' model)")
    src.add_argument("--model", help="a model name, without a profile (no steps section)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cpu-cores", type=int, default=None, help="the CPU engine's cores")
    ap.add_argument("--sections", nargs="+",
                    default=["limits", "dense", "steps", "independence", "prefill"])
    ap.add_argument("--rows", type=int, nargs="+", default=None, help="dense rows")
    ap.add_argument("--step-rows", type=int, nargs="+", default=list(STEP_ROWS))
    ap.add_argument("--roofline", default="h200-spr16", help="spec the prefill is priced by")
    ap.add_argument("--llc-mib", type=int, default=LLC_BYTES >> 20)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--timeout-s", type=float, default=240, help="per sub-benchmark")
    ap.add_argument("--out", type=Path, default=None, help="markdown; the JSON goes beside it")
    args = ap.parse_args()
    shape = load_profile(args.profile).model if args.profile else ModelShape.from_name(args.model)
    res: dict = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
                 "extension": extension_info().get("name"), "model": shape.name,
                 "threads": args.cpu_cores or len(os.sched_getaffinity(0))}
    from dualpace_hw.executors.packed import cpu_features

    res["box"] = cpu_features()["model_name"]
    tmp = (args.out.parent if args.out else Path("."))
    if "independence" in args.sections:  # first: it takes the cores its own way
        cores = ["--cpu-cores", str(args.cpu_cores)] if args.cpu_cores else []
        res["independence"] = run_script(
            "benchmarks.independence.cpu_engine",
            ["--model", shape.name, "--device", args.device, *cores],
            tmp / "independence.json", args.timeout_s)
        write(res, args.out)
    if "steps" in args.sections and args.profile:
        cores = ["--cpu-cores", str(args.cpu_cores)] if args.cpu_cores else []
        res["steps"] = run_script(
            "benchmarks.cpu_step.vs_model",
            ["--profile", args.profile, "--device", args.device, *cores, "--routes",
             "Full-CPU", "Fused-Assist", "--batches", *map(str, args.step_rows),
             "--context", "1024", "--steps", "3"], tmp / "steps.json", args.timeout_s)
        write(res, args.out)
    if "prefill" in args.sections:
        res["prefill"] = prefill(shape, args.device, args.quick, args.roofline)
        write(res, args.out)
    take_cores(args.cpu_cores)
    if "limits" in args.sections or "dense" in args.sections:
        res["limits"] = limits(args.quick)
        print(f"limits: {res['limits']}", flush=True)
        write(res, args.out)
    if "dense" in args.sections:
        rows = tuple(args.rows) if args.rows else (QUICK_ROWS if args.quick else ROWS)
        res["dense"] = dense(shape, rows, res["limits"], args.llc_mib << 20)
        write(res, args.out)
    write(res, args.out)
    print("\nsummary:", json.dumps(res["summary"], indent=1))


if __name__ == "__main__":
    main()
