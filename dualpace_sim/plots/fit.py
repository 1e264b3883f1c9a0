"""The profile-guided configuration figure (paper Figure 7) from a :class:`FitResult`.

Built on ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot, no global state); PDFs are
written without a creation date so reruns give identical files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from dualpace_sim.costs.fit import FitResult
from dualpace_sim.costs.fit.thresholds import (
    FULL,
    FUSED,
    ROUTES,
    SPLIT,
    RoutingCosts,
    choose_thresholds,
    route_scores,
    shift_assist_wait,
)
from dualpace_sim.plots.layout import new_figure, write_png_pdf

ROUTE_COLORS = {FULL: "tab:blue", SPLIT: "tab:orange", FUSED: "tab:green"}


def _save(fig: Figure, out_stem: Path | str) -> list[Path]:
    for ax in fig.axes:
        ax.grid(True, alpha=0.3, which="major")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    return write_png_pdf(fig, out_stem, dpi=130)


def _log_x_if_decades(ax, values: Sequence[float], base: int = 10) -> None:
    lo, hi = min(values), max(values)
    if lo > 0 and hi / lo >= 10:
        ax.set_xscale("log", base=base)


def _routing_panel(ax, result: FitResult) -> None:
    r, choice = result.routing, result.thresholds
    bs = r.batch_sizes
    for route in ROUTES:
        ax.plot(bs, np.asarray(r.S(route)) * 1e3, marker=".", ms=3, color=ROUTE_COLORS[route],
                label=route)
    _log_x_if_decades(ax, bs)
    ax.set_yscale("log")
    p, f = choice.p, choice.f
    if p == 0 and f == 0:
        ax.axvspan(bs[0], bs[-1], color=ROUTE_COLORS[FUSED], alpha=0.06, lw=0)
        ax.text(0.03, 0.97, "(P, F) = (0, 0): Fused-Assist at every b", transform=ax.transAxes,
                va="top", fontsize="small")
    else:
        if f > 0:
            ax.axvline(f, color=ROUTE_COLORS[FULL], ls="--", lw=1, label=f"F = {f}")
            ax.axvspan(bs[0], f, color=ROUTE_COLORS[FULL], alpha=0.06, lw=0)
        ax.axvline(p, color=ROUTE_COLORS[SPLIT], ls="--", lw=1, label=f"P = {p}")
        ax.axvspan(max(f, bs[0]), p, color=ROUTE_COLORS[SPLIT], alpha=0.06, lw=0)
    best = choice.best
    ax.text(0.03, 0.88 if (p, f) == (0, 0) else 0.97,
            f"exact minimum (P, F) = ({best.p}, {best.f}); chosen +{choice.regret:.3%}\n"
            f"\u03b5 = {result.epsilon:g}, \u03bb_GPU = {result.lambda_gpu:g}, N = {r.n_layers}",
            transform=ax.transAxes, va="top", fontsize="x-small")
    ax.set(xlabel="CPU decode batch size b (requests)", ylabel="routing score S_r(b) (ms)",
           title="(a) CPU post-attention routing score")


def _cpu_panel(ax, result: FitResult) -> None:
    cpu = result.cpu
    for ctx, row in zip(cpu.contexts, cpu.throughput, strict=True):
        ax.plot(cpu.batch_sizes, np.asarray(row) / 1e3, marker=".", ms=3,
                label=f"context {ctx}")
    _log_x_if_decades(ax, cpu.batch_sizes)
    ax.axvline(cpu.limit, color="k", ls="--", lw=1, label=f"limit b = {cpu.limit}")
    if cpu.latency_limit is not None:
        ax.axvline(cpu.latency_limit, color="tab:red", ls=":", lw=1,
                   label=f"\u2264 {cpu.max_iteration_s:g} s/iteration: b = {cpu.latency_limit}")
    ax.set(xlabel="CPU decode batch size b (requests)",
           ylabel="single-layer throughput (K tokens/s)",
           title=f"(b) CPU single-layer decode throughput (within {cpu.delta:.0%} of best)")


def _prefill_by_batch_panel(ax, result: FitResult) -> None:
    pre = result.prefill
    for b, row in zip(pre.batches, pre.throughput, strict=True):
        pts = [(length, v) for length, v in zip(pre.lengths, row, strict=True)
               if not math.isnan(v)]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, np.asarray(ys) / 1e3, marker=".", ms=4, label=f"B = {b}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="sequence length L (tokens per request)",
           ylabel="single-layer throughput (K tokens/s)",
           title=f"(c) GPU single-layer prefill throughput by batch (B\u00b7L \u2264 "
                 f"{pre.max_tokens})")


def _prefill_by_tokens_panel(ax, result: FitResult) -> None:
    fit = result.prefill.fit
    n = np.asarray(fit.tokens)
    ax.plot(n, np.asarray(fit.mean) / 1e3, "o", ms=4, label="mean over (B, L)")
    ax.plot(n, np.asarray(fit.fitted) / 1e3, "-", lw=1.5, label="non-decreasing fit")
    ax.axhline(fit.plateau / 1e3, color="gray", ls="--", lw=1,
               label=f"plateau (last {fit.k} fitted)")
    ax.axhline((1 - fit.delta) * fit.plateau / 1e3, color="gray", ls=":", lw=1,
               label=f"plateau \u2212 {fit.delta:.0%}")
    ax.axvline(fit.limit, color="k", ls="--", lw=1, label=f"limit n = {fit.limit}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batched tokens n = B\u00b7L", ylabel="single-layer throughput (K tokens/s)",
           title="(d) GPU single-layer prefill throughput by token count")


def plot_fit(result: FitResult, out_stem: Path | str, *, title: str | None = None) -> list[Path]:
    """Figure 7's four panels in one 2x2 figure; writes ``out_stem``.png and .pdf."""
    fig = new_figure((12, 8.5))
    (a, b), (c, d) = fig.subplots(2, 2)
    _routing_panel(a, result)
    _cpu_panel(b, result)
    _prefill_by_batch_panel(c, result)
    _prefill_by_tokens_panel(d, result)
    fig.suptitle(title or f"Profile-guided configuration: {result.label}  \u2192  "
                 + ", ".join(result.lines()), fontsize="medium")
    return _save(fig, out_stem)


