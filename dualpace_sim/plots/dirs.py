"""`dualpace-sim plot`: the figures of a result directory (a run, a sweep, several sweeps
compared), read from its files. The figures themselves are drawn by
:mod:`dualpace_sim.plots.runs`, :mod:`dualpace_sim.plots.sweeps`
and :mod:`dualpace_sim.plots.serving`; this module reads the directories and lays the figures
out, so neither of those needs to know where results live.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dualpace_sim.plots.runs import plot_latency_cdf, plot_timeline
from dualpace_sim.plots.serving import (
    plot_latency_cdfs_by_rate,
    plot_state_over_time,
    plot_throughput_vs_rate,
    plot_utilisation_vs_rate,
)
from dualpace_sim.plots.sweeps import (
    plot_latency_vs_rate,
    plot_p99_vs_rate,
    plot_sensitivity,
    plot_sweep_comparison,
)
from dualpace_sim.plots.tables import default_timeline_rate, series_table
from dualpace_sim.results.metrics import longest_cpu_stall_interval
from dualpace_sim.results.node_series import UTILISATION_KEYS, read_series
from dualpace_sim.results.records import partial_policies, read_records
from dualpace_sim.results.sweep_dir import read_point_summary, read_sweep_dir


@dataclass
class PlotReport:
    """What ``dualpace-sim plot`` made: figure files and lines worth printing."""

    files: list[Path] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def add(self, out_stem: Path) -> None:
        out_stem = Path(out_stem)
        self.files += [out_stem.with_name(out_stem.name + ext) for ext in (".png", ".pdf")]


def _frames_by_policy(records: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {str(p): df.reset_index(drop=True)
            for p, df in records.groupby("policy", sort=False)}


def _stall_lines(frames: dict[str, pd.DataFrame], where: str = "") -> list[str]:
    where = f" {where}" if where else ""
    lines = []
    for policy, df in frames.items():
        interval = longest_cpu_stall_interval(df) if len(df) else None
        if interval is None:
            lines.append(f"longest CPU-resident stall{where}: {policy}: no CPU-produced tokens")
        else:
            start, end = interval
            lines.append(f"longest CPU-resident stall{where}: {policy}: {end - start:.3g} s "
                         f"(no CPU token from t={start:.2f} s to t={end:.2f} s)")
    return lines


def is_run_dir(path: Path | str) -> bool:
    path = Path(path)
    return (path / "requests.parquet").is_file() and (path / "summary.json").is_file()


def plot_run_dir(path: Path | str, out_dir: Path | str | None = None) -> PlotReport:
    """Timeline (with CPU-stall annotation) and latency CDFs of a ``run`` result directory
    (or one sweep point), into ``out_dir`` (default ``path``/plots)."""
    path = Path(path)
    out_dir = Path(out_dir) if out_dir is not None else path / "plots"
    frames = _frames_by_policy(read_records(path / "requests.parquet"))
    report = PlotReport()
    partial = partial_policies(path)
    report.lines += [f"note: {p} is a partial run ({why}): the figures show what it did before "
                     "it stopped" for p, why in partial.items()]
    mark = f" (partial: {', '.join(partial)})" if partial else ""
    plot_timeline(frames, out_dir / "timeline", title=f"{path.name}: token progress{mark}",
                  annotate_stalls=True)
    report.add(out_dir / "timeline")
    plot_latency_cdf(frames, out_dir / "latency_cdf", title=f"{path.name}: latency CDFs")
    report.add(out_dir / "latency_cdf")
    summaries = json.loads((path / "summary.json").read_text())
    report.files += _state_figure(dict.fromkeys(frames, path), summaries,
                                  out_dir / "state_over_time",
                                  f"{path.name}: queues, KV and utilisation over time", report)
    report.lines += _stall_lines(frames)
    return report


def _state_figure(run_dirs: dict[str, Path], summaries: list[dict], out_stem: Path,
                  title: str, report: PlotReport) -> list[Path]:
    """Queues, KV and utilisation over time of each policy
    (`dualpace_sim.results.node_series`), read from ``state.parquet`` and
    ``utilisation.parquet`` in each policy's directory (one for a run, a point's for a sweep);
    a directory without them gets a line saying so."""
    series = {}
    for policy, folder in run_dirs.items():
        found = read_series(folder).get(policy)
        if found is None:
            report.lines.append(f"state_over_time: {folder} has no {policy} state.parquet "
                                "(made by an older version); rerun it to draw queues, KV and "
                                "utilisation over time")
        else:
            series[policy] = found
    if not series:
        return []
    capacities = {s["policy"]: s.get("capacities") or {} for s in summaries
                  if isinstance(s, dict) and "policy" in s}
    return plot_state_over_time(series, capacities, out_stem, title=title)


def plot_sweep_dir(path: Path | str, out_dir: Path | str | None = None,
                   rate: float | None = None) -> PlotReport:
    """All sweep figures of a sweep directory into ``out_dir`` (default ``path``/plots):
    latency_vs_rate, p99_vs_rate and timeline@<rate> (Figure 1 view at ``rate``, default
    :func:`default_timeline_rate`, with each policy's longest CPU stall annotated)."""
    sweep = read_sweep_dir(path)
    out_dir = Path(out_dir) if out_dir is not None else sweep.path / "plots"
    table, targets = sweep.table, sweep.targets
    if table.empty:
        raise ValueError(f"{sweep.path / 'sweep.csv'}: no finished points to plot")
    target = targets["normalized_latency_s"]
    if rate is None:
        rate = default_timeline_rate(table, target)
        at_rate = table[np.isclose(table["rate"], rate)]["normalized_latency_s"]
        how = ("highest rate where every policy meets the normalized-latency target"
               if (at_rate <= target).all() and len(at_rate) == len(sweep.policies) else
               "no rate meets the normalized-latency target for every policy: lowest rate")
    else:
        rate, how = match_rate(sweep.rates, rate), "chosen with --rate"
    report = PlotReport()
    series = series_table(table)
    plot_latency_vs_rate(series, out_dir / "latency_vs_rate", target,
                         title=f"{sweep.name}: normalized latency vs offered load")
    report.add(out_dir / "latency_vs_rate")
    plot_p99_vs_rate(series, out_dir / "p99_vs_rate", targets,
                     title=f"{sweep.name}: tail latencies vs offered load")
    report.add(out_dir / "p99_vs_rate")
    report.files += _serving_figures(sweep, series, out_dir, report)
    if set(table.columns) - set(series.columns) - {"policy", "rate"} or len(series) != len(
            table):
        report.lines.append("timeline: a grid or seed sweep has one per point; plot a point's "
                            f"folder: dualpace-sim plot {sweep.path / 'points' / '<point>'}")
        return report

    frames = {}
    for policy in sweep.policies:
        records = sweep.point_dir(policy, rate) / "requests.parquet"
        if records.is_file():
            frames[policy] = read_records(records)
        else:
            report.lines.append(f"warning: {policy} has no records at {rate:g} req/s; "
                                f"left out of the timeline")
    stem = out_dir / f"timeline@{rate!r}"
    plot_timeline(frames, stem, annotate_stalls=True,
                  title=f"{sweep.name}: token progress at {rate:g} req/s")
    report.add(stem)
    summaries = [read_point_summary(sweep.point_dir(p, rate)) for p in frames]
    report.files += _state_figure({p: sweep.point_dir(p, rate) for p in frames},
                                  [s for s in summaries if s],
                                  out_dir / f"state_over_time@{rate!r}",
                                  f"{sweep.name}: queues, KV and utilisation at {rate:g} req/s",
                                  report)
    report.lines.append(f"timeline at {rate:g} req/s ({how})")
    report.lines += _stall_lines(frames, f"at {rate:g} req/s")
    return report


def _serving_figures(sweep, series: pd.DataFrame, out_dir: Path,
                     report: PlotReport) -> list[Path]:
    """throughput_vs_rate and utilisation_vs_rate from the sweep's table, and, for a plain
    sweep, latency_cdf_by_rate_<policy> from its points' records; a sweep made before these
    columns existed gets a line saying what is missing instead."""

    files: list[Path] = []
    needed = {"output_throughput_tok_s", "request_throughput_req_s", "goodput_req_s",
              *UTILISATION_KEYS}
    missing = sorted(needed - set(series.columns))
    if missing:
        report.lines.append(f"throughput and utilisation figures: sweep.csv has no {missing[0]}"
                            f" (made by an older version); rerun the sweep with --restart")
    else:
        files += plot_throughput_vs_rate(series, out_dir / "throughput_vs_rate",
                                         title=f"{sweep.name}: throughput and goodput")
        files += plot_utilisation_vs_rate(series, out_dir / "utilisation_vs_rate",
                                          title=f"{sweep.name}: engine utilisation")
    for policy in sweep.policies:
        dirs = {r: sweep.point_dir(policy, r) / "requests.parquet" for r in sweep.rates}
        frames = {r: read_records(d) for r, d in dirs.items() if d.is_file()}
        if frames:
            files += plot_latency_cdfs_by_rate(
                frames, out_dir / f"latency_cdf_by_rate_{policy}",
                title=f"{sweep.name}: {policy} latency CDFs at each offered rate")
    return files


def match_rate(rates: list[float], rate: float) -> float:
    """The swept rate equal to ``rate`` (up to float noise); ValueError naming the swept ones."""
    for r in rates:
        if np.isclose(r, rate, rtol=1e-9, atol=1e-12):
            return r
    swept = ", ".join(f"{r:g}" for r in rates)
    raise ValueError(f"--rate {rate:g}: not a swept rate; the sweep has {swept}")


def plot_compare_dirs(paths: list[Path | str], labels: list[str] | None,
                      out_dir: Path | str) -> PlotReport:
    """Several sweep directories in one figure (compare_vs_rate: normalized latency and the
    P99s vs offered rate) and their sustainable rates at the normalized-latency target side by
    side (compare_sustainable), into ``out_dir``. Labels default to the directory names."""

    sweeps = [read_sweep_dir(p) for p in paths]
    labels = list(labels) if labels else [s.path.name for s in sweeps]
    if len(labels) != len(sweeps):
        raise ValueError(f"--label: {len(labels)} labels for {len(sweeps)} directories; give "
                         f"one per directory, in the same order")
    if len(set(labels)) != len(labels):
        raise ValueError("--label: labels must differ (directory names repeat; give --label)")
    out_dir = Path(out_dir)
    targets = sweeps[0].targets
    report = PlotReport()
    for label, s in zip(labels, sweeps, strict=True):
        if s.targets != targets:
            report.lines.append(f"warning: {label} was swept with other targets; the figures "
                                f"show those of {labels[0]}")
    frames = {label: s.table for label, s in zip(labels, sweeps, strict=True)}
    plot_sweep_comparison(frames, out_dir / "compare_vs_rate", targets,
                          title="Latency vs offered load: " + ", ".join(labels))
    report.add(out_dir / "compare_vs_rate")
    plot_sensitivity(frames, "normalized_latency_s", out_dir / "compare_sustainable",
                     "Normalized latency and sustainable rate: " + ", ".join(labels),
                     target=targets["normalized_latency_s"])
    report.add(out_dir / "compare_sustainable")
    return report


# ----------------------------------------------------------------------------- real vs simulated
