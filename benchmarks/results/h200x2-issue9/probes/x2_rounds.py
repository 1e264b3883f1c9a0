"""Probe (issue 9): where do 2-GPU decode rounds spend the 0.7-2.6 ms the model misses?

Whole decode rounds of Qwen3-14B through the runtime's executors, graphs as in serving, with
rank 0's host timeline and per-stage CUDA events: world=1 (full model, one GPU) and world=2
(LeadExecutor), 40 layers and 1 layer, in the main thread and from a worker thread."""

import json
import os
import statistics as st
import sys
import threading
import time

import torch

from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.profiler.measure import decode_plan
from dualpace_hw.runtime.gpu_ranks import LeadExecutor
from dualpace_sim.costs.shapes import BUILTIN_SHAPES

OUT = os.environ.get("OUT", "/tmp")
BS = 16
ROWS = [1, 4, 16, 64]
CTXS = [256, 1024]
N = 30
res = []


def timed_round(ex, plan, lead: bool):
    dev = ex.device
    t0 = time.perf_counter()
    rnd = ex.round_of(plan)
    t1 = time.perf_counter()
    if lead:
        ex.peers.send_round(rnd, True)
    t2 = time.perf_counter()
    fw = GpuExecutor.forward(ex, rnd)
    t3 = time.perf_counter()
    evs = []
    for s in fw:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        evs.append(e)
        s()
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    evs.append(e)
    t4 = time.perf_counter()
    tokens = fw.result()
    t5 = time.perf_counter()
    if lead:
        ex.peers.end(tokens)
    t6 = time.perf_counter()
    torch.cuda.synchronize(dev)
    gaps = [evs[i].elapsed_time(evs[i + 1]) * 1e-3 for i in range(len(evs) - 1)]
    return dict(
        wall=t6 - t0,
        flatten=t1 - t0,
        send=t2 - t1,
        prep=t3 - t2,
        issue=t4 - t3,
        result=t5 - t4,
        end=t6 - t5,
        gpu=sum(gaps),
        first=gaps[0],
        post=gaps[-1],
        layers=gaps[1:-1],
    )


def series(ex, tokens, lead, tag, rows_list=ROWS, ctxs=CTXS):
    for ctx in ctxs:
        for rows in rows_list:
            for rid in range(len(tokens)):
                tokens.remove(rid)
            plan = decode_plan(tokens, rows, ctx, BS)
            for _ in range(4):
                timed_round(ex, plan, lead)
            rs = [timed_round(ex, plan, lead) for _ in range(N)]
            row = {"tag": tag, "rows": rows, "ctx": ctx}
            for k in (
                "wall",
                "flatten",
                "send",
                "prep",
                "issue",
                "result",
                "end",
                "gpu",
                "first",
                "post",
            ):
                row[k] = st.median(r[k] for r in rs)
            layers = [st.median(r["layers"][i] for r in rs) for i in range(len(rs[0]["layers"]))]
            row["layer_med"] = st.median(layers)
            row["layer_sum"] = sum(layers)
            res.append(row)
            print(
                json.dumps(
                    {k: (round(v * 1e3, 3) if isinstance(v, float) else v) for k, v in row.items()}
                ),
                flush=True,
            )
            with open(f"{OUT}/x2_rounds.json", "w") as f:
                json.dump(res, f, indent=1)


def threaded(fn):
    """Run fn in a worker thread while the main thread polls as the runtime's does."""
    done = threading.Event()
    err = []

    def body():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            err.append(e)
        done.set()

    iv = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    t = threading.Thread(target=body)
    t.start()
    while t.is_alive():
        t.join(0.05)
    sys.setswitchinterval(iv)
    if err:
        raise err[0]


def main():
    shape = BUILTIN_SHAPES["qwen3-14b"]
    blocks = max(ROWS) * (max(CTXS) // BS) + 64
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    which = sys.argv[1:] or ["w1", "w2", "w2t", "w2l1"]
    if "w1" in which:
        w = ModelWeights.random(shape, 0, dev)
        tokens = TokenStore()
        ex = GpuExecutor(
            Model(shape, w), PagedKVPool(shape, blocks, BS, dev, dtype=torch.bfloat16), tokens
        )
        series(ex, tokens, False, "w1")
        ex.release_graphs()
        del ex, w
        torch.cuda.empty_cache()
    for layers in [40, 1] if "w2l1" in which else [40]:
        s = shape if layers == 40 else __import__("dataclasses").replace(shape, n_layers=1)
        w = ModelWeights.random(s, 0, dev)
        tokens = TokenStore()
        ex = LeadExecutor(s, w, 2, blocks, BS, tokens, torch.bfloat16)
        try:
            if "w2" in which:
                series(ex, tokens, True, f"w2-l{layers}")
            if "w2t" in which and layers == 40:
                threaded(
                    lambda ex=ex, tokens=tokens: series(
                        ex, tokens, True, "w2-thread", [4, 16], [1024]
                    )
                )
        finally:
            ex.close()
        del ex, w
        torch.cuda.empty_cache()
    print("done", flush=True)


if __name__ == "__main__":
    main()
