"""What every figure is drawn on and how it is saved: a `matplotlib.figure.Figure` on an explicit Agg canvas (no
pyplot state, no display needed, and importing a figure never changes the backend of a notebook that imports it),
written as PNG (dpi 150) and PDF; the colours and offsets that tell a figure's series apart.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 150


def new_figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (6.4, 4.2)) -> tuple[Figure, np.ndarray]:
    """A figure on an Agg canvas and its (nrows, ncols) array of axes."""
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def save_figure(fig: Figure, out_dir: str | Path, stem: str) -> Path:
    """Write <out_dir>/<stem>.png (dpi 150) and <stem>.pdf; return the PNG path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{stem}.png"
    fig.savefig(png, dpi=DPI)
    fig.savefig(out_dir / f"{stem}.pdf")
    return png


def series_colors(n: int) -> list:
    """n colours of matplotlib's tab10, repeating after 10."""
    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def series_offsets(n: int, width: float = 0.6) -> np.ndarray:
    """Horizontal offsets that spread n series around each category tick."""
    return np.zeros(1) if n == 1 else np.linspace(-width / 2, width / 2, n)
