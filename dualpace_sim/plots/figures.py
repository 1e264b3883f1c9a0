"""Paper-style figures from per-request records (one records frame per policy).

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas rather than pyplot, so
plotting never touches global state or needs a display, and each figure is freed when done. PDFs
are written without a creation date so reruns give identical files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dualpace_sim.results.metrics import (
    itl_values,
    longest_cpu_stall_interval,
    sustainable_rate,
    token_timeline,
    ttft_values,
)
from dualpace_sim.results.sweep_dir import grid_columns
from dualpace_sim.results.token_spans import TokenSpans

CDF_MAX_POINTS = 2000


def plot_timeline(frames: dict[str, pd.DataFrame], out_stem: Path, *, title: str | None = None,
                  annotate_stalls: bool = False,
                  tokens: Mapping[str, TokenSpans] | None = None) -> None:
    """Cumulative generated tokens (left) and cumulative CPU-decoded tokens (right) over time,
    one line per policy, like the paper's Figure 1 (top). Writes ``out_stem``.png and .pdf.
    A run passes its policies' token spans as ``tokens`` (then ``frames`` need no token
    columns); without them they are read off the frames.

    With ``annotate_stalls`` the CPU panel also shades each policy's longest gap in CPU-resident
    progress (:func:`dualpace_sim.results.metrics.longest_cpu_stall`) and gives its length in the
    legend.
    """
    fig, (total_ax, cpu_ax) = _figure()
    colors = policy_colors(frames)
    spans = {p: tokens[p] if tokens is not None else TokenSpans.from_frame(df)
             for p, df in frames.items()}
    any_cpu = any(s.cpu_tokens() for s in spans.values())
    for policy, df in frames.items():
        timeline = token_timeline(df, tokens=spans[policy])
        color = colors[policy]
        total_ax.plot(timeline["time_s"], timeline["total_tokens"], label=policy, color=color)
        if any_cpu:
            cpu_ax.plot(timeline["time_s"], timeline["cpu_tokens"], color=color)
        if annotate_stalls and len(df) and any_cpu:
            interval = longest_cpu_stall_interval(df, spans[policy])
            if interval is None:
                cpu_ax.plot([], [], " ", label=f"{policy}: no CPU-produced tokens")
            else:
                start, end = interval
                cpu_ax.axvspan(start, end, color=color, alpha=0.18, lw=0,
                               label=f"{policy}: longest CPU stall {end - start:.3g} s "
                                     f"({start:.0f}\u2013{end:.0f} s)")
    total_ax.set(xlabel="time (s)", ylabel="generated tokens (cumulative)",
                 title="Generated tokens")
    cpu_ax.set(xlabel="time (s)", ylabel="CPU-decoded tokens (cumulative)",
               title="CPU-resident decoded tokens")
    if not any_cpu:
        say_empty(cpu_ax, "no CPU-decoded tokens")
    if title:
        fig.suptitle(title)
    save_figure(fig, out_stem)


def say_empty(ax, text: str) -> None:
    """An empty panel that says why, instead of a flat line on a meaningless axis."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.35")
    ax.set_yticks([])


def plot_latency_cdf(frames: dict[str, pd.DataFrame], out_stem: Path, *,
                     title: str | None = None) -> None:
    """CDFs of TTFT (left) and inter-token latency (right), one line per policy; log-scaled x
    where the latencies span decades."""
    fig, (ttft_ax, itl_ax) = _figure()
    colors = policy_colors(frames)
    ttfts, itls = [], []
    for policy, df in frames.items():
        ttft, itl = ttft_values(df), itl_values(df)
        ttft_ax.plot(*empirical_cdf(ttft), label=policy, color=colors[policy])
        itl_ax.plot(*empirical_cdf(itl), label=policy, color=colors[policy])
        ttfts.append(ttft)
        itls.append(itl)
    _finish_cdf_axes(fig, ttft_ax, itl_ax, ttfts, itls, title)
    save_figure(fig, out_stem)


