"""Probe 2 (issue 9): is the in-round per-layer excess under TP the GPU's (L2, all-reduce) or
rank 1's host lag? w1: one GPU, a layer graph replayed back to back vs cycling 40 layers.
w2: rounds where rank 0 waits 5 ms after sending the round (rank 1 queues first) vs not."""

import json
import os
import statistics as st
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from x2_rounds import BS, OUT, timed_round

from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.profiler.measure import decode_plan
from dualpace_hw.runtime.gpu_ranks import LeadExecutor
from dualpace_sim.costs.shapes import BUILTIN_SHAPES

res = []


def out(row):
    res.append(row)
    print(json.dumps(row), flush=True)
    with open(f"{OUT}/x2_rounds2.json", "w") as f:
        json.dump(res, f, indent=1)


def ev_time(fn, n):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    a.record()
    for _ in range(n):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e-3 / n


def main():
    shape = BUILTIN_SHAPES["qwen3-14b"]
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    blocks = 64 * 64 + 64
    which = sys.argv[1:]
    if "w1" in which:
        w = ModelWeights.random(shape, 0, dev)
        tokens = TokenStore()
        ex = GpuExecutor(
            Model(shape, w), PagedKVPool(shape, blocks, BS, dev, dtype=torch.bfloat16), tokens
        )
        for rows in (1, 16, 64):
            for rid in range(len(tokens)):
                tokens.remove(rid)
            plan = decode_plan(tokens, rows, 1024, BS)
            for _ in range(3):
                timed_round(ex, plan, False)
            g = list(ex._graphs.values())[-1]
            same = ev_time(g.graphs[1].replay, 200)
            layers = g.graphs[1:41]

            def cyc(layers=layers):
                for x in layers:
                    x.replay()

            cyclic = ev_time(cyc, 10) / 40
            r = [timed_round(ex, plan, False) for _ in range(20)]
            out(
                {
                    "tag": "w1",
                    "rows": rows,
                    "same_layer_us": same * 1e6,
                    "cyclic_us": cyclic * 1e6,
                    "in_round_us": st.median(st.median(x["layers"]) for x in r) * 1e6,
                }
            )
        ex.release_graphs()
        del ex, w
        torch.cuda.empty_cache()
    if "w2" in which:
        w = ModelWeights.random(shape, 0, dev)
        tokens = TokenStore()
        ex = LeadExecutor(shape, w, 2, blocks, BS, tokens, torch.bfloat16)
        try:
            orig = ex.peers.send_round
            for rows in (1, 16, 64):
                for rid in range(len(tokens)):
                    tokens.remove(rid)
                plan = decode_plan(tokens, rows, 1024, BS)
                for delay in (0.0, 0.005, 0.0):

                    def send(rnd, whole, d=delay):
                        orig(rnd, whole)
                        if d:
                            time.sleep(d)

                    ex.peers.send_round = send
                    for _ in range(3):
                        timed_round(ex, plan, True)
                    r = [timed_round(ex, plan, True) for _ in range(25)]
                    out(
                        {
                            "tag": "w2",
                            "rows": rows,
                            "delay_ms": delay * 1e3,
                            "layer_us": st.median(st.median(x["layers"]) for x in r) * 1e6,
                            "gpu_ms": st.median(x["gpu"] for x in r) * 1e3,
                            "first_us": st.median(x["first"] for x in r) * 1e6,
                            "issue_ms": st.median(x["issue"] for x in r) * 1e3,
                        }
                    )
        finally:
            ex.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
