"""The CPU engine's stages priced at the speed a real run measured its host at.

The host's memory speed moves between machines of one kind and within a lease, and the CPU
engine's stages follow it (they stream weights and KV): served DualPace steps on the H200 box
ran 0.94-1.08x the profile's CPU tables in the session that measured them and 0.75-0.98x in
two later ones. A profile made in one session then mis-prices runs served in another by as
much, whatever the simulator gets right. `dualpace-hw run` therefore times the profiler's own
CPU measurements at a few grid points before and after each policy with a CPU engine (its
summary's `cpu_speed`: each point's shape and measured seconds), and `dualpace-sim validate`
prices the run with the CPU tables scaled by measured/tabled (`at_cpu_speed`). The check reads
no served request, so it is an input of the comparison (like the profile), not a fit to it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from dualpace_sim.costs.model import CostModel
from dualpace_sim.costs.profile import Profile, Table1D, Table2D

# The CPU tables that stream the layer's weights (scaled as pre-attention measured) and the
# one that streams the KV (as decode attention measured). The Assist Buffer copies and the
# iteration overhead are small and stay as tabled.
DENSE_TABLES = ("pre_layer", "pre_attn", "post_attn", "post_layer")
CHECKS = ("start", "end")


class CpuSpeedError(ValueError):
    """A run's `cpu_speed` record that cannot be read; the message names the field."""


@dataclass(frozen=True)
class CpuSpeed:
    """measured / tabled for the CPU engine's dense stages and its decode attention, each the
    mean over the run's checks (start-up, and the end where the run finished) of the median
    over the check's points."""

    dense: float
    attention: float
    checks: int

    def line(self) -> str:
        return (f"{self.dense:.2f}x the profile's CPU dense stages and {self.attention:.2f}x "
                f"its decode attention ({self.checks} check(s))")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value) or value <= 0:
        raise CpuSpeedError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def _check_ratios(check: Any, cost: CostModel, where: str) -> dict[str, list[float]]:
    """Each point of one check as measured / what `cost` prices it at, by table."""
    if not isinstance(check, dict) or not isinstance(check.get("points"), list):
        raise CpuSpeedError(f"{where}: expected a mapping with a list of points")
    ratios: dict[str, list[float]] = {"cpu.pre_attn": [], "cpu.decode_attn": []}
    for i, point in enumerate(check["points"]):
        at = f"{where}.points[{i}]"
        if not isinstance(point, dict) or point.get("table") not in ratios:
            raise CpuSpeedError(f"{at}: expected a point of cpu.pre_attn or cpu.decode_attn")
        measured = _number(point.get("measured_s"), f"{at}.measured_s")
        x = _number(point.get("x"), f"{at}.x")
        if point["table"] == "cpu.pre_attn":
            priced = cost.cpu_pre_attn(int(x))
        else:
            priced = cost.cpu_decode_attn(int(x), int(_number(point.get("y"), f"{at}.y")))
        if priced > 0:
            ratios[point["table"]].append(measured / priced)
    return ratios


def cpu_speed(record: Any, profile: Profile, where: str = "cpu_speed") -> CpuSpeed | None:
    """The speed a run's `cpu_speed` record says its CPU engine ran at against `profile` (the
    costs that price the run, which may be another than the one it ran with: the ratios are
    taken against its tables), or None where the record has no point of either table."""
    if not isinstance(record, dict):
        raise CpuSpeedError(f"{where}: expected a mapping of checks ({', '.join(CHECKS)})")
    cost = CostModel(profile)
    dense, attention = [], []
    for name in CHECKS:
        if name not in record:
            continue
        ratios = _check_ratios(record[name], cost, f"{where}.{name}")
        if ratios["cpu.pre_attn"] and ratios["cpu.decode_attn"]:
            dense.append(statistics.median(ratios["cpu.pre_attn"]))
            attention.append(statistics.median(ratios["cpu.decode_attn"]))
    if not dense:
        return None
    return CpuSpeed(statistics.fmean(dense), statistics.fmean(attention), len(dense))


def _scaled(table: Table1D | Table2D, factor: float) -> Table1D | Table2D:
    if isinstance(table, Table1D):
        return table.model_copy(update={"y": [v * factor for v in table.y]})
    return table.model_copy(update={"z": [[v * factor for v in row] for row in table.z]})


def at_cpu_speed(profile: Profile, speed: CpuSpeed) -> Profile:
    """`profile` with its CPU dense stages and decode attention scaled to `speed`; its
    controls, GPU and assist costs untouched (the run's scheduler decided with them)."""
    cpu = profile.cpu
    update: dict[str, Table1D | Table2D] = {
        name: _scaled(getattr(cpu, name), speed.dense) for name in DENSE_TABLES}
    update["decode_attn"] = _scaled(cpu.decode_attn, speed.attention)
    return profile.model_copy(update={"cpu": cpu.model_copy(update=update)})