# ----------------------------------------------------------------------------- sweeps

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
LOG_SPAN = 30.0  # use a log axis when the plotted values span more than this factor

# Fixed colours for the known policies, so a policy looks the same in every figure.
POLICY_COLORS = {"dualpace": "C0", "vllm": "C1", "neo": "C2"}


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


def default_timeline_rate(table: pd.DataFrame, target: float) -> float:
    """The highest swept rate at which every policy meets the normalized-latency target, else
    the lowest swept rate."""
    rates = sorted(set(table["rate"].astype(float)))
    policies = set(table["policy"])
    best = None
    for rate in rates:
        rows = table[np.isclose(table["rate"].astype(float), rate)]
        ok = rows[rows["normalized_latency_s"].astype(float) <= target]
        if set(ok["policy"]) >= policies:
            best = rate
    return rates[0] if best is None else best


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


def series_table(table: pd.DataFrame) -> pd.DataFrame:
    """A sweep.csv frame ready to plot: each grid setting a series of its own (``policy``
    becomes ``dualpace, scheduler.host_kv_blocks=1024``), and several seeds folded into their
    mean with ``<metric>_ci_low`` / ``_ci_high`` (:func:`variance.mean_ci`) columns."""
    from dualpace_sim.results.variance import SEED_KEY, mean_ci

    keys = grid_columns(table)
    grid = [k for k in keys if k != SEED_KEY]
    table = table.copy()
    if grid:
        table["policy"] = [", ".join([str(row["policy"]), *(f"{k}={row[k]}" for k in grid)])
                           for _, row in table.iterrows()]
    metrics = [c for c in table.columns if c not in ("policy", "rate", *keys)]
    if SEED_KEY not in keys:
        return table.drop(columns=grid)
    rows = []
    for (policy, rate), points in table.groupby(["policy", "rate"], sort=False):
        row = {"policy": policy, "rate": rate}
        for metric in metrics:
            row[metric], row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = mean_ci(
                points[metric].to_numpy(float))
        rows.append(row)
    return pd.DataFrame(rows)


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


def policy_colors(policies) -> dict[str, str]:
    """Known policies keep their colour; others take the next unused ones of the cycle."""
    policies = list(policies)
    used = {POLICY_COLORS[p] for p in policies if p in POLICY_COLORS}
    spare = (f"C{i}" for i in range(3, 100) if f"C{i}" not in used)
    return {p: POLICY_COLORS.get(p) or next(spare) for p in policies}


def setting_colors(settings: list[str]) -> dict[str, tuple]:
    """Ordered settings (e.g. growing host KV) as a sequential colour ramp."""
    from matplotlib import colormaps

    ramp = colormaps["viridis"]
    n = len(settings)
    return {s: ramp(0.85 * i / max(n - 1, 1)) for i, s in enumerate(settings)}


def log_if_decades(ax, arrays, axis: str = "y") -> None:
    """Log-scale ``axis`` when its positive finite values span more than ``LOG_SPAN``."""
    finite = [np.asarray(a, dtype=float) for a in arrays if np.size(a)]
    if not finite:
        return
    values = np.concatenate(finite)
    values = values[np.isfinite(values) & (values > 0)]
    if values.size and values.max() / values.min() > LOG_SPAN:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")


def new_figure(size: tuple[float, float]) -> Figure:
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _figure() -> tuple[Figure, tuple]:
    fig = new_figure((10, 4))
    return fig, tuple(fig.subplots(1, 2))


