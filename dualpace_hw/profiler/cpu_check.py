"""The CPU engine's speed on this host now, against the profile's tables.

The CPU engine's stages stream weights and KV from host memory, and the host's memory speed
moves between machines of one kind and within one machine's lease: on the H200 box the same
served DualPace steps ran 0.94-1.08x the profile's CPU tables in the session that measured
them and 0.75-0.98x in two later sessions (docs/validation/README.md, session 22), while the
streaming read probe (`kernels/host_read.py`) did not follow. So `dualpace-hw run` times the
profiler's own CPU measurements at a few of the profile's grid points before and after each
policy with a CPU engine, on the CPU engine's cores, and records measured/profiled per table
(`cpu_speed` in the summary); `dualpace-sim validate` prices the CPU stages at that speed
(`dualpace_sim.costs.cpu_speed`). The check reads no served request: it is an input of the
comparison, like the profile, not a fit to its outcome.
"""

from __future__ import annotations

import gc
import statistics

import torch

from dualpace_hw.profiler.grids import Grids
from dualpace_hw.profiler.measure import Measurer
from dualpace_hw.profiler.timing import Protocol, Timer
from dualpace_sim.costs.profile import Profile

# The shapes a served CPU step has on the reference box (10-180 rows of 1-4k tokens), as far
# as the profile's grids hold them: only grid points, so each figure meets a measured one.
PRE_ATTN_ROWS = (16, 128)
DECODE_ROWS = (16, 256)
DECODE_TOTALS = (16384, 262144)
# Host memory the check's layer ring and KV windows may each take: far beyond the last-level
# cache (the stages stream from memory, as the profiler's do) and quick to fill.
CHECK_BUDGET = 4 << 30


def within(values: list[float], lo: int, hi: int) -> list[int]:
    """The grid's values in [lo, hi]; where none is, the largest up to hi (else the smallest):
    a tiny test profile's grids hold no serving shape."""
    inside = [int(v) for v in values if lo <= v <= hi]
    if inside:
        return inside
    below = [v for v in values if v <= hi]
    return [int(max(below) if below else min(values))]


def cpu_speed_check(profile: Profile, device: str = "cpu") -> dict | None:
    """None for a roofline profile (its tables are no measurement of a host to compare with).
    Otherwise time `profile`'s CPU pre-attention and decode attention at its grid points in the
    serving range, with the profiler's measurements (its protocol, a layer ring and KV windows
    from memory) on this thread's cores and OpenMP threads (call it on the CPU engine's), and
    return each point's measured and profiled seconds and, per table, the median of their
    ratios (below 1: the CPU engine runs faster than the profile says). `device`: where the
    random weights are drawn (a GPU is quicker)."""
    if profile.provenance.method != "measured":
        return None
    cpu = profile.cpu
    rows = within(cpu.pre_attn.x, *PRE_ATTN_ROWS)
    batches = within(cpu.decode_attn.x, *DECODE_ROWS)
    totals = within(cpu.decode_attn.y, *DECODE_TOTALS)
    quick = profile.provenance.is_quick()
    base = Grids.quick() if quick else Grids.full()
    grids = Grids(gpu_tokens=[1], gpu_rows=[1], prefill_chunks=[1], prefill_contexts=[1],
                  decode_batches=batches, decode_totals=totals,
                  max_request_context=base.max_request_context, cpu_batches=rows)
    timer = Timer(torch.device("cpu"), Protocol.quick() if quick else Protocol())
    m = Measurer(profile.model, torch.device(device), timer, timer, grids, profile.block_size,
                 gpu=False, budget=CHECK_BUDGET)
    points = []
    for b in rows:
        profiled = cpu.pre_attn.y[cpu.pre_attn.x.index(b)]
        points.append({"table": "cpu.pre_attn", "x": b, "measured_s": m.cpu_pre_attn(b),
                       "profiled_s": profiled})
    for b in batches:
        for t in totals:
            profiled = cpu.decode_attn.z[cpu.decode_attn.x.index(b)][cpu.decode_attn.y.index(t)]
            points.append({"table": "cpu.decode_attn", "x": b, "y": t,
                           "measured_s": m.cpu_decode_attn(b, t), "profiled_s": profiled})
    del m
    gc.collect()  # the ring and the windows are gigabytes: gone before the runtime starts
    ratios = {}
    for name in ("pre_attn", "decode_attn"):
        each = [p["measured_s"] / p["profiled_s"] for p in points
                if p["table"] == f"cpu.{name}" and p["profiled_s"] > 0]
        if each:  # a table of zeros has no speed to compare with
            ratios[name] = statistics.median(each)
    return {**ratios, "points": points}
