"""The serving figures people look for next to the paper's: throughput and goodput against the
offered rate, per-engine utilisation, latency CDFs at each swept rate, and what the node held
over time (queues, KV on each tier).

Each takes the tables or records `dualpace-sim plot` reads and writes PNG and PDF, through
:mod:`dualpace_sim.plots.layout`'s frame (one shared legend) and the sweeps' bands over seeds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dualpace_sim.plots.layout import (
    log_if_decades,
    new_figure,
    policy_colors,
    save_figure,
    say_empty,
    setting_colors,
)
from dualpace_sim.plots.sweeps import RATE_LABEL, draw_band
from dualpace_sim.plots.tables import empirical_cdf
from dualpace_sim.results.metrics import itl_values, latency_values
from dualpace_sim.results.node_series import UTILISATION_KEYS, NodeSeries, held_at
from dualpace_sim.results.token_spans import TokenSpans

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


PLOT_POINTS = 2000  # times a state panel samples (a run has millions of state rows)


def plot_state_over_time(series: dict[str, NodeSeries], capacities: dict[str, dict],
                         out_stem: Path, *, title: str) -> list[Path]:
    """What each policy's node held and how busy it was over time, one colour per policy
    (`dualpace_sim.results.node_series`): requests waiting for a first token (solid), decoding on
    the
    GPU (dashed) and on the CPU (dotted); HBM KV blocks held, and host KV blocks held (solid)
    and with the growth and migration room the host envelope reserves (dashed), each against
    its pool (grey); the GPU's, the CPU engine's and each PCIe direction's busy share. A panel
    no policy used says so instead of drawing a flat line."""
    fig = new_figure((15, 8))
    axes = fig.subplots(2, 3)
    queue_ax, hbm_ax, host_ax = axes[0]
    gpu_ax, cpu_ax, pcie_ax = axes[1]
    colors = policy_colors(series)
    end = max((float(s.utilisation["end_s"].iloc[-1]) for s in series.values()
               if len(s.utilisation)), default=0.0)
    times = np.linspace(0.0, end, PLOT_POINTS)
    used = {"cpu_decoding": False, "host": False, "cpu": False, "pcie": False}
    for policy, s in series.items():
        c = colors[policy]
        held = held_at(s.state, times)
        step = {"color": c, "drawstyle": "steps-post"}
        queue_ax.plot(times, held["waiting"] + held["prefilling"], **step,
                      label=f"{policy} waiting")
        queue_ax.plot(times, held["gpu_decoding"], ls="--", **step,
                      label=f"{policy} GPU decoding")
        if (s.state["cpu_decoding"] > 0).any():
            used["cpu_decoding"] = True
            queue_ax.plot(times, held["cpu_decoding"], ls=":", **step,
                          label=f"{policy} CPU decoding")
        hbm_ax.plot(times, held["hbm_kv_blocks"], **step, label=policy)
        cap = capacities.get(policy) or {}
        if cap.get("gpu_kv_blocks"):  # a pool far above what is held would flatten the curves
            hbm_ax.axhline(cap["gpu_kv_blocks"], color=c, ls=":", lw=0.8, alpha=0.7)
        if (s.state["host_kv_blocks"] > 0).any():
            used["host"] = True
            reserved = (held["host_kv_blocks"] + held["host_kv_growth_blocks"]
                        + held["host_kv_migration_blocks"])
            host_ax.plot(times, held["host_kv_blocks"], **step, label=policy)
            host_ax.plot(times, reserved, ls="--", **step,
                         label=f"{policy} held + reserved")
            if cap.get("host_kv_blocks") and reserved.max() >= 0.25 * cap["host_kv_blocks"]:
                host_ax.axhline(cap["host_kv_blocks"], color=c, ls=":", lw=0.8, alpha=0.7)
        u = s.utilisation
        mid = ((u["start_s"] + u["end_s"]) / 2).to_numpy()
        gpu_ax.plot(mid, u["gpu"], color=c, label=policy)
        if (u["cpu"] > 0).any():
            used["cpu"] = True
            cpu_ax.plot(mid, u["cpu"], color=c, label=policy)
        if (u[["pcie_h2d", "pcie_d2h"]] > 0).any(axis=None):
            used["pcie"] = True
            pcie_ax.plot(mid, u["pcie_h2d"], color=c, label=f"{policy} host to GPU")
            pcie_ax.plot(mid, u["pcie_d2h"], color=c, ls="--", label=f"{policy} GPU to host")
    queue_ax.set(xlabel="time (s)", ylabel="requests",
                 title="Waiting (solid), decoding on GPU (dashed)"
                       + (" and CPU (dotted)" if used["cpu_decoding"] else ""))
    hbm_ax.set(xlabel="time (s)", ylabel="KV blocks", title="HBM KV held (dotted: the pool)")
    host_ax.set(xlabel="time (s)", ylabel="KV blocks",
                title="Host KV held, and with reserved growth (dashed)")
    if not used["host"]:
        say_empty(host_ax, "no host KV used")
    for ax, name, key in ((gpu_ax, "GPU", None), (cpu_ax, "CPU engine", "cpu"),
                          (pcie_ax, "PCIe", "pcie")):
        ax.set(xlabel="time (s)", ylabel="busy share", title=f"{name} utilisation")
        if key is not None and not used[key]:
            say_empty(ax, f"no {name} work" if key == "cpu" else "no PCIe transfers")
        else:
            ax.set_ylim(0, 1.05)
    fig.suptitle(title)
    return save_figure(fig, out_stem)
