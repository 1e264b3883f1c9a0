"""Probe 4 (issue 9): on one machine, alternately, the eager floor as the profiler's GPU ranks
time it (one layer back to back) and as whole eager rounds through LeadExecutor (slope of
depths 1 and 40), twice each. `RankRounds.eager` exists at commit 13abb93 only (the in-round
floor was reverted after this probe): run it from a checkout of that commit."""

import json
import os

import torch

from dualpace_hw.profiler.grids import Grids
from dualpace_hw.profiler.rank_round import RankRounds
from dualpace_hw.profiler.ranks import GpuRanks
from dualpace_hw.profiler.timing import Protocol, Timer
from dualpace_sim.costs.shapes import BUILTIN_SHAPES

OUT = os.environ.get("OUT", "/tmp")
res = []


def out(row):
    res.append(row)
    print(json.dumps(row), flush=True)
    with open(f"{OUT}/x2_floor.json", "w") as f:
        json.dump(res, f, indent=1)


def main():
    shape = BUILTIN_SHAPES["qwen3-14b"]
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    p = Protocol()
    for rep in range(2):
        g = GpuRanks(shape, 0, 16, Grids.full(), p, 2, dev, 28)
        try:
            out({"rep": rep, "ranks_floor_ms": [g.eager_layer() * 1e3 for _ in range(3)]})
        finally:
            g.close()
        walls = {}
        for d in (1, 40):
            r = RankRounds(shape, d, 0, 16, 2, dev, Timer(torch.device("cpu"), p), [1, 16])
            try:
                walls[d] = [r.eager() for _ in range(3)]
                dec = r.wall(16)
            finally:
                r.close()
            out(
                {
                    "rep": rep,
                    "depth": d,
                    "eager_ms": [w * 1e3 for w in walls[d]],
                    "decode16_ms": dec * 1e3,
                }
            )
        out(
            {
                "rep": rep,
                "slope_ms": [(a - b) / 39 * 1e3 for a, b in zip(walls[40], walls[1], strict=True)],
            }
        )
    print("done", flush=True)


if __name__ == "__main__":
    main()