def plot_post_attn_crossover(
    costs: RoutingCosts,
    batch_sizes: Sequence[int],
    out_stem: Path | str,
    *,
    extra_waits_s: Sequence[float] = (0.0, 1e-3, 2.5e-3, 5e-3),
    lambda_gpu: float = 1.0,
    epsilon: float = 0.0025,
    title: str | None = None,
) -> list[Path]:
    """One post-attention stage: CPU-local t_p(b) against assisted t̄_p(b) + λ·d_p(b), the latter
    for several extra control-path waits added to q_x (a busy GPU's stage-boundary wait), with
    the (P, F) that Algorithm 1 picks for each; writes ``out_stem``.png and .pdf."""
    fig = new_figure((7.5, 4.8))
    ax = fig.subplots()
    base = route_scores(costs, batch_sizes, lambda_gpu)
    ax.plot(base.batch_sizes, np.asarray(base.post_attn_local()) * 1e3, color="k", lw=2,
            label="CPU-local t_p(b)")
    for extra in extra_waits_s:
        shifted = route_scores(shift_assist_wait(costs, extra), batch_sizes, lambda_gpu)
        choice = choose_thresholds(shifted.batch_sizes, shifted, costs.n_layers, epsilon)
        cross = shifted.post_attn_crossover()
        where = "never" if cross is None else f"b \u2265 {cross}"
        ax.plot(shifted.batch_sizes, np.asarray(shifted.post_attn_assisted()) * 1e3, ls="--",
                label=f"assisted, q_x + {extra * 1e3:g} ms: cheaper at {where}; "
                      f"(P, F) = ({choice.p}, {choice.f})")
    _log_x_if_decades(ax, base.batch_sizes)
    ax.set_yscale("log")
    ax.set(xlabel="CPU decode batch size b (requests)",
           ylabel="one post-attention stage (ms)",
           title=title or "Post-attention: CPU-local vs Dense Assist (t\u0304_p + \u03bb\u00b7d_p)")
    return _save(fig, out_stem)