def empirical_cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF, sampled at most ``CDF_MAX_POINTS`` order statistics to keep PDFs small."""
    values = np.sort(values)
    fraction = np.arange(1, values.size + 1) / max(values.size, 1)
    if values.size > CDF_MAX_POINTS:
        pick = np.linspace(0, values.size - 1, CDF_MAX_POINTS).round().astype(int)
        values, fraction = values[pick], fraction[pick]
    return values, fraction


def save_figure(fig: Figure, out_stem: Path) -> list[Path]:
    """Grid, one legend for the whole figure (every label once, below the panels, where it
    covers no data), then ``out_stem``.png and .pdf; returns the two paths."""
    handles: dict[str, object] = {}
    for ax in fig.axes:
        ax.grid(True, alpha=0.3)
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncols=min(len(handles), 4), fontsize="small")
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    png = out_stem.with_name(out_stem.name + ".png")
    pdf = out_stem.with_name(out_stem.name + ".pdf")
    fig.savefig(png, dpi=150)
    fig.set_layout_engine("none")  # keep the layout just computed: the PDF needs no second pass
    fig.savefig(pdf, metadata={"CreationDate": None})
    return [png, pdf]


def plot_timeline_overlay(real: dict[str, pd.DataFrame], simulated: dict[str, pd.DataFrame],
                          out_stem: Path, *, title: str | None = None) -> list[Path]:
    """Cumulative generated tokens (left) and cumulative CPU-decoded tokens (right) of a real
    run (solid) and its simulation (dashed), one colour per policy. Time is counted from each
    run's first arrival, so a runtime whose clock starts elsewhere still lines up. Writes
    ``out_stem``.png and .pdf and returns their paths."""
    fig, (total_ax, cpu_ax) = _figure()
    colors = policy_colors(dict.fromkeys([*real, *simulated]))
    for kind, frames, ls in (("real", real, "-"), ("simulated", simulated, "--")):
        for policy, df in frames.items():
            if not len(df):
                continue
            timeline = token_timeline(df)
            t = timeline["time_s"] - float(df["arrival_s"].min())
            style = dict(color=colors[policy], ls=ls, label=f"{policy} ({kind})")
            total_ax.plot(t, timeline["total_tokens"], **style)
            cpu_ax.plot(t, timeline["cpu_tokens"], **style)
    total_ax.set(xlabel="time since first arrival (s)", ylabel="generated tokens (cumulative)",
                 title="Generated tokens")
    cpu_ax.set(xlabel="time since first arrival (s)", ylabel="CPU-decoded tokens (cumulative)",
               title="CPU-resident decoded tokens")
    if title:
        fig.suptitle(title)
    return save_figure(fig, out_stem)


def plot_latency_cdf_overlay(real: dict[str, pd.DataFrame], simulated: dict[str, pd.DataFrame],
                             out_stem: Path, *, title: str | None = None) -> list[Path]:
    """CDFs of TTFT (left) and inter-token latency (right) of a real run (solid) and its
    simulation (dashed), one colour per policy; log-scaled x where the latencies span decades.
    Writes ``out_stem``.png and .pdf and returns their paths."""
    fig, (ttft_ax, itl_ax) = _figure()
    colors = policy_colors(dict.fromkeys([*real, *simulated]))
    ttfts, itls = [], []
    for kind, frames, ls in (("real", real, "-"), ("simulated", simulated, "--")):
        for policy, df in frames.items():
            ttft, itl = ttft_values(df), itl_values(df)
            style = dict(color=colors[policy], ls=ls, label=f"{policy} ({kind})")
            ttft_ax.plot(*empirical_cdf(ttft), **style)
            itl_ax.plot(*empirical_cdf(itl), **style)
            ttfts.append(ttft)
            itls.append(itl)
    _finish_cdf_axes(fig, ttft_ax, itl_ax, ttfts, itls, title)
    return save_figure(fig, out_stem)


def _finish_cdf_axes(fig, ttft_ax, itl_ax, ttfts, itls, title) -> None:
    """Shared labels, log scales and title of the TTFT / ITL CDF panels."""
    log_if_decades(ttft_ax, ttfts, axis="x")
    log_if_decades(itl_ax, itls, axis="x")
    ttft_ax.set(xlabel="time to first token (s)", ylabel="fraction of requests", title="TTFT")
    itl_ax.set(xlabel="inter-token latency (s)", ylabel="fraction of token gaps", title="ITL")
    if title:
        fig.suptitle(title)
