"""A sweep's figures from its table (sweep.csv, one row per policy and offered rate): latency
and the P99 metrics against the offered rate with their targets and sustainable rates, several
sweeps overlaid, and the sustainable rate per setting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dualpace_sim.plots.layout import (
    log_if_decades,
    new_figure,
    policy_colors,
    save_figure,
    setting_colors,
)
from dualpace_sim.results.metrics import sustainable_rate

# (panel title, axis label) of each metric a sweep reports.
# Mathtext, as the paper's Figure 7 sets them: P with a subscript, s token^-1.
METRIC_LABELS = {
    "normalized_latency_s": ("Normalized latency", r"normalized latency (s token$^{-1}$)"),
    "p99_ttft_s": (r"$P_{99}$ TTFT", r"$P_{99}$ time to first token (s)"),
    "p99_itl_s": (r"$P_{99}$ ITL", r"$P_{99}$ inter-token latency (s)"),
    "p99_tpot_s": (r"$P_{99}$ TPOT", r"$P_{99}$ time per output token (s)"),
    "throughput_tok_s": ("Throughput", "output throughput (tokens/s)"),
    "cpu_token_fraction": ("CPU-decoded share", "fraction of tokens decoded on the CPU"),
    "longest_cpu_stall_s": ("Longest CPU stall", "longest gap in CPU progress (s)"),
}
METRIC_UNITS = {"normalized_latency_s": r"s token$^{-1}$", "throughput_tok_s": "tokens/s",
                "cpu_token_fraction": ""}
P99_METRICS = ("p99_ttft_s", "p99_itl_s", "p99_tpot_s")
RATE_LABEL = "offered load (req/s)"


def plot_latency_vs_rate(table: pd.DataFrame, out_stem: Path, target: float | None = None,
                         *, title: str | None = None) -> None:
    """Normalized latency vs offered rate, one line per policy (a sweep.csv frame), with the
    target as a dashed line and each policy's sustainable rate as a dotted vertical line."""
    fig = new_figure((6.5, 4.5))
    ax = fig.subplots()
    _metric_panel(ax, table, "normalized_latency_s", target, mark_sustainable=True)
    ax.set_title(title or "Normalized latency vs offered load")
    save_figure(fig, out_stem)

def plot_p99_vs_rate(table: pd.DataFrame, out_stem: Path, targets: dict[str, float] | None = None,
                     *, title: str | None = None) -> None:
    """P99 TTFT, P99 ITL and P99 TPOT vs offered rate (three panels), with target lines."""
    targets = targets or {}
    fig = new_figure((15, 4.5))
    for ax, metric in zip(fig.subplots(1, 3), P99_METRICS, strict=True):
        _metric_panel(ax, table, metric, targets.get(metric), mark_sustainable=True)
    if title:
        fig.suptitle(title)
    save_figure(fig, out_stem)

def plot_sweep_comparison(frames_by_label: dict[str, pd.DataFrame], out_stem: Path,
                          targets: dict[str, float] | None = None, *,
                          title: str | None = None) -> None:
    """Several sweeps in one figure: normalized latency and the three P99 metrics vs offered rate
    (2×2 panels), one colour per sweep, one line style per policy, target lines dashed."""
    targets = targets or {}
    fig = new_figure((12, 8.5))
    axes = fig.subplots(2, 2).ravel()
    metrics = ("normalized_latency_s", *P99_METRICS)
    for ax, metric in zip(axes, metrics, strict=True):
        _overlay_panel(ax, frames_by_label, metric, targets.get(metric))
    if title:
        fig.suptitle(title)
    save_figure(fig, out_stem)

def plot_sensitivity(frames_by_setting: dict[str, pd.DataFrame], metric: str, out_stem: Path,
                     title: str, target: float | None = None) -> None:
    """Overlay sweeps taken under different settings (e.g. host KV 30/60/120/240 GiB).

    Left: ``metric`` vs offered rate, one colour per setting (in the given order), one line style
    per policy, ``target`` dashed. Right, when a target is given: the sustainable request rate at
    that target per setting and policy; a hatched bar reaching the top of the sweep means
    "above the sweep", an empty slot marked "<" means "below the sweep".
    """
    fig = new_figure((13, 4.8) if target is not None else (7, 4.8))
    axes = fig.subplots(1, 2 if target is not None else 1)
    axes = np.atleast_1d(axes)
    _overlay_panel(axes[0], frames_by_setting, metric, target)
    if target is not None:
        _sustainable_bars(axes[1], frames_by_setting, metric, target)
    fig.suptitle(title)
    save_figure(fig, out_stem)

