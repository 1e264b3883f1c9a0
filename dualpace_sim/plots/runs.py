"""A run's figures from its per-request records (one records frame per policy): cumulative
tokens over time and the TTFT and ITL CDFs, alone or a real run against its simulation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from dualpace_sim.plots.layout import (
    log_if_decades,
    policy_colors,
    save_figure,
    say_empty,
    two_panels,
)
from dualpace_sim.plots.tables import empirical_cdf
from dualpace_sim.results.metrics import (
    itl_values,
    longest_cpu_stall_interval,
    token_timeline,
    ttft_values,
)
from dualpace_sim.results.token_spans import TokenSpans


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
    fig, (total_ax, cpu_ax) = two_panels()
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

def plot_latency_cdf(frames: dict[str, pd.DataFrame], out_stem: Path, *,
                     title: str | None = None) -> None:
    """CDFs of TTFT (left) and inter-token latency (right), one line per policy; log-scaled x
    where the latencies span decades."""
    fig, (ttft_ax, itl_ax) = two_panels()
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

def plot_timeline_overlay(real: dict[str, pd.DataFrame], simulated: dict[str, pd.DataFrame],
                          out_stem: Path, *, title: str | None = None) -> list[Path]:
    """Cumulative generated tokens (left) and cumulative CPU-decoded tokens (right) of a real
    run (solid) and its simulation (dashed), one colour per policy. Time is counted from each
    run's first arrival, so a runtime whose clock starts elsewhere still lines up. Writes
    ``out_stem``.png and .pdf and returns their paths."""
    fig, (total_ax, cpu_ax) = two_panels()
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
    fig, (ttft_ax, itl_ax) = two_panels()
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
