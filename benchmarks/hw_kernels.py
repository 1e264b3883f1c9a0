"""Kernel benchmarks of the real runtime, each figure next to the physical limit measured in the
same run (issue 5's targets).

GPU (this file): the Llama-3.1-8B decode step (whole forward through GpuExecutor, random bf16
weights, batches 1-256 x context 1k-4k) against the HBM roofline of the weights and KV bytes it
must read at the device-copy bandwidth measured here (target >= 70%); the Triton paged decode
kernel alone; swaps and Prefill-to-CPU layer copies against the measured pinned H2D / D2H copy
bandwidth (target >= 80%). CPU: `cpu_section(out)` from benchmarks/cpu_kernels.py, if that module
imports.

    python benchmarks/hw_kernels.py [--out benchmarks/results/<box>-hw_kernels.md] [--quick]

Without CUDA the GPU sections print why they were skipped and the script exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from dualpace_hw.hostinfo import cpu_model

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dualpace_hw.executors.gpu import GpuExecutor  # noqa: E402
from dualpace_hw.executors.model import Dense, LayerWeights, Model, ModelWeights  # noqa: E402
from dualpace_hw.memory.kv import PagedKVPool  # noqa: E402
from dualpace_hw.memory.migrate import Migrator  # noqa: E402
from dualpace_hw.memory.tokens import TokenStore  # noqa: E402
from dualpace_sim.core.plans import GpuPlan  # noqa: E402
from dualpace_sim.core.request import Request  # noqa: E402
from dualpace_sim.costs.shapes import ModelShape  # noqa: E402

BATCHES = [1, 8, 32, 64, 128, 256]
CONTEXTS = [1024, 2048, 4096]
BLOCK = 16
GIB = 2**30


# ------------------------------------------------------------------------------ the box

def box_description() -> dict:
    d = {
        "cpu": cpu_model(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        import triton

        d["triton"] = triton.__version__
    except Exception:
        d["triton"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d["gpu"] = p.name
        d["gpu_memory_gib"] = round(p.total_memory / GIB, 1)
        d["gpu_sms"] = p.multi_processor_count
        d["driver"] = _driver()
    else:
        d["gpu"] = None
    return d


def _driver() -> str | None:
    try:
        import subprocess

        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip() or None
    except Exception:
        return None


def box_name(box: dict) -> str:
    name = box.get("gpu") or "cpu-" + box["cpu"]
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "box"


# ---------------------------------------------------------------------------- timing

def cuda_time(fn, warmup: int = 3, reps: int = 10) -> float:
    """Median seconds of fn() between CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def wall_time(fn, warmup: int = 2, reps: int = 7) -> float:
    """Median wall seconds of fn(), which must end synchronized."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def graph_time(fn, reps: int = 20) -> float:
    """Median seconds of fn() captured in a CUDA graph (no launch overhead), 5 calls a replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(5):
            fn()
    return cuda_time(g.replay, warmup=2, reps=reps) / 5


def gpu_step_time(ex: GpuExecutor, plan: GpuPlan, warmup: int = 2, reps: int = 10) -> float:
    """Median GPU time of one forward: the plan is flattened and its inputs sent before the
    start event, so the host-side preparation is not counted (the wall time counts it)."""
    times = []
    for i in range(warmup + reps):
        fw = ex.stages(plan)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for s in fw:
            s()
        b.record()
        b.synchronize()
        if i >= warmup:
            times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


# ------------------------------------------------------------------------- ceilings

