"""The profile options the benchmarks that set the runtime beside the cost model share: a
measured profile of the box, or a roofline one for smoke runs on any machine."""

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
