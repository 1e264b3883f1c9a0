"""CPU kernel benchmarks: paged decode attention vs host read bandwidth, Llama-3.1-8B shapes
(one layer's KV: 8 KV heads x 128, 32 query heads). The dense stages are measured by
benchmarks/kernels/cpu_tier.py.

    python -m benchmarks.kernels.cpu_attention [--quick] \\
        [--out benchmarks/results/kernels/BOX-cpu_kernels.md]

Every figure is set next to the limit measured in the same run: attention bytes of KV read per
second vs a streaming read of a large buffer with all threads (target >= 75%).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dualpace_hw.executors.packed import cpu_clock_ghz, cpu_features
from dualpace_hw.kernels.attention import paged_decode_attention
from dualpace_hw.kernels.cpu_attention import (
    cpu_paged_decode_attention,
    extension_info,
    hugepage_empty,
    stream_read,
    torch_paged_decode_attention,
)

GiB = 1 << 30
KV_HEADS, HEAD_DIM, N_HEADS, BLOCK = 8, 128, 32, 16
ATTN_BATCHES = (16, 64, 128, 256)
ATTN_CONTEXTS = (1024, 2048, 4096)


def _timeit(fn: Callable[[], object], min_s: float = 0.25, min_iters: int = 3,
            warmup: int = 2, max_iters: int = 200) -> float:
    """Mean seconds per call over at least min_iters calls and min_s seconds."""
    for _ in range(warmup):
        fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if (n >= min_iters and dt >= min_s) or n >= max_iters:
            return dt / n


def _sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
    except Exception:
        return ""


def box_description() -> dict[str, object]:
    lscpu = _sh(["lscpu"])

    def field(name: str) -> str | None:
        m = re.search(rf"^{re.escape(name)}:\s*(.+)$", lscpu, re.M)
        return m.group(1).strip() if m else None

    feats = cpu_features()
    thp = None
    with contextlib.suppress(OSError):
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    mem = None
    with contextlib.suppress(OSError):
        mem = Path("/proc/meminfo").read_text().splitlines()[0]
    clock, clock_src = cpu_clock_ghz()
    return {
        "cpu_model": field("Model name") or feats["model_name"],
        "cpu_family_model_stepping": f"{field('CPU family')}/{field('Model')}/{field('Stepping')}",
        "sockets": field("Socket(s)"),
        "cores_per_socket": field("Core(s) per socket"),
        "threads_per_core": field("Thread(s) per core"),
        "logical_cpus": feats["logical_cpus"],
        "affinity_cpus": feats["affinity_cpus"],
        "numa_nodes": field("NUMA node(s)"),
        "l3": field("L3 cache"),
        "amx_bf16": feats["amx_bf16"], "amx_tile": feats["amx_tile"],
        "amx_usable": feats["amx_usable"], "avx512_bf16": feats["avx512_bf16"],
        "avx512f": feats["avx512f"],
        "torch": torch.__version__, "torch_cpu_capability": feats["torch_cpu_capability"],
        "onednn_bf16": feats["mkldnn_bf16"], "torch_threads": torch.get_num_threads(),
        "clock_ghz": clock, "clock_source": clock_src,
        "transparent_hugepages": thp, "memory": mem, "python": platform.python_version(),
        "kernel": platform.release(),
    }


# ------------------------------------------------------------------ host read bandwidth
def host_read_bandwidth(nbytes: int = 4 * GiB) -> dict[str, float]:
    """GB/s of a streaming read with all threads: the extension's 512-bit loads and torch's sum
    over a bf16 tensor, each on plain and on huge-page memory; `best` is the ceiling used."""
    res: dict[str, float] = {}
    for kind in ("plain", "hugepage"):
        n = nbytes // 2
        buf = torch.ones(n, dtype=torch.bfloat16) if kind == "plain" else \
            hugepage_empty((n,), torch.bfloat16).fill_(1.0)
        res[f"stream_{kind}"] = nbytes / _timeit(lambda b=buf: stream_read(b), 0.5) / 1e9
        res[f"torch_sum_{kind}"] = nbytes / _timeit(lambda b=buf: b.sum(), 0.5) / 1e9
        del buf
    res["best"] = max(res.values())
    return res


# ------------------------------------------------------------------ paged attention
class _Pool:
    """One layer's K and V pages for the largest case, scattered tables for any (B, ctx)."""

    def __init__(self, tokens: int, hugepages: bool, seed: int = 0) -> None:
        self.n_blocks = tokens // BLOCK
        self.hugepages = hugepages
        shape = (self.n_blocks, KV_HEADS, BLOCK, HEAD_DIM)
        alloc = (lambda: hugepage_empty(shape)) if hugepages else \
            (lambda: torch.empty(shape, dtype=torch.bfloat16))
        self.k, self.v = alloc(), alloc()
        g = torch.Generator().manual_seed(seed)
        chunk = torch.randn(1 << 24, generator=g).to(torch.bfloat16)  # 32 MiB of values
        for t in (self.k, self.v):
            flat = t.view(-1)
            for i in range(0, flat.numel(), chunk.numel()):
                part = flat[i:i + chunk.numel()]
                part.copy_(chunk[:part.numel()])
        self.perm = torch.randperm(self.n_blocks, generator=g).to(torch.int32)

    def case(self, batch: int, ctx: int, seed: int = 1):
        per = ctx // BLOCK
        tables = self.perm[: batch * per].view(batch, per).contiguous()
        lens = torch.full((batch,), ctx, dtype=torch.int32)
        q = torch.randn(batch, N_HEADS, HEAD_DIM,
                        generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        return q, tables, lens


def attention_section(read_bw: float, quick: bool) -> dict[str, object]:
    """Knobs tuned at one large point first (the best setting is then used for the table, as
    an offline profile would set it), then every (batch, context), thread scaling, and 4 KiB vs
    huge pages."""
    batches = (16, 64) if quick else ATTN_BATCHES
    contexts = (1024, 2048) if quick else ATTN_CONTEXTS
    bytes_per_token = KV_HEADS * HEAD_DIM * 2 * 2  # K and V, bf16
    pool = _Pool(max(batches) * max(contexts), hugepages=True)
    threads = torch.get_num_threads()
    print(f"\nCPU paged decode attention, bf16, {N_HEADS} q heads / {KV_HEADS} kv heads x "
          f"{HEAD_DIM}, block {BLOCK}, scattered blocks, huge-page pool, {threads} threads; "
          f"host read bandwidth {read_bw:.1f} GB/s")

    # 1. Knobs at one point bigger than the caches.
    kb, kctx = (64, 1024) if quick else (256, 2048)
    q, tables, lens = pool.case(kb, kctx)
    args = (q, pool.k, pool.v, tables, lens)
    kv_bytes = kb * kctx * bytes_per_token
    grid = [{"heads_per_unit": hpu, "prefetch_blocks": pf, "prefetch_mode": mode,
             "pv_bf16": False} for hpu in (1, 0) for pf in (1, 2) for mode in (0, 1, 2, 3)]
    grid += [{"heads_per_unit": 1, "prefetch_blocks": 0, "prefetch_mode": 0, "pv_bf16": False},
             {"heads_per_unit": 1, "prefetch_blocks": 1, "prefetch_mode": 0, "pv_bf16": True}]
    knobs = []
    for k in grid:
        t = _timeit(lambda a=args, k=k: cpu_paged_decode_attention(*a, **k), 0.2)
        knobs.append({**k, "memory": "hugepage", "gbs": kv_bytes / t / 1e9})
    best = max(knobs, key=lambda r: r["gbs"])
    setting = {k: best[k] for k in ("heads_per_unit", "prefetch_blocks", "prefetch_mode",
                                    "pv_bf16")}
    print(f"knobs at batch {kb}, context {kctx} ({kv_bytes >> 20} MiB):")
    for r in knobs:
        print(f"  heads/unit {r['heads_per_unit']} prefetch {r['prefetch_blocks']} mode "
              f"{r['prefetch_mode']} pv_bf16 {r['pv_bf16']!s:>5}: {r['gbs']:.1f} GB/s "
              f"({100 * r['gbs'] / read_bw:.0f}%)")
    print(f"best: {setting}")

    # 2. Every (batch, context) with the best setting; the PyTorch paths once each.
    rows = []
    print(f"{'batch':>5} {'ctx':>5} {'KV MB':>7} {'ext ms':>8} {'GB/s':>7} {'% bw':>6} "
          f"{'torch ms':>9} {'ref ms':>9} {'ext/ref':>8}")
    for b in batches:
        for ctx in contexts:
            q, tables, lens = pool.case(b, ctx)
            kv = b * ctx * bytes_per_token
            args = (q, pool.k, pool.v, tables, lens)
            t_ext = _timeit(lambda a=args: cpu_paged_decode_attention(*a, **setting), 0.3)
            t_torch = _timeit(lambda a=args: torch_paged_decode_attention(*a), 0.0,
                              min_iters=1, warmup=0)
            t_ref = _timeit(lambda a=args: paged_decode_attention(*a), 0.0, min_iters=1,
                            warmup=0)
            gbs = kv / t_ext / 1e9
            row = {"batch": b, "context": ctx, "kv_bytes": kv, "ext_ms": t_ext * 1e3,
                   "ext_gbs": gbs, "pct_read_bw": 100 * gbs / read_bw,
                   "torch_batched_ms": t_torch * 1e3, "reference_ms": t_ref * 1e3,
                   "speedup_vs_reference": t_ref / t_ext}
            rows.append(row)
            print(f"{b:>5} {ctx:>5} {kv / 1e6:>7.0f} {t_ext * 1e3:>8.2f} {gbs:>7.1f} "
                  f"{row['pct_read_bw']:>5.0f}% {t_torch * 1e3:>9.1f} {t_ref * 1e3:>9.1f} "
                  f"{t_ref / t_ext:>7.0f}x")

    # 3. Thread scaling at the knob point: attention vs a streaming read of as many bytes.
    q, tables, lens = pool.case(kb, kctx)
    args = (q, pool.k, pool.v, tables, lens)
    buf = hugepage_empty((kv_bytes // 2,), torch.bfloat16).fill_(1.0)
    scaling = []
    try:
        for th in sorted({1, 2, 4, 8, threads}):
            if th > threads:
                continue
            torch.set_num_threads(th)
            t_a = _timeit(lambda a=args: cpu_paged_decode_attention(*a, **setting), 0.2)
            t_r = _timeit(lambda b=buf: stream_read(b), 0.2)
            scaling.append({"threads": th, "attention_gbs": kv_bytes / t_a / 1e9,
                            "read_gbs": kv_bytes / t_r / 1e9})
    finally:
        torch.set_num_threads(threads)
    del buf
    print(f"thread scaling at batch {kb}, context {kctx}:")
    for r in scaling:
        print(f"  {r['threads']:>3} threads: attention {r['attention_gbs']:.1f} GB/s, "
              f"read {r['read_gbs']:.1f} GB/s ({100 * r['attention_gbs'] / r['read_gbs']:.0f}%)")

    # 4. The same point on a pool in 4 KiB pages (what torch.zeros gives without THP).
    del pool, args, q
    plain = _Pool(kb * kctx, hugepages=False)
    q, tables, lens = plain.case(kb, kctx)
    t = _timeit(lambda: cpu_paged_decode_attention(q, plain.k, plain.v, tables, lens,
                                                   **setting), 0.2)
    knobs.append({**setting, "memory": "4KiB pages", "gbs": kv_bytes / t / 1e9})
    print(f"4 KiB pages, best setting: {kv_bytes / t / 1e9:.1f} GB/s "
          f"({100 * kv_bytes / t / 1e9 / read_bw:.0f}%)")
    return {"rows": rows, "knobs": knobs, "setting": setting, "scaling": scaling,
            "knob_point": [kb, kctx]}


def attention_profile() -> list[dict[str, object]]:
    """Per-core compute of the kernel with the pages in cache (one thread, 4 requests x 256
    tokens = 4 MiB of KV): ns per (token, kv head), whole and with parts skipped."""
    pool = _Pool(4 * 256, hugepages=False)
    q, tables, lens = pool.case(4, 256)
    args = (q, pool.k, pool.v, tables, lens)
    units = 4 * 256 * KV_HEADS
    before = torch.get_num_threads()
    out = []
    try:
        torch.set_num_threads(1)
        for pv in (False, True):
            for skip, what in ((0, "all"), (1, "no q.k"), (2, "no P.V"), (3, "softmax only"),
                               (4, "loop only")):
                t = _timeit(lambda a=args, pv=pv, sk=skip: cpu_paged_decode_attention(
                    *a, pv_bf16=pv, _profile_skip=sk), 0.1)
                out.append({"pv_bf16": pv, "part": what, "ns_per_token_head": t / units * 1e9})
    finally:
        torch.set_num_threads(before)
    print("\nattention compute, 1 thread, KV in cache (ns per token per kv head; "
          "512 B of KV each):")
    for r in out:
        print(f"  pv_bf16 {r['pv_bf16']!s:>5} {r['part']:>13}: {r['ns_per_token_head']:.1f}")
    return out


# ------------------------------------------------------------------ summary and entry points
def _summary(res: dict) -> dict[str, object]:
    s: dict[str, object] = {}
    rows = res.get("attention", {}).get("rows", [])
    if rows:
        pct = [r["pct_read_bw"] for r in rows]
        s["attention_pct_read_bw_min"] = min(pct)
        s["attention_pct_read_bw_max"] = max(pct)
        s["attention_target_75pct_met"] = min(pct) >= 75
    return s


def cpu_section(out: dict, quick: bool = False) -> None:
    """Run the CPU benchmarks, print tables, and fill `out` with the numbers."""
    t0 = time.perf_counter()
    out["box"] = box_description()
    out["extension"] = extension_info()
    print("CPU box:", json.dumps(out["box"], default=str))
    print("extension:", {k: v for k, v in out["extension"].items() if k != "error"},
          out["extension"].get("error") or "")
    bw = host_read_bandwidth(1 * GiB if quick else 4 * GiB)
    out["host_read_bw_gbs"] = bw
    print("host read bandwidth (GB/s): " + ", ".join(f"{k} {v:.1f}" for k, v in bw.items()))
    out["attention"] = attention_section(bw["best"], quick)
    out["attention"]["profile"] = attention_profile()
    out["summary"] = _summary(out)
    out["seconds"] = time.perf_counter() - t0
    print("\nsummary:", json.dumps(out["summary"]))


def to_markdown(res: dict) -> str:
    box = res["box"]
    lines = ["# CPU kernels: paged decode attention", "",
             "Made by `python -m benchmarks.kernels.cpu_attention`.", "",
             "## Box", ""]
    lines += [f"- {k}: {v}" for k, v in box.items()]
    ext = res["extension"]
    lines += [f"- attention extension: ok={ext.get('ok')} isa={ext.get('isa')} "
              f"build+load {ext.get('load_s') or 0:.1f} s"]
    bw = res["host_read_bw_gbs"]
    lines += ["", "## Host read bandwidth (the attention ceiling)", "",
              ", ".join(f"{k} {v:.1f} GB/s" for k, v in bw.items()), "",
              "## Paged decode attention (Llama-3.1-8B layer: 32 q / 8 kv heads x 128, bf16)", "",
              "| batch | context | KV MB | ext ms | GB/s | % read bw | batched torch ms "
              "| reference ms | ext vs reference |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res["attention"]["rows"]:
        lines.append(f"| {r['batch']} | {r['context']} | {r['kv_bytes'] / 1e6:.0f} | "
                     f"{r['ext_ms']:.2f} | {r['ext_gbs']:.1f} | {r['pct_read_bw']:.0f}% | "
                     f"{r['torch_batched_ms']:.1f} | {r['reference_ms']:.1f} | "
                     f"{r['speedup_vs_reference']:.0f}x |")
    att = res["attention"]
    kb, kctx = att["knob_point"]
    lines += ["", f"Setting used for the table: {att['setting']} (the best of the knobs below).",
              "", f"Knobs at batch {kb}, context {kctx}:", "",
              "| memory | kv heads per unit (0 = all) | prefetch pages | prefetch mode "
              "| bf16 P.V | GB/s | % read bw |", "|---|---|---|---|---|---|---|"]
    for s in att["knobs"]:
        lines.append(f"| {s['memory']} | {s['heads_per_unit']} | {s['prefetch_blocks']} | "
                     f"{s['prefetch_mode']} | {s['pv_bf16']} | {s['gbs']:.1f} | "
                     f"{100 * s['gbs'] / bw['best']:.0f}% |")
    lines += ["", f"Thread scaling at batch {kb}, context {kctx} (read: a streaming read of as "
              "many bytes with as many threads):", "",
              "| threads | attention GB/s | read GB/s | ratio |", "|---|---|---|---|"]
    for r in att["scaling"]:
        lines.append(f"| {r['threads']} | {r['attention_gbs']:.1f} | {r['read_gbs']:.1f} | "
                     f"{100 * r['attention_gbs'] / r['read_gbs']:.0f}% |")
    lines += ["", "Per-core compute with the KV in cache (1 thread; ns per token per kv head):",
              "", "| bf16 P.V | part | ns |", "|---|---|---|"]
    for r in att.get("profile", []):
        lines.append(f"| {r['pv_bf16']} | {r['part']} | {r['ns_per_token_head']:.1f} |")
    lines += ["", "## Summary", "", "```", json.dumps(res["summary"], indent=1), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer points (a smoke run)")
    ap.add_argument("--out", help="markdown path; the JSON goes beside it")
    args = ap.parse_args(argv)
    res: dict = {}
    cpu_section(res, quick=args.quick)
    if args.out:
        md = Path(args.out)
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(to_markdown(res))
        md.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
        print(f"wrote {md} and {md.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
