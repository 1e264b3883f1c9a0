"""Table-by-table comparison of two profiles of one model (say, measured vs roofline): how far
one is off, where, and by how much. This is how users learn to trust, or correct, a roofline."""

from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass

from .model import Interp1D, Interp2D
from .profile import Profile, Table1D, Table2D

TABLES = [
    "gpu.pre_attn", "gpu.post_attn", "gpu.pre_layer", "gpu.post_layer", "gpu.prefill_attn",
    "gpu.decode_attn", "cpu.pre_layer", "cpu.pre_attn", "cpu.post_attn", "cpu.post_layer",
    "cpu.decode_attn", "cpu.assist_write", "cpu.assist_read", "cpu.hidden_write",
    "assist.g_p", "assist.g_lA", "assist.g_lS",
]


@dataclass(frozen=True)
class TableComparison:
    table: str
    points: int  # grid points of the first profile inside the second one's range
    median_ratio: float  # first / second
    min_ratio: float
    max_ratio: float
    worst_at: str  # the grid point of the largest deviation from 1


def _get(profile: Profile, dotted: str):
    section, name = dotted.split(".")
    return getattr(getattr(profile, section), name)


def compare(first: Profile, second: Profile) -> list[TableComparison]:
    """Evaluate `second` at `first`'s grid points (interpolating, never extrapolating)."""
    rows = []
    for name in TABLES:
        a, b = _get(first, name), _get(second, name)
        pairs: list[tuple[str, float, float]] = []
        if isinstance(a, Table1D):
            f = Interp1D(name, b)
            for x, y in zip(a.x, a.y, strict=True):
                if b.x[0] <= x <= b.x[-1]:
                    pairs.append((f"x={x:g}", y, f(x)))
        elif isinstance(a, Table2D):
            f = Interp2D(name, b)
            for i, x in enumerate(a.x):
                for j, y in enumerate(a.y):
                    if b.x[0] <= x <= b.x[-1] and b.y[0] <= y <= b.y[-1]:
                        pairs.append((f"({x:g}, {y:g})", a.z[i][j], f(x, y)))
        ratios = [(where, va / vb) for where, va, vb in pairs if va > 0 and vb > 0]
        if not ratios:
            continue
        values = [r for _, r in ratios]
        worst = max(ratios, key=lambda wr: max(wr[1], 1 / wr[1]))
        rows.append(TableComparison(name, len(values), statistics.median(values), min(values),
                                    max(values), f"{worst[0]}: {worst[1]:.2f}x"))
    return rows


def scalar_comparison(first: Profile, second: Profile
                      ) -> list[tuple[str, float | None, float | None]]:
    """(name, first, second) for the profile's scalar quantities (None: not measured)."""
    out = [
        ("link.h2d_bytes_per_s", first.link.h2d_bytes_per_s, second.link.h2d_bytes_per_s),
        ("link.d2h_bytes_per_s", first.link.d2h_bytes_per_s, second.link.d2h_bytes_per_s),
        ("link.latency_s", first.link.latency_s, second.link.latency_s),
        ("assist.q.p", first.assist.q.p, second.assist.q.p),
        ("assist.o.p", first.assist.o.p, second.assist.o.p),
        ("assist.poll_s", first.assist.poll_s, second.assist.poll_s),
        ("gpu.iteration_overhead_s", first.gpu.iteration_overhead_s,
         second.gpu.iteration_overhead_s),
        ("gpu.eager_layer_s", first.gpu.eager_layer_s, second.gpu.eager_layer_s),
        ("gpu.eager_layer_beside_cpu_s", first.gpu.eager_layer_beside_cpu_s,
         second.gpu.eager_layer_beside_cpu_s),
        ("gpu.kv_capacity_blocks", first.gpu.kv_capacity_blocks, second.gpu.kv_capacity_blocks),
        ("cpu.kv_capacity_blocks", first.cpu.kv_capacity_blocks, second.cpu.kv_capacity_blocks),
        ("neo.launch_s", first.neo.launch_s, second.neo.launch_s),
        ("neo.eager_decode_layer_s", first.neo.eager_decode_layer_s,
         second.neo.eager_decode_layer_s),
        ("neo.eager_prefill_layer_s", first.neo.eager_prefill_layer_s,
         second.neo.eager_prefill_layer_s),
    ]
    return out


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def markdown(first: Profile, second: Profile, first_name: str, second_name: str) -> str:
    """The comparison as a markdown table (ratios are first / second)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = compare(first, second)
    lines = [f"| table | points | median {first_name}/{second_name} | min | max | largest gap at |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r.table} | {r.points} | {r.median_ratio:.2f} | {r.min_ratio:.2f} | "
              f"{r.max_ratio:.2f} | {r.worst_at} |" for r in rows]
    lines += ["", f"| scalar | {first_name} | {second_name} |", "|---|---|---|"]
    lines += [f"| {n} | {_fmt(a)} | {_fmt(b)} |" for n, a, b in scalar_comparison(first, second)
              if (a, b) != (None, None)]
    return "\n".join(lines) + "\n"
