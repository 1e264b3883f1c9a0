"""Appendix B's end-to-end calibration, run by `dualpace-hw profile` once the tables stand.

The handshake microbenchmark (handshake.py) times a Dense Assist through the control block
with the GPU idle. In serving, an assist also waits for the busy GPU engine to reach a stage
boundary, and its CUDA work and host launch run beside the GPU engine's own: on the H200 box
an assist served at 3 req/s waited 0.23 ms and took 0.2 ms of host time where the handshake
measured 2 us and 1 us (docs/validation/README.md). So the profiler serves a short DualPace
workload on the box with the runtime and takes q_x and o_x from its assists
(`dualpace_sim.costs.calibrate`: Q = mean [W - G]+, O = mean (L + F) per path and batch-row
group, groups weighted equally), then fits the controls with them.

The workload (`CalibrationWorkload`): the embedded Azure-Conversation length tables (offline,
seed 0), prompts and outputs clipped, Poisson arrivals fast enough that the CPU batch grows
through many of the profiled batch sizes, and an HBM KV pool capped so that most requests
decode on the CPU engine. It is served twice, because one route never makes all three paths:

* routes (0, 0): every CPU step is Fused-Assist (path p at each layer but the last, lA there);
* routes (P, F) = (cpu_batch_limit, 0): every step is Split-Final (lS once per step).

Each pass is an ordinary run directory (`<profile stem>-calibration/<pass>/`, with its
`assists-dualpace.csv`), named in the profile's `assist.calibration.runs`, so
`dualpace-sim profile calibrate PROFILE --run DIR` recomputes the calibration from them and
`dualpace-sim validate` can check the passes like any real run. A pass that finished is reused
when an interrupted profile resumes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from dualpace_hw.serving.serve import run_real
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.costs.calibrate import (
    ASSISTS_FILE,
    calibrate,
    run_assist_calls,
    with_calibration,
)
from dualpace_sim.costs.fit import profile_batch_sizes
from dualpace_sim.costs.profile import Profile
from dualpace_sim.costs.record_csv import record_file
from dualpace_sim.results.served_rounds import (
    PASS_SCENARIO,
    served_round_overhead,
    served_rounds,
    with_served_overhead,
)

CALIBRATION_PROFILE = "profile.yaml"  # the profile each pass's scenario is priced with


@dataclass(frozen=True)
class CalibrationWorkload:
    """What the calibration serves (module docstring); `full` on a real box, `quick` in tests."""

    requests: int
    rate: float  # req/s, Poisson
    max_prompt_tokens: int
    max_output_tokens: int
    gpu_kv_tokens: int  # the HBM pool cap, in tokens: a few requests' worth
    host_kv_tokens: int

    @classmethod
    def full(cls) -> CalibrationWorkload:
        # 96 conversation requests arriving over ~12 s: the CPU batch climbs to tens of rows
        # and drains, passing through the small and the mid-size batch-row groups; 4,096 HBM
        # tokens are the CPU-busy validation set's cap (docs/validation/cpu-busy/).
        return cls(requests=96, rate=8.0, max_prompt_tokens=1024, max_output_tokens=128,
                   gpu_kv_tokens=4096, host_kv_tokens=131072)

    @classmethod
    def quick(cls) -> CalibrationWorkload:
        return cls(requests=10, rate=5000.0, max_prompt_tokens=40, max_output_tokens=12,
                   gpu_kv_tokens=128, host_kv_tokens=4096)

    def describe(self) -> str:
        return (f"{self.requests} requests of the embedded Azure-Conversation length tables "
                f"(seed 0), prompts <= {self.max_prompt_tokens} and outputs <= "
                f"{self.max_output_tokens} tokens, Poisson at {self.rate:g} req/s, the HBM KV "
                f"pool capped at {self.gpu_kv_tokens} tokens")


@dataclass(frozen=True)
class CalibrationPass:
    name: str
    route_p: int
    route_f: int


def passes(largest_cpu_batch: int) -> list[CalibrationPass]:
    """Fused-Assist (paths p and lA), then Split-Final (path lS) for every batch the CPU
    engine can form (C, `SchedulerConfig.largest_cpu_batch`)."""
    return [CalibrationPass("fused-assist", 0, 0),
            CalibrationPass("split-final", max(largest_cpu_batch, 1), 0)]


def calibration_dir(profile_path: Path) -> Path:
    return profile_path.with_name(profile_path.stem + "-calibration")


def pass_scenario(folder: Path, profile: Profile, work: CalibrationWorkload,
                  step: CalibrationPass) -> Path:
    """The pass's scenario file, priced with `profile` (saved beside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    profile.save(folder / CALIBRATION_PROFILE)
    bs = profile.block_size
    spec = {
        "name": f"appendix-b-calibration-{step.name}",
        "description": f"Appendix B calibration pass ({step.name}): {work.describe()}",
        "profile": CALIBRATION_PROFILE,
        "policies": ["dualpace"],
        "scheduler": {"gpu_kv_blocks": max(1, work.gpu_kv_tokens // bs),
                      "host_kv_blocks": max(1, work.host_kv_tokens // bs),
                      "route_p": step.route_p, "route_f": step.route_f},
        "workload": {"source": "default", "trace": "conv", "num_requests": work.requests,
                     "arrival": "poisson", "rate": work.rate, "seed": 0,
                     "max_prompt_tokens": work.max_prompt_tokens,
                     "max_output_tokens": work.max_output_tokens},
    }
    path = folder / PASS_SCENARIO
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def finished(run_dir: Path) -> bool:
    """Whether a pass's run directory holds a whole run (so a resumed profile reuses it)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return record_file(run_dir, ASSISTS_FILE, "dualpace").is_file() and bool(summary) \
        and not any(s.get("partial") for s in summary)


def serve_passes(profile: Profile, profile_path: Path, work: CalibrationWorkload,
                 device: str, cpu_cores: int | None, cpu_tp: int = 1, gpu_tp: int = 1
                 ) -> list[Path]:
    """Run (or reuse) each pass; returns their run directories."""
    root = calibration_dir(profile_path)
    first = passes(1)[0]  # C, the largest CPU batch, does not depend on the routes
    largest = load_scenario(pass_scenario(root / first.name, profile, work, first)
                            ).config.largest_cpu_batch
    runs = []
    for step in passes(largest):
        folder = root / step.name
        run_dir = folder / "run"
        if not finished(run_dir):
            loaded = load_scenario(pass_scenario(folder, profile, work, step))
            print(f"calibration: serving the {step.name} pass ({work.describe()})", flush=True)
            run_real(loaded, run_dir, device=device, cpu_cores=cpu_cores, cpu_tp=cpu_tp,
                     gpu_tp=gpu_tp)
        runs.append(run_dir)
    return runs


def calibrated(profile: Profile, runs: Sequence[Path], profile_path: Path,
               work: CalibrationWorkload) -> Profile:
    """`profile` with q_x, o_x from the passes' assists and the GPU iteration overhead from
    their served decode rounds (`dualpace_sim.results.served_rounds`), the runs named relative to
    the
    profile's folder (where the committed profile and its calibration live together)."""
    calls = [c for d in runs for c in run_assist_calls(d)]
    cal = calibrate(calls, profile_batch_sizes(profile))
    names = [_relative(d, profile_path.parent) for d in runs]
    out = with_calibration(profile, cal, names, workload=work.describe())
    rounds = [r for d in runs  # each pass priced with the profile it ran with
              for r in served_rounds(load_scenario(d.parent / PASS_SCENARIO), d, "dualpace")]
    overhead = served_round_overhead(rounds, names)
    return out if overhead is None else with_served_overhead(out, overhead)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)
