"""The options the benchmarks that set the runtime beside the cost model share: a measured
profile of the box, or a roofline one for smoke runs on any machine; and the CPU steps to time."""

from __future__ import annotations

import argparse

from dualpace_sim.costs import ModelShape, Profile, load_profile, load_spec, synthesize


def add_profile_arguments(ap: argparse.ArgumentParser) -> None:
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--profile", help="a measured profile of this box (its model is used)")
    src.add_argument("--roofline", help="a hardware spec name (with --model), for smoke runs")
    ap.add_argument("--model", default=None, help="model name with --roofline")
    ap.add_argument("--device", default="cuda")


def profile_from(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Profile:
    if args.profile:
        return load_profile(args.profile)
    if not args.model:
        ap.error("--roofline needs --model")
    return synthesize(load_spec(args.roofline), ModelShape.from_name(args.model))


def add_cpu_step_arguments(ap: argparse.ArgumentParser) -> None:
    """The CPU engine's cores and the decode steps to time (batch sizes, context, repeats)."""
    ap.add_argument("--cpu-cores", type=int, default=None,
                    help="cores of the CPU engine (the first N), as `dualpace-hw run` gives it")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--context", type=int, default=1024, help="tokens per request")
    ap.add_argument("--steps", type=int, default=7)
