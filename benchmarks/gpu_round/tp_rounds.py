"""Where a tensor-parallel decode round's time goes, beside the cost model.

Under GPU tensor parallelism, decode rounds on the 2-GPU box ran 0.6-2.6 ms over a model built
from stages timed on their own (docs/validation/h200x2). This runs whole decode rounds of
`--rows` requests of `--context` tokens through the runtime's `LeadExecutor` over `--world`
ranks at the model's depth (or `--layers`), CUDA graphs as served, and prints for each:

* the round's wall time on rank 0 and the model's price for it, without and with the
  profile's `gpu.rank_round` (what the profiler adds for the rank group): the ratio real /
  model-with-rank_round is what this is judged by (1.0 = the simulator prices it right);
* on CUDA, the median layer's GPU time inside the round (a CUDA event per stage on rank 0)
  against the model's layer: a layer costs more inside a round than its stages timed alone;
* with `--delay-ms`, the same with rank 0 waiting that long after handing the round over, so
  that the other ranks have queued their whole round first: if the layers stay as slow, their
  extra time is the GPUs', not a rank's host lagging.

    python -m benchmarks.gpu_round.tp_rounds --profile calibration/h200x2-xeon32/qwen3-14b.yaml \\
        --world 2 --delay-ms 5 --json out.json
    python -m benchmarks.gpu_round.tp_rounds --roofline rtx4090-xeon4510-12c --model tiny-llama \\
        --device cpu --world 2 --rows 1 4 --rounds 3        # smoke (Gloo)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import time

import torch

from benchmarks.profile_args import add_profile_arguments, profile_from
from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import ModelWeights
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.profiler.measure import decode_plan
from dualpace_hw.profiler.rank_round import priced_round
from dualpace_hw.runtime.gpu_ranks import LeadExecutor
from dualpace_sim.costs import CostModel


def one_round(ex: LeadExecutor, plan, delay_s: float) -> tuple[float, list[float]]:
    """(wall seconds, each stage's GPU seconds on rank 0; empty off CUDA) of one whole round,
    run as `LeadExecutor.execute` does, with a CUDA event before each stage."""
    start = time.perf_counter()
    rnd = ex.round_of(plan)
    ex.peers.send_round(rnd, True)
    if delay_s:
        time.sleep(delay_s)
    fw = GpuExecutor.forward(ex, rnd)
    events: list[torch.cuda.Event] = []

    def mark() -> None:
        if ex.cuda:
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()

    for stage in fw:
        mark()
        stage()
    mark()
    tokens = fw.result()
    ex.peers.end(tokens)
    wall = time.perf_counter() - start
    if delay_s:
        wall -= delay_s
    return wall, [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(events)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_profile_arguments(ap)
    ap.add_argument("--world", type=int, default=2, help="GPU tensor-parallel ranks")
    ap.add_argument("--layers", type=int, default=None, help="timed depth (default: the model's)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--context", type=int, default=1024, help="tokens per request")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    profile = profile_from(ap, args)
    cost = CostModel(profile)
    depth = args.layers or profile.model.n_layers
    shape = dataclasses.replace(profile.model, n_layers=depth)
    device = torch.device("cuda:0" if args.device == "cuda" else args.device)  # rank 0's
    if device.type == "cuda":
        torch.cuda.set_device(device)
    bs = profile.block_size
    tokens = TokenStore()
    weights = ModelWeights.random(shape, 0, device)
    ex = LeadExecutor(shape, weights, args.world, max(args.rows) * -(-args.context // bs), bs,
                      tokens, weights.embed.dtype)
    del weights
    print(f"{profile.model.name} over {args.world} ranks, {depth} layers, {args.context}-token "
          f"requests, median of {args.rounds} rounds")
    print(f"{'rows':>5} {'delay':>6} {'real ms':>8} {'model':>7} {'+rank_round':>12} "
          f"{'real/model':>11} {'layer us':>9} {'model layer':>12}")
    results = []
    try:
        for rows in args.rows:
            for req_id in range(len(tokens)):
                tokens.remove(req_id)
            plan = decode_plan(tokens, rows, args.context, bs)
            for delay in sorted({0.0, args.delay_ms / 1e3}):
                for _ in range(3):  # the first captures the round's graphs
                    one_round(ex, plan, delay)
                runs = [one_round(ex, plan, delay) for _ in range(args.rounds)]
                real = statistics.median(w for w, _ in runs)
                layer = (statistics.median(statistics.median(s[1:-1]) for _, s in runs)
                         if runs[0][1] else float("nan"))
                model_layer = cost.gpu_layer(rows, [], rows, rows * args.context)
                model = priced_round(cost, rows, depth)  # stages and iteration overhead
                rank_round = cost.gpu_round_overhead(rows) - cost.gpu_iteration_overhead
                row = {"rows": rows, "delay_ms": delay * 1e3, "real_s": real,
                       "model_s": model, "model_with_rank_round_s": model + rank_round,
                       "layer_s": layer, "model_layer_s": model_layer}
                results.append(row)
                print(f"{rows:>5} {delay * 1e3:>6.1f} {real * 1e3:>8.2f} "
                      f"{row['model_s'] * 1e3:>7.2f} {row['model_with_rank_round_s'] * 1e3:>12.2f}"
                      f" {real / row['model_with_rank_round_s']:>11.2f} {layer * 1e6:>9.1f} "
                      f"{model_layer * 1e6:>12.1f}")
    finally:
        ex.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": profile.model.name, "world": args.world, "layers": depth,
                       "context": args.context, "rounds": args.rounds, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
