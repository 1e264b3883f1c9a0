"""Paper-style figures from per-request records (one records frame per policy).

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas rather than pyplot, so
plotting never touches global state or needs a display, and each figure is freed when done. PDFs
are written without a creation date so reruns give identical files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dualpace_sim.metrics import itl_values, token_timeline, ttft_values

CDF_MAX_POINTS = 2000


def plot_timeline(frames: dict[str, pd.DataFrame], out_stem: Path) -> None:
    """Cumulative generated tokens (left) and cumulative CPU-decoded tokens (right) over time,
    one line per policy, like the paper's Figure 1 (top). Writes ``out_stem``.png and .pdf."""
    fig, (total_ax, cpu_ax) = _figure()
    for policy, df in frames.items():
        timeline = token_timeline(df)
        total_ax.plot(timeline["time_s"], timeline["total_tokens"], label=policy)
        cpu_ax.plot(timeline["time_s"], timeline["cpu_tokens"], label=policy)
    total_ax.set(xlabel="time (s)", ylabel="generated tokens (cumulative)",
                 title="Generated tokens")
    cpu_ax.set(xlabel="time (s)", ylabel="CPU-decoded tokens (cumulative)",
               title="CPU-resident decoded tokens")
    _save(fig, out_stem)


def plot_latency_cdf(frames: dict[str, pd.DataFrame], out_stem: Path) -> None:
    """CDFs of TTFT (left) and inter-token latency (right), one line per policy."""
    fig, (ttft_ax, itl_ax) = _figure()
    for policy, df in frames.items():
        ttft_ax.plot(*_cdf(ttft_values(df)), label=policy)
        itl_ax.plot(*_cdf(itl_values(df)), label=policy)
    ttft_ax.set(xlabel="time to first token (s)", ylabel="fraction of requests", title="TTFT")
    itl_ax.set(xlabel="inter-token latency (s)", ylabel="fraction of token gaps", title="ITL")
    _save(fig, out_stem)


def _figure() -> tuple[Figure, tuple]:
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, tuple(fig.subplots(1, 2))


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF, sampled at most ``CDF_MAX_POINTS`` order statistics to keep PDFs small."""
    values = np.sort(values)
    fraction = np.arange(1, values.size + 1) / max(values.size, 1)
    if values.size > CDF_MAX_POINTS:
        pick = np.linspace(0, values.size - 1, CDF_MAX_POINTS).round().astype(int)
        values, fraction = values[pick], fraction[pick]
    return values, fraction


def _save(fig: Figure, out_stem: Path) -> None:
    for ax in fig.axes:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_stem.with_name(out_stem.name + ".png"), dpi=150)
    fig.savefig(out_stem.with_name(out_stem.name + ".pdf"), metadata={"CreationDate": None})
