"""What sampling adds to a decode round, where the round runs.

A served request samples (the OpenAI API's default temperature is 1), so every row of every
decode round is drawn (`dualpace_hw.executors.sampling`). In session 13's served run on the H200
box,
sampling made row by row on the host tripled the GPU engine's decode rounds (18.9 ms against a
5.5 ms model). This times the draw over B rows of the model's
vocabulary on --device, every row sampled (temperature 1; top-p 0.9 with and without top-k 50,
over logits of a trained model's spread and over flat ones), and prints it beside the
profile's decode round of B requests at --context tokens each: the GPU engine's round on cuda,
the CPU engine's step (Full-CPU, all local) on cpu. Judged by the ratio, sampling time over
the round's: at most 0.05.

    python -m benchmarks.kernels.sampling --profile calibration/h200-spr16/llama-3.1-8b.yaml
    python -m benchmarks.kernels.sampling --profile calibration/h200-spr16/llama-3.1-8b.yaml \\
        --device cpu --cpu-cores 14
    python -m benchmarks.kernels.sampling --roofline rtx4090-xeon4510-12c --model tiny-llama \\
        --device cpu --batches 1 4 --rounds 3        # smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.profile_args import add_profile_arguments, profile_from
from dualpace_hw.executors.sampling import SamplingParams, perturb, sample
from dualpace_sim.costs import CostModel

TARGET = 0.05
# (sampling, logits): random logits of a spread like a trained model's (std 4), whose 0.9
# nucleus lies within `sampling.CANDIDATES` tokens, or flat ones (std 0.01), whose nucleus is
# most of the vocabulary, so that top-p sorts whole rows. Temperature alone costs the same on both.
KINDS = {"temperature 1": (SamplingParams(1.0, seed=1), 4.0),
         "top-p 0.9, top-k 50": (SamplingParams(0.8, 0.9, 50, seed=2), 4.0),
         "top-p 0.9": (SamplingParams(0.8, 0.9, seed=3), 4.0),
         "top-p 0.9, flat": (SamplingParams(0.8, 0.9, seed=4), 0.01)}


def perturb_s(b: int, vocab: int, params: SamplingParams, spread: float, device: torch.device,
              rounds: int) -> float:
    """Median time of sampling b rows of bf16 logits as each engine does, the device idle
    after: `sample` on the GPU engine; `perturb`, then the executor's argmax, on the CPU."""
    logits = (torch.randn(b, vocab, device=device) * spread).to(torch.bfloat16)
    times = []
    for i in range(rounds + 2):
        rows = [(params, 100 + i * b + r) for r in range(b)]
        start = time.perf_counter()
        if device.type == "cuda":
            sample(logits, rows)
        else:
            perturb(logits, rows).argmax(dim=-1).tolist()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def round_s(cost: CostModel, device: torch.device, b: int, context: int) -> float:
    """The profile's decode round of b requests: the GPU engine's, or the CPU engine's step."""
    if device.type == "cuda":
        return cost.gpu_forward(b, [], b, b * context)
    return (cost.cpu_pre_layer(b) + cost.cpu_iteration_overhead
            + cost.n_layers * (cost.cpu_layer_local(b, b * context) + cost.cpu_post_attn(b))
            + cost.cpu_post_layer(b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_profile_arguments(ap)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 256])
    ap.add_argument("--context", type=int, default=1024, help="tokens per request")
    ap.add_argument("--cpu-cores", type=int, default=None, help="torch threads on cpu")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    profile = profile_from(ap, args)
    cost = CostModel(profile)
    device = torch.device(args.device)
    if args.cpu_cores:
        torch.set_num_threads(args.cpu_cores)
    vocab = profile.model.vocab_size
    figures: dict[str, dict[str, float]] = {}
    print(f"{'batch':>5}  {'sampling':<20} {'sampling ms':>11} {'round ms':>9} {'ratio':>6}")
    for b in args.batches:
        whole = round_s(cost, device, b, args.context)
        for kind, (params, spread) in KINDS.items():
            took = perturb_s(b, vocab, params, spread, device, args.rounds)
            figures[f"{b} {kind}"] = {"sampling_s": took, "round_s": whole,
                                      "ratio": took / whole}
            print(f"{b:>5}  {kind:<20} {took * 1e3:>11.3f} {whole * 1e3:>9.2f} "
                  f"{took / whole:>6.3f}")
    worst = max(f["ratio"] for f in figures.values())
    print(f"worst ratio {worst:.3f} (target <= {TARGET}): "
          f"{'met' if worst <= TARGET else 'missed'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "vocab": vocab, "figures": figures,
                       "worst_ratio": worst, "target": TARGET}, f, indent=1)


if __name__ == "__main__":
    main()
