"""Probe 3 (issue 9): eager (prefill) rounds under TP cost ~25 % over the model. Per-layer cost
of whole eager rounds of the profiler's small mixed batch, from depth 40 and 1, through
LeadExecutor (rank 0 free or pinned as the runtime pins it) and on one GPU."""

import dataclasses
import json
import os
import statistics as st
import time

import torch

from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.profiler.measure import decode_plan, small_mixed_plan
from dualpace_hw.runtime.gpu_ranks import LeadExecutor
from dualpace_sim.costs.shapes import BUILTIN_SHAPES

OUT = os.environ.get("OUT", "/tmp")
BS = 16
res = []


def out(row):
    res.append(row)
    print(json.dumps(row), flush=True)
    with open(f"{OUT}/x2_eager.json", "w") as f:
        json.dump(res, f, indent=1)


def wall(ex, plan, n=20):
    for _ in range(3):
        ex.execute(plan)
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        ex.execute(plan)
        ts.append(time.perf_counter() - t)
    return st.median(ts)


def main():
    shape = BUILTIN_SHAPES["qwen3-14b"]
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    allc = os.sched_getaffinity(0)
    for depth in (40, 1):
        s = dataclasses.replace(shape, n_layers=depth)
        w = ModelWeights.random(s, 0, dev)
        tokens = TokenStore()
        ex = GpuExecutor(Model(s, w), PagedKVPool(s, 64, BS, dev, dtype=torch.bfloat16), tokens)
        plan = small_mixed_plan(tokens, BS, 64)
        out({"tag": "w1", "depth": depth, "eager_ms": wall(ex, plan) * 1e3})
        del ex, w
        torch.cuda.empty_cache()
    for depth in (40, 1):
        s = dataclasses.replace(shape, n_layers=depth)
        w = ModelWeights.random(s, 0, dev)
        tokens = TokenStore()
        ex = LeadExecutor(s, w, 2, 4160, BS, tokens, torch.bfloat16)
        del w
        try:
            plan = small_mixed_plan(tokens, BS, 4160)
            for pinned in (False, True, False):
                if pinned:
                    os.sched_setaffinity(0, ex.host_cores)
                    torch.set_num_threads(len(ex.host_cores))
                else:
                    os.sched_setaffinity(0, allc)
                    torch.set_num_threads(len(allc))
                out(
                    {
                        "tag": "w2",
                        "depth": depth,
                        "pinned": pinned,
                        "eager_ms": wall(ex, plan) * 1e3,
                        "host_cores": len(ex.host_cores or ()),
                    }
                )
            if depth == 40:
                for rid in range(len(tokens)):
                    tokens.remove(rid)
                dplan = decode_plan(tokens, 16, 1024, BS)
                out({"tag": "w2-decode16", "pinned": False, "ms": wall(ex, dplan) * 1e3})
        finally:
            os.sched_setaffinity(0, allc)
            ex.close()
        torch.cuda.empty_cache()
    print("done", flush=True)


if __name__ == "__main__":
    main()