def device_copy_bandwidth(nbytes: int = 4 * GIB) -> float:
    """Bytes read + written per second of a large device-to-device copy."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    t = cuda_time(lambda: b.copy_(a), warmup=3, reps=10)
    return 2 * nbytes / t


def pinned_bandwidth(nbytes: int = GIB) -> tuple[float, float]:
    """H2D and D2H bytes per second of a large pinned copy."""
    h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    h.random_(0, 255)
    d = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d = cuda_time(lambda: d.copy_(h, non_blocking=True), warmup=2, reps=7)
    d2h = cuda_time(lambda: h.copy_(d, non_blocking=True), warmup=2, reps=7)
    return nbytes / h2d, nbytes / d2h


# ----------------------------------------------------------------------- the model

def random_model_on_gpu(shape: ModelShape, seed: int = 0) -> Model:
    """ModelWeights.random's distribution, drawn on the GPU (an 8B model in seconds)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    h, q, kv, i = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.intermediate_size

    def mat(rows: int, cols: int) -> torch.Tensor:
        w = torch.empty(rows, cols, dtype=torch.bfloat16, device="cuda")
        return w.normal_(0.0, 1.0 / math.sqrt(cols), generator=g)

    def norm(n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_(1.0, 0.1, generator=g)

    layers = [LayerWeights(norm(h), Dense(mat(q + 2 * kv, h)), Dense(mat(h, q)), norm(h),
                           Dense(mat(2 * i, h)), Dense(mat(h, i)),
                           norm(shape.head_dim) if shape.qk_norm else None,
                           norm(shape.head_dim) if shape.qk_norm else None)
              for _ in range(shape.n_layers)]
    embed = torch.empty(shape.vocab_size, h, dtype=torch.bfloat16, device="cuda").normal_(
        generator=g)
    head = embed if shape.tie_word_embeddings else mat(shape.vocab_size, h)
    return Model(shape, ModelWeights(embed, layers, norm(h), Dense(head)))


def weight_bytes_read(model: Model, batch: int) -> int:
    """Bytes of weights one decode step reads: every layer, the final norm, the LM head, and
    the embedding rows of the batch."""
    w = model.w
    n = 0
    for lw in w.layers:
        for t in (lw.input_norm, lw.qkv.weight, lw.o.weight, lw.post_norm, lw.gate_up.weight,
                  lw.down.weight, lw.q_norm, lw.k_norm):
            if t is not None:
                n += t.numel() * t.element_size()
    n += w.final_norm.numel() * 2 + w.lm_head.weight.numel() * 2
    n += batch * w.embed.shape[1] * 2
    return n


# --------------------------------------------------------------------- GPU decode step

def gpu_decode_section(out: dict, copy_bw: float, quick: bool) -> None:
    shape = ModelShape.from_name("llama-3.1-8b")
    print(f"\n== GPU decode step: {shape.name}, random bf16 weights, block {BLOCK} ==")
    t0 = time.perf_counter()
    model = random_model_on_gpu(shape)
    torch.cuda.synchronize()
    print(f"weights on the GPU in {time.perf_counter() - t0:.1f} s "
          f"({weight_bytes_read(model, 0) / GIB:.2f} GiB read per step)")
    batches = [1, 32, 256] if quick else BATCHES
    contexts = [1024, 4096] if quick else CONTEXTS
    per_block = 2 * shape.n_layers * shape.kv_dim * BLOCK * 2
    free, _ = torch.cuda.mem_get_info()
    budget = free - 10 * GIB  # activations, graphs, logits, the copy sections
    n_blocks = max(1, min(budget // per_block, max(b * -(-c // BLOCK) for b in batches
                                                    for c in contexts)))
    pool = PagedKVPool(shape, int(n_blocks), BLOCK, device="cuda")
    for layer in range(shape.n_layers):
        pool.data[layer].normal_()
    print(f"HBM KV pool: {n_blocks} blocks ({n_blocks * per_block / GIB:.1f} GiB)")
    tokens = TokenStore()
    ex = GpuExecutor(model, pool, tokens, cuda_graphs=True, max_graphs=4)
    perm = torch.randperm(int(n_blocks)).tolist()  # scattered pages, as after churn
    rows = []
    gen = torch.Generator().manual_seed(0)
    next_id = 0
    for ctx in contexts:
        for b in batches:
            need = b * -(-ctx // BLOCK)
            point = {"batch": b, "context": ctx}
            if need > n_blocks:
                point["skipped"] = (f"KV of {b} x {ctx} tokens ({need * per_block / GIB:.0f} GiB) "
                                    "does not fit beside the weights")
                print(f"B={b:4d} ctx={ctx:5d}: skipped, {point['skipped']}")
                rows.append(point)
                continue
            reqs = []
            cursor = 0
            for _ in range(b):
                r = Request.create(next_id, 0.0, ctx - 1, 16, BLOCK)
                r.generated += 1  # a decoded token; its time is never recorded
                nb = -(-ctx // BLOCK)
                r.blocks = perm[cursor:cursor + nb]
                cursor += nb
                ids = torch.randint(0, shape.vocab_size, (ctx,), generator=gen).tolist()
                tokens.add(next_id, ids[:-1])
                tokens.append(next_id, ids[-1])
                reqs.append(r)
                next_id += 1
            plan = GpuPlan(decodes=reqs)
            ex.execute(plan)  # capture the graphs
            t_gpu = gpu_step_time(ex, plan, reps=5 if quick else 10)
            t_wall = wall_time(lambda plan=plan: ex.execute(plan), warmup=1, reps=5)
            kv_bytes = b * ctx * shape.kv_dim * 2 * 2 * shape.n_layers
            wbytes = weight_bytes_read(model, b)
            roof = (kv_bytes + wbytes) / copy_bw
            eff = roof / t_gpu
            # the Triton paged decode kernel alone, one layer
            from dualpace_hw.kernels import triton_decode

            bt = ex._last_batch
            table = torch.zeros(b, max(len(t) for t in bt.tables), dtype=torch.int32)
            for i, t in enumerate(bt.tables):
                table[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
            table = table.cuda()
            lens = torch.tensor(bt.lens, dtype=torch.int32, device="cuda")
            q = torch.randn(b, shape.n_heads, shape.head_dim, device="cuda", dtype=torch.bfloat16)
            kc, vc = pool.layer(0)
            out_attn = torch.empty_like(q)

            def attn(q=q, table=table, lens=lens, kc=kc, vc=vc, o=out_attn) -> None:
                triton_decode.paged_decode_attention(q, kc, vc, table, lens, out=o)

            t_attn = graph_time(attn, reps=20)
            attn_bw = (kv_bytes / shape.n_layers) / t_attn
            point.update({
                "step_ms": t_gpu * 1e3, "step_wall_ms": t_wall * 1e3,
                "weights_gib": wbytes / GIB, "kv_gib": kv_bytes / GIB,
                "roofline_ms": roof * 1e3, "efficiency": eff,
                "tokens_per_s": b / t_gpu,
                "attn_layer_us": t_attn * 1e6, "attn_bw_tbs": attn_bw / 1e12,
                "attn_efficiency": attn_bw / copy_bw,
            })
            rows.append(point)
            print(f"B={b:4d} ctx={ctx:5d}: step {t_gpu * 1e3:7.2f} ms (wall {t_wall * 1e3:7.2f})"
                  f"  roofline {roof * 1e3:7.2f} ms  {100 * eff:5.1f}%   "
                  f"attention/layer {t_attn * 1e6:7.1f} us = {attn_bw / 1e12:.2f} TB/s "
                  f"({100 * attn_bw / copy_bw:.0f}%)")
            for r in reqs:
                tokens.remove(r.req_id)
            ex._graphs.clear()
            torch.cuda.empty_cache()
    done = [r for r in rows if "efficiency" in r]
    overall = {
        "points": len(done),
        "met_70": sum(r["efficiency"] >= 0.70 for r in done),
        "min": min((r["efficiency"] for r in done), default=None),
        "median": statistics.median([r["efficiency"] for r in done]) if done else None,
        # time-weighted: total roofline time over total measured time
        "aggregate": (sum(r["roofline_ms"] for r in done) / sum(r["step_ms"] for r in done))
        if done else None,
    }
    print(f"decode step vs HBM roofline: {overall['met_70']}/{overall['points']} points >= 70%, "
          f"min {100 * overall['min']:.1f}%, median {100 * overall['median']:.1f}%, "
          f"aggregate {100 * overall['aggregate']:.1f}%")
    out["gpu_decode"] = {"model": shape.name, "rows": rows, "overall": overall,
                         "target": 0.70}


# ----------------------------------------------------------------------------- copies

def copy_section(out: dict, h2d_bw: float, d2h_bw: float, quick: bool) -> None:
    shape = ModelShape.from_name("llama-3.1-8b")
    print("\n== Swaps and Prefill-to-CPU copies (pinned host pool, copy stream) ==")
    n_host = 1024 if quick else 2048
    gpu = PagedKVPool(shape, 4096, BLOCK, device="cuda")
    host = PagedKVPool(shape, n_host, BLOCK, device="cpu", pin_memory=True)
    gpu.data.view(torch.int16).random_(-20000, 20000)
    bb = gpu.block_bytes
    print(f"block: {bb / 2**20:.1f} MiB (all layers, K and V); host pool {n_host} blocks")
    rows = []
    g = torch.Generator().manual_seed(1)
    counts = [64, 256] if quick else [64, 256, 1024]
    for method in ("dma", "kernel"):
        m = Migrator(gpu, host, method=method)
        for n in counts:
            gpu_ids = torch.randperm(gpu.n_blocks, generator=g)[:n].tolist()
            layouts = {
                "host runs (LIFO)": list(range(n - 1, -1, -1)),  # a fresh pool's descending run
                "host scattered": torch.randperm(n_host, generator=g)[:n].tolist(),
            }
            for layout, host_ids in layouts.items():
                t_out = wall_time(lambda gi=gpu_ids, hi=host_ids, m=m: m.swap_out(gi, hi).wait(),
                                  warmup=1, reps=3 if quick else 5)
                t_in = wall_time(lambda gi=gpu_ids, hi=host_ids, m=m: m.swap_in(hi, gi).wait(),
                                 warmup=1, reps=3 if quick else 5)
                nbytes = n * bb
                row = {"op": "swap", "method": method, "blocks": n, "layout": layout,
                       "gib": nbytes / GIB,
                       "swap_out_gbs": nbytes / t_out / 1e9, "swap_in_gbs": nbytes / t_in / 1e9,
                       "swap_out_eff": nbytes / t_out / d2h_bw,
                       "swap_in_eff": nbytes / t_in / h2d_bw}
                rows.append(row)
                print(f"{method:6s} {n:5d} blocks {layout:17s}: swap-out "
                      f"{row['swap_out_gbs']:5.1f} GB/s ({100 * row['swap_out_eff']:5.1f}% of D2H)"
                      f"  swap-in {row['swap_in_gbs']:5.1f} GB/s "
                      f"({100 * row['swap_in_eff']:5.1f}% of H2D)")
    # Prefill-to-CPU: a chunk's pages, layer by layer, as the forward issues them
    m = Migrator(gpu, host, method="auto")
    for chunk in ([512] if quick else [512, 2048]):
        nb = chunk // BLOCK
        kb = torch.randn(nb, shape.n_kv_heads, BLOCK, shape.head_dim, device="cuda",
                         dtype=torch.bfloat16)
        vb = torch.randn_like(kb)
        host_ids = list(range(nb - 1, -1, -1))

        def layer_copies(kb=kb, vb=vb, host_ids=host_ids) -> None:
            # as the executor does: one page plan per chunk, each layer's K and V stacked in
            # host-id order on the compute stream, then one DMA per host run on the copy stream
            plan = m.page_plan(host_ids)
            hs = []
            for layer in range(shape.n_layers):
                kv = m.sort_pages(plan, torch.stack([kb, vb]), dim=1)
                hs.append(m.copy_layer_pages_to_host(layer, kv, plan))
            hs[-1].wait()

        t = wall_time(layer_copies, warmup=1, reps=5)
        nbytes = shape.n_layers * 2 * kb.numel() * 2
        row = {"op": "prefill_to_cpu", "method": "pages", "tokens": chunk, "gib": nbytes / GIB,
               "gbs": nbytes / t / 1e9, "eff": nbytes / t / d2h_bw}
        rows.append(row)
        print(f"Prefill-to-CPU {chunk:5d}-token chunk, 32 layer copies (pages): "
              f"{row['gbs']:5.1f} GB/s ({100 * row['eff']:5.1f}% of D2H)")
        if m.cuda and hasattr(m, "copy_layer_to_host"):
            k = torch.randn(chunk, shape.n_kv_heads, shape.head_dim, device="cuda",
                            dtype=torch.bfloat16)
            v = torch.randn_like(k)
            slots = [b * BLOCK + o for b in host_ids for o in range(BLOCK)]

            def slot_copies(k=k, v=v, slots=slots) -> None:
                hs = [m.copy_layer_to_host(layer, k, v, slots) for layer in range(shape.n_layers)]
                hs[-1].wait()

            t = wall_time(slot_copies, warmup=1, reps=5)
            row = {"op": "prefill_to_cpu", "method": "slots (kernel)", "tokens": chunk,
                   "gib": nbytes / GIB, "gbs": nbytes / t / 1e9, "eff": nbytes / t / d2h_bw}
            rows.append(row)
            print(f"Prefill-to-CPU {chunk:5d}-token chunk, 32 layer copies (slots):  "
                  f"{row['gbs']:5.1f} GB/s ({100 * row['eff']:5.1f}% of D2H)")
    # overlap: a swap-out issued under a long GPU kernel sequence
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def compute() -> None:
        for _ in range(20):
            a @ a

    t_comp = wall_time(lambda: (compute(), torch.cuda.synchronize()), warmup=1, reps=3)
    ids = list(range(256))
    t_swap = wall_time(lambda: m.swap_out(ids, ids).wait(), warmup=1, reps=3)

    def both() -> None:
        h = m.swap_out(ids, ids)
        compute()
        h.wait()
        torch.cuda.synchronize()

    t_both = wall_time(both, warmup=1, reps=3)
    ov = {"compute_ms": t_comp * 1e3, "swap_ms": t_swap * 1e3, "both_ms": t_both * 1e3,
          "overlap": (t_comp + t_swap - t_both) / min(t_comp, t_swap)}
    print(f"overlap: compute {t_comp * 1e3:.1f} ms, 256-block swap-out {t_swap * 1e3:.1f} ms, "
          f"together {t_both * 1e3:.1f} ms ({100 * ov['overlap']:.0f}% of the shorter hidden)")
    out["copies"] = {"rows": rows, "overlap": ov, "target": 0.80}


# -------------------------------------------------------------------------- report

def markdown(res: dict) -> str:
    box = res["box"]
    lines = ["# hw_kernels", "", "## Box", ""]
    lines += [f"- {k}: {v}" for k, v in box.items()]
    ceil = res.get("ceilings", {})
    if ceil:
        lines += ["", "## Ceilings measured in this run", ""]
        lines += [f"- {k}: {v:.3g}" if isinstance(v, float) else f"- {k}: {v}"
                  for k, v in ceil.items()]
    dec = res.get("gpu_decode")
    if dec:
        o = dec["overall"]
        lines += ["", f"## GPU decode step, {dec['model']} (target >= 70% of the HBM roofline)",
                  "", f"{o['met_70']}/{o['points']} points meet it; min {100 * o['min']:.1f}%, "
                  f"median {100 * o['median']:.1f}%, aggregate {100 * o['aggregate']:.1f}%.", "",
                  "| batch | context | step ms | wall ms | roofline ms | % roofline | tok/s "
                  "| attn/layer us | attn TB/s (% copy bw) |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in dec["rows"]:
            if "skipped" in r:
                lines.append(f"| {r['batch']} | {r['context']} | skipped: {r['skipped']} "
                             "| | | | | | |")
                continue
            lines.append(
                f"| {r['batch']} | {r['context']} | {r['step_ms']:.2f} | {r['step_wall_ms']:.2f} "
                f"| {r['roofline_ms']:.2f} | {100 * r['efficiency']:.1f} "
                f"| {r['tokens_per_s']:.0f} | {r['attn_layer_us']:.1f} "
                f"| {r['attn_bw_tbs']:.2f} ({100 * r['attn_efficiency']:.0f}%) |")
    cp = res.get("copies")
    if cp:
        lines += ["", "## Swaps and Prefill-to-CPU copies (target >= 80% of pinned copy bandwidth)",
                  "", "| op | method | size | layout | GB/s | % of pinned bw |",
                  "|---|---|---:|---|---:|---:|"]
        for r in cp["rows"]:
            if r["op"] == "swap":
                lines.append(f"| swap-out | {r['method']} | {r['blocks']} blocks "
                             f"({r['gib']:.2f} GiB) | {r['layout']} | {r['swap_out_gbs']:.1f} "
                             f"| {100 * r['swap_out_eff']:.1f} |")
                lines.append(f"| swap-in | {r['method']} | {r['blocks']} blocks "
                             f"({r['gib']:.2f} GiB) | {r['layout']} | {r['swap_in_gbs']:.1f} "
                             f"| {100 * r['swap_in_eff']:.1f} |")
            else:
                lines.append(f"| Prefill-to-CPU (32 layers) | {r['method']} | {r['tokens']} "
                             f"tokens ({r['gib']:.2f} GiB) | LIFO run | {r['gbs']:.1f} "
                             f"| {100 * r['eff']:.1f} |")
        ov = cp["overlap"]
        lines += ["", f"Overlap: compute {ov['compute_ms']:.1f} ms, 256-block swap-out "
                  f"{ov['swap_ms']:.1f} ms, together {ov['both_ms']:.1f} ms "
                  f"({100 * ov['overlap']:.0f}% of the shorter hidden)."]
    if "cpu" in res:
        lines += ["", "## CPU", "", "```", json.dumps(res["cpu"], indent=1, default=str)[:20000],
                  "```"]
    for note in res.get("notes", []):
        lines += ["", f"Note: {note}"]
    return "\n".join(lines) + "\n"


def cpu_part(res: dict) -> None:
    try:
        from cpu_kernels import cpu_section
    except ImportError as e:
        msg = f"CPU section skipped: cpu_kernels.cpu_section is not available ({e})"
        print("\n" + msg)
        res.setdefault("notes", []).append(msg)
        return
    print("\n== CPU section (benchmarks/cpu_kernels.py) ==")
    cpu: dict = {}
    cpu_section(cpu)
    res["cpu"] = cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="markdown path (JSON beside it); default "
                    "benchmarks/results/<box>-hw_kernels.md")
    ap.add_argument("--quick", action="store_true", help="fewer points (a smoke run)")
    ap.add_argument("--sections", default="gpu,copies,cpu",
                    help="comma-separated: gpu, copies, cpu")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    box = box_description()
    print("== Box ==")
    for k, v in box.items():
        print(f"{k}: {v}")
    res: dict = {"box": box, "command": " ".join([Path(sys.argv[0]).name] + (argv or
                                                                               sys.argv[1:]))}
    if not torch.cuda.is_available():
        msg = "no CUDA device: the GPU decode and copy sections are skipped"
        print("\n" + msg)
        res.setdefault("notes", []).append(msg)
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        copy_bw = device_copy_bandwidth()
        h2d, d2h = pinned_bandwidth()
        res["ceilings"] = {"device_copy_tbs": copy_bw / 1e12, "pinned_h2d_gbs": h2d / 1e9,
                           "pinned_d2h_gbs": d2h / 1e9}
        for mib in (32, 128, 512):  # one plain copy of a swap's size, for reference
            a, b = pinned_bandwidth(mib * 2**20)
            res["ceilings"][f"pinned_h2d_gbs_{mib}MiB"] = a / 1e9
            res["ceilings"][f"pinned_d2h_gbs_{mib}MiB"] = b / 1e9
        print(f"\ndevice-to-device copy: {copy_bw / 1e12:.2f} TB/s (read + write); "
              f"pinned H2D {h2d / 1e9:.1f} GB/s, D2H {d2h / 1e9:.1f} GB/s (1 GiB copies)")
        print("one pinned copy of 32 / 128 / 512 MiB: H2D " + " / ".join(
            f"{res['ceilings'][f'pinned_h2d_gbs_{m}MiB']:.1f}" for m in (32, 128, 512))
            + " GB/s, D2H " + " / ".join(
            f"{res['ceilings'][f'pinned_d2h_gbs_{m}MiB']:.1f}" for m in (32, 128, 512)) + " GB/s")
        if "gpu" in sections:
            gpu_decode_section(res, copy_bw, args.quick)
            torch.cuda.empty_cache()
        if "copies" in sections:
            copy_section(res, h2d, d2h, args.quick)
    if "cpu" in sections:
        cpu_part(res)
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / \
        f"{box_name(box)}-hw_kernels.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(res))
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    print(f"\nwrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
