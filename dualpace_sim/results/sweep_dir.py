"""A sweep directory's layout, and reading a sweep back.

Where each point of a sweep lives (``DIR/points/<policy>@<rate>[,<key>=<value>...]/``), the
columns of ``sweep.csv``, and what reads a finished sweep (plots, studies, comparisons). Kept
apart from :mod:`dualpace_sim.experiments.sweep`, which runs the simulator, so that a reader of
results
(:mod:`dualpace_sim.plots.sweeps`) needs nothing that simulates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dualpace_sim.config.overrides import Setting, setting_text
from dualpace_sim.config.scenario import Targets

# The metrics that have a target, in the order tables show them.
TARGET_METRICS = ("normalized_latency_s", "p99_ttft_s", "p99_itl_s", "p99_tpot_s")

# sweep.csv columns: the point, then the headline metrics, then the rest of summarize().
SWEEP_COLUMNS = (
    "policy", "rate", "normalized_latency_s", "p99_ttft_s", "p99_itl_s", "p99_tpot_s",
    "throughput_tok_s", "completed", "submitted", "cpu_token_fraction", "mean_ttft_s",
    "p50_ttft_s", "makespan_s", "longest_cpu_stall_s",
)


def point_name(policy: str, rate: float, setting: Setting = ()) -> str:
    """Folder name of one point: ``<policy>@<rate>`` with the rate's shortest exact repr,
    then the grid's setting, if any: ``dualpace@2.0,scheduler.host_kv_blocks=1024``."""
    name = f"{policy}@{float(rate)!r}"
    return f"{name},{setting_text(setting)}".replace("/", "%2F") if setting else name


def point_dir(out: Path | str, policy: str, rate: float, setting: Setting = ()) -> Path:
    return Path(out) / "points" / point_name(policy, rate, setting)


def read_point_summary(pdir: Path) -> dict | None:
    """The summary of a finished point (its summary.json holds a list of one, the shape of
    `run`'s); None when the point is not finished or the file is not a summary."""
    path = pdir / "summary.json"
    if not path.is_file():
        return None
    try:
        entries = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return entries[0] if isinstance(entries, list) and entries and isinstance(
        entries[0], dict) else None


def grid_columns(table: pd.DataFrame) -> list[str]:
    """The grid keys of a sweep.csv frame (the columns between ``rate`` and the metrics)."""
    start, stop = list(table.columns).index("rate") + 1, list(table.columns).index(
        SWEEP_COLUMNS[2])
    return list(table.columns[start:stop])


@dataclass
class SweepDir:
    """A finished (or partly finished) sweep directory, for plots and comparisons."""

    path: Path
    name: str
    table: pd.DataFrame
    targets: dict[str, float]

    def point_dir(self, policy: str, rate: float) -> Path:
        return point_dir(self.path, policy, rate)

    @property
    def rates(self) -> list[float]:
        return sorted(set(self.table["rate"].astype(float)))

    @property
    def policies(self) -> list[str]:
        return list(dict.fromkeys(self.table["policy"]))


def is_sweep_dir(path: Path | str) -> bool:
    return (Path(path) / "sweep.csv").is_file()


def read_sweep_dir(path: Path | str) -> SweepDir:
    """Read sweep.csv and the targets and name from sweep.json (paper targets if it is gone)."""
    path = Path(path)
    table = pd.read_csv(path / "sweep.csv")
    missing = [c for c in ("policy", "rate", *TARGET_METRICS) if c not in table.columns]
    if missing:
        raise ValueError(f"{path / 'sweep.csv'}: no column {missing[0]!r}; not a sweep.csv")
    table["policy"] = table["policy"].astype(str)
    meta_path = path / "sweep.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    targets = {**Targets().model_dump(), **(meta.get("targets") or {})}
    return SweepDir(path, meta.get("name", path.name), table, targets)
