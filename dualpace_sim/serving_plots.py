"""The serving figures people look for next to the paper's: throughput and goodput against the
offered rate, per-engine utilisation, latency CDFs at each swept rate, and what the node held
over time (queues, KV on each tier).

Each takes the tables or records `dualpace-sim plot` reads and writes PNG and PDF, through
:mod:`dualpace_sim.plots`' figure helpers (one shared legend, bands over seeds).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .metrics import itl_values, latency_values
from .plots import (
    RATE_LABEL,
    draw_band,
    empirical_cdf,
    log_if_decades,
    new_figure,
    policy_colors,
    save_figure,
    say_empty,
    setting_colors,
)
from .runner import UTILISATION_KEYS
from .token_spans import TokenSpans

UTILISATION_TITLES = {"gpu_utilisation": "GPU", "cpu_utilisation": "CPU engine",
                      "pcie_h2d_utilisation": "PCIe host to GPU",
                      "pcie_d2h_utilisation": "PCIe GPU to host"}


def _rate_lines(ax, table: pd.DataFrame, metric: str, ls: str = "-",
                suffix: str = "") -> None:
    colors = policy_colors(dict.fromkeys(table["policy"]))
    for policy, rows in table.groupby("policy", sort=False):
        rows = rows.sort_values("rate")
        ax.plot(rows["rate"].to_numpy(float), rows[metric].to_numpy(float), marker="o", ms=4,
                ls=ls, color=colors[policy], label=f"{policy}{suffix}")
        draw_band(ax, rows, metric, colors[policy])


def plot_throughput_vs_rate(table: pd.DataFrame, out_stem: Path, *, title: str) -> list[Path]:
    """Output-token throughput (left) and request throughput with goodput (right, dashed) vs
    offered rate, one colour per series of a :func:`plots.series_table` frame."""
    fig = new_figure((11, 4.6))
    tokens_ax, requests_ax = fig.subplots(1, 2)
    _rate_lines(tokens_ax, table, "output_throughput_tok_s")
    tokens_ax.set(xlabel=RATE_LABEL, ylabel="output tokens per second",
                  title="Output-token throughput")
    _rate_lines(requests_ax, table, "request_throughput_req_s")
    _rate_lines(requests_ax, table, "goodput_req_s", ls="--", suffix=" goodput")
    top = float(table["rate"].max())
    requests_ax.plot([0, top], [0, top], color="0.6", lw=0.8, ls=":")  # throughput = offered
    requests_ax.set(xlabel=RATE_LABEL, ylabel="completed requests per second",
                    title="Request throughput (solid) and goodput (dashed)")
    fig.suptitle(title)
    return save_figure(fig, out_stem)


def plot_utilisation_vs_rate(table: pd.DataFrame, out_stem: Path, *, title: str) -> list[Path]:
    """Busy share of the GPU, the CPU engine and each PCIe direction vs offered rate (four
    panels); a panel no policy used says so."""
    fig = new_figure((12, 8))
    for ax, key in zip(fig.subplots(2, 2).ravel(), UTILISATION_KEYS, strict=True):
        ax.set(xlabel=RATE_LABEL, ylabel="busy share of the run", title=UTILISATION_TITLES[key])
        if not (table[key].fillna(0) > 0).any():
            say_empty(ax, f"no {UTILISATION_TITLES[key]} use")
            continue
        _rate_lines(ax, table, key)
        ax.set_ylim(0, max(1.0, float(table[key].max()) * 1.05))
    fig.suptitle(title)
    return save_figure(fig, out_stem)


def plot_latency_cdfs_by_rate(frames: dict[float, pd.DataFrame], out_stem: Path, *,
                              title: str) -> list[Path]:
    """TTFT, ITL and TPOT CDFs of one policy, one line per swept rate (light to dark)."""
    fig = new_figure((15, 4.6))
    axes = fig.subplots(1, 3)
    ramp = setting_colors([f"{r:g} req/s" for r in frames])
    by_latency: dict[str, list[np.ndarray]] = {"ttft": [], "itl": [], "tpot": []}
    for rate, df in frames.items():
        spans = TokenSpans.from_frame(df)
        values = {**latency_values(df, spans), "itl": itl_values(df, spans)}  # every gap
        for ax, name in zip(axes, by_latency, strict=True):
            by_latency[name].append(values[name])
            ax.plot(*empirical_cdf(values[name]), color=ramp[f"{rate:g} req/s"],
                    label=f"{rate:g} req/s")
    labels = {"ttft": "time to first token (s)", "itl": "inter-token latency (s)",
              "tpot": "time per output token (s)"}
    for ax, name in zip(axes, by_latency, strict=True):
        log_if_decades(ax, by_latency[name], axis="x")
        ax.set(xlabel=labels[name], ylabel="fraction", title=name.upper())
    fig.suptitle(title)
    return save_figure(fig, out_stem)


def plot_state_over_time(series: dict[str, pd.DataFrame], capacities: dict[str, dict],
                         out_stem: Path, *, title: str) -> list[Path]:
    """Queues (left: waiting for a first token solid, decoding dashed) and the KV blocks
    requests hold (right: HBM solid, host dashed, each pool's capacity dotted) over time, one
    colour per policy (:func:`state_series.state_series`)."""
    fig = new_figure((12, 4.6))
    queue_ax, kv_ax = fig.subplots(1, 2)
    colors = policy_colors(series)
    for policy, s in series.items():
        c = colors[policy]
        queue_ax.plot(s["time_s"], s["waiting"], color=c, label=f"{policy} waiting")
        queue_ax.plot(s["time_s"], s["decoding"], color=c, ls="--", label=f"{policy} decoding")
        kv_ax.plot(s["time_s"], s["gpu_kv_blocks"], color=c, label=f"{policy} HBM KV")
        kv_ax.plot(s["time_s"], s["host_kv_blocks"], color=c, ls="--",
                   label=f"{policy} host KV")
        cap = capacities.get(policy) or {}
        for key, ls in (("gpu_kv_blocks", ":"), ("host_kv_blocks", "-.")):
            # a pool far above what is held would flatten the curves: only a near one
            if cap.get(key) and s[key].max() >= 0.25 * cap[key]:
                kv_ax.axhline(cap[key], color=c, ls=ls, lw=0.8)
    queue_ax.set(xlabel="time (s)", ylabel="requests", title="Requests waiting and decoding")
    kv_ax.set(xlabel="time (s)", ylabel="KV blocks held",
              title="KV blocks held (dotted: HBM pool, dash-dot: host pool)")
    fig.suptitle(title)
    return save_figure(fig, out_stem)
