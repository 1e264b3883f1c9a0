"""The frame every figure shares: a figure on the Agg canvas, the policies' colours, log axes
where values span decades, an empty panel that says why, and one legend below the panels.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas rather than pyplot, so
plotting never touches global state or needs a display, and each figure is freed when done. PDFs
are written without a creation date so reruns give identical files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

LOG_SPAN = 30.0  # use a log axis when the plotted values span more than this factor

# Fixed colours for the known policies, so a policy looks the same in every figure.
POLICY_COLORS = {"dualpace": "C0", "vllm": "C1", "neo": "C2"}


def new_figure(size: tuple[float, float]) -> Figure:
    """A figure of ``size`` inches on its own Agg canvas, laid out by matplotlib's constrained
    layout."""
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def two_panels() -> tuple[Figure, tuple]:
    """A 10 x 4 in figure of two panels side by side (a run's figures: all tokens, CPU ones)."""
    fig = new_figure((10, 4))
    return fig, tuple(fig.subplots(1, 2))


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
    return write_png_pdf(fig, out_stem, dpi=150)


def write_png_pdf(fig: Figure, out_stem: Path | str, dpi: int) -> list[Path]:
    """``out_stem``.png and .pdf (the PDF without a creation date, so a figure drawn again
    from the same data is the same file); returns the two paths."""
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    png = out_stem.with_name(out_stem.name + ".png")
    pdf = out_stem.with_name(out_stem.name + ".pdf")
    fig.savefig(png, dpi=dpi)
    fig.set_layout_engine("none")  # keep the layout just computed: the PDF needs no second pass
    fig.savefig(pdf, metadata={"CreationDate": None})
    return [png, pdf]

def say_empty(ax, text: str) -> None:
    """An empty panel that says why, instead of a flat line on a meaningless axis."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.35")
    ax.set_yticks([])

def log_if_decades(ax, arrays, axis: str = "y") -> None:
    """Log-scale ``axis`` when its positive finite values span more than ``LOG_SPAN``."""
    finite = [np.asarray(a, dtype=float) for a in arrays if np.size(a)]
    if not finite:
        return
    values = np.concatenate(finite)
    values = values[np.isfinite(values) & (values > 0)]
    if values.size and values.max() / values.min() > LOG_SPAN:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")

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