def _metric_panel(ax, table: pd.DataFrame, metric: str, target: float | None,
                  mark_sustainable: bool) -> None:
    """``metric`` vs rate, one line per policy (or series: :func:`series_table`), its
    confidence band where the table has one, the target as a labelled dashed line and each
    sustainable rate dotted, named in the title so that no legend covers the data."""
    name, ylabel = METRIC_LABELS.get(metric, (metric, metric))
    policies = list(dict.fromkeys(table["policy"]))
    colors = policy_colors(policies)
    values, sustainable = [], []
    for policy in policies:
        rows = table[table["policy"] == policy].sort_values("rate")
        rates = rows["rate"].to_numpy(float)
        y = rows[metric].to_numpy(float)
        values.append(y)
        if mark_sustainable and target is not None and len(rates):
            rate = sustainable_rate(rates, y, target)
            sustainable.append(f"{policy} {_rate_text(rate, rates)}")
            if isinstance(rate, float):
                ax.axvline(rate, color=colors[policy], ls=":", lw=1.2)
        ax.plot(rates, y, marker="o", ms=4, color=colors[policy], label=policy)
        draw_band(ax, rows, metric, colors[policy])
    if target is not None:
        _target_line(ax, metric, target)
        values.append(np.array([target]))
    log_if_decades(ax, values)
    title = name if not sustainable else (f"{name}\n" + r"sustainable (req s$^{-1}$): "
                                          + ", ".join(sustainable))
    ax.set(xlabel=RATE_LABEL, ylabel=ylabel)
    ax.set_title(title, fontsize="medium")

def draw_band(ax, rows: pd.DataFrame, metric: str, color) -> None:
    """The 95% interval over seeds of ``metric`` as a shaded band, when ``rows`` has one."""
    low, high = f"{metric}_ci_low", f"{metric}_ci_high"
    if low in rows.columns:
        ax.fill_between(rows["rate"].to_numpy(float), rows[low].to_numpy(float),
                        rows[high].to_numpy(float), color=color, alpha=0.2, lw=0)

def _overlay_panel(ax, frames: dict[str, pd.DataFrame], metric: str,
                   target: float | None) -> None:
    name, ylabel = METRIC_LABELS.get(metric, (metric, metric))
    ramp = setting_colors(list(frames))
    policies = list(dict.fromkeys(p for t in frames.values() for p in t["policy"]))
    styles = dict(zip(policies, ["-", "--", "-.", ":"] * 4, strict=False))
    markers = dict(zip(policies, ["o", "s", "^", "D"] * 4, strict=False))
    values = []
    for setting, table in frames.items():
        for policy in policies:
            rows = table[table["policy"] == policy].sort_values("rate")
            if rows.empty:
                continue
            y = rows[metric].to_numpy(float)
            values.append(y)
            label = setting if len(policies) == 1 else f"{setting} / {policy}"
            ax.plot(rows["rate"].to_numpy(float), y, ls=styles[policy], marker=markers[policy],
                    ms=4, color=ramp[setting], label=label)
    if target is not None:
        _target_line(ax, metric, target)
        values.append(np.array([target]))
    log_if_decades(ax, values)
    ax.set(xlabel=RATE_LABEL, ylabel=ylabel, title=name)

def _sustainable_bars(ax, frames: dict[str, pd.DataFrame], metric: str, target: float) -> None:
    settings = list(frames)
    policies = list(dict.fromkeys(p for t in frames.values() for p in t["policy"]))
    colors = policy_colors(policies)
    width = 0.8 / max(len(policies), 1)
    for j, policy in enumerate(policies):
        for i, setting in enumerate(settings):
            rows = frames[setting]
            rows = rows[rows["policy"] == policy].sort_values("rate")
            if rows.empty:
                continue
            rates = rows["rate"].to_numpy(float)
            rate = sustainable_rate(rates, rows[metric].to_numpy(float), target)
            x = i - 0.4 + width * (j + 0.5)
            label = policy if i == 0 else None
            if isinstance(rate, float):
                ax.bar(x, rate, width, color=colors[policy], label=label)
                ax.annotate(f"{rate:.3g}", (x, rate), ha="center", va="bottom", fontsize=8)
            elif rate == "above_sweep":
                ax.bar(x, rates[-1], width, color=colors[policy], alpha=0.5, hatch="//",
                       label=label)
                ax.annotate(f"> {rates[-1]:g}", (x, rates[-1]), ha="center", va="bottom",
                            fontsize=8)
            else:
                ax.bar(x, 0, width, color=colors[policy], label=label)
                ax.annotate(f"< {rates[0]:g}", (x, 0), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(settings)), settings)
    name = METRIC_LABELS.get(metric, (metric,))[0]
    unit = METRIC_UNITS.get(metric, "s")
    ax.set(ylabel="sustainable request rate (req/s)",
           title=f"Sustainable rate at {name} \u2264 {target:g} {unit}".rstrip())
    ax.margins(y=0.12)

def _target_line(ax, metric: str, target: float) -> None:
    """The target as a dashed line labelled at its right end (not in the legend, which every
    panel shares)."""
    ax.axhline(target, color="0.3", ls="--", lw=1.2)
    ax.annotate(_target_label(metric, target), (1, target),
                xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points",
                ha="right", va="bottom", fontsize="small", color="0.3")

def _target_label(metric: str, target: float) -> str:
    return f"target {target:g} {METRIC_UNITS.get(metric, 's')}".rstrip()

def _rate_text(rate: float | str, rates: np.ndarray) -> str:
    if rate == "above_sweep":
        return f"> {rates.max():g}"
    if rate == "below_sweep":
        return f"< {rates.min():g}"
    return f"{rate:.3g}"
