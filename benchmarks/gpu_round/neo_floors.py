"""NEO's eager floors on this box, and an eager decode round against the simulator's price.

NEO (SwiftLLM) runs every iteration without CUDA graphs, and so does the runtime's NEO; on the
H200 box its GPU-only decode iterations, 95 % of a KV-pressure run's time, took 2.5x what the
predictor's tables say, at 0.43 ms a layer whatever the batch (docs/validation/README.md, NEO).
This measures, as `dualpace-hw profile` does, `gpu.eager_layer_s` (one layer of a small mixed
batch, back to back) and `neo.eager_decode_layer_s` (its 8 decodes alone), then runs whole
eager decode rounds of the full-depth model (NEO's GPU-only iteration: the same kernels in the
same order) and sets each beside the simulator's price with the measured floor, and with the
given profile as it is. `--write-profile` writes --profile with the measured
`neo.eager_decode_layer_s`, for `dualpace-sim validate --costs`.

    python -m benchmarks.gpu_round.neo_floors --profile calibration/h200-spr16/llama-3.1-8b.yaml \\
        --write-profile /tmp/llama-3.1-8b-neo.yaml
    python -m benchmarks.gpu_round.neo_floors --roofline rtx4090-xeon4510-12c --model tiny-llama \\
        --device cpu --rounds 2                                  # smoke
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from benchmarks.gpu_round.host_floor import median_s
from benchmarks.profile_args import add_profile_arguments, profile_from
from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.profiler.grids import Grids
from dualpace_hw.profiler.measure import Measurer, decode_plan
from dualpace_hw.profiler.timing import Protocol, Timer
from dualpace_sim.core.neo import NeoPlan, SubBatch
from dualpace_sim.costs import CostModel
from dualpace_sim.costs.neo_tables import NeoTables
from dualpace_sim.sim.neo import executed_layer_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_profile_arguments(ap)
    ap.add_argument("--samples", type=int, default=3, help="measurements of each floor")
    ap.add_argument("--rounds", type=int, default=20, help="timed decode rounds per batch")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--context", type=int, default=512, help="tokens per decoding request")
    ap.add_argument("--write-profile", type=Path, default=None)
    args = ap.parse_args()
    profile = profile_from(ap, args)
    shape, bs, dev = profile.model, profile.block_size, torch.device(args.device)
    protocol = Protocol()
    m = Measurer(shape, dev, Timer(dev, protocol), Timer(torch.device("cpu"), protocol),
                 Grids.quick(), bs, cpu=False)
    mixed, decode = [], []
    for _ in range(args.samples):  # interleaved: the host's speed drifts
        mixed.append(m.eager_layer())
        decode.append(m.eager_decode_layer())
    eager, floor = statistics.median(mixed), statistics.median(decode)
    print(f"gpu.eager_layer_s        {eager * 1e3:7.3f} ms  (samples "
          + ", ".join(f"{x * 1e3:.3f}" for x in mixed)
          + f"; the profile's {profile.gpu.eager_layer_s * 1e3:.3f})")
    print(f"neo.eager_decode_layer_s {floor * 1e3:7.3f} ms  (samples "
          + ", ".join(f"{x * 1e3:.3f}" for x in decode) + ")")
    note = (f" neo.eager_decode_layer_s = {floor * 1e3:.3f} ms, the median of "
            f"{args.samples} measurements by benchmarks/gpu_round/neo_floors.py (samples "
            + ", ".join(f"{x * 1e3:.3f}" for x in decode) + " ms).")
    measured = profile.model_copy(update={
        "neo": profile.neo.model_copy(update={"eager_decode_layer_s": floor}),
        "provenance": profile.provenance.model_copy(
            update={"notes": (profile.provenance.notes or "") + note})})

    model = Model(shape, ModelWeights.random(shape, seed=0, device=dev))
    per = -(-args.context // bs)
    pool = PagedKVPool(shape, max(args.batches) * per, bs, dev)
    print(f"\n{'eager decode round':<28}{'real ms':>9}{'model ms':>10}{'real/model':>12}"
          f"{'given profile':>15}")
    for rows in args.batches:
        tokens = TokenStore()
        plan = decode_plan(tokens, rows, args.context, bs)
        ex = GpuExecutor(model, pool, tokens, cuda_graphs=False)
        real = median_s(lambda ex=ex, plan=plan: ex.execute(plan), dev, args.rounds)
        neo = NeoPlan([SubBatch.with_gpu_decodes(plan.decodes)])
        priced = []
        for p in (measured, profile):  # the given profile has no decode floor (or an old one)
            cm = CostModel(p)
            fixed = cm.gpu_pre_layer(rows) + cm.gpu_post_layer(rows) + cm.gpu_round_overhead(rows)
            priced.append(fixed + cm.n_layers * executed_layer_s(neo, NeoTables(cm), cm))
        print(f"{f'{rows} x {args.context} tokens':<28}{real * 1e3:>9.2f}{priced[0] * 1e3:>10.2f}"
              f"{real / priced[0]:>12.2f}{priced[1] * 1e3:>15.2f}")
    if args.write_profile:
        measured.save(args.write_profile)
        print(f"\nwrote {args.write_profile}: neo.eager_decode_layer_s = {floor * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
