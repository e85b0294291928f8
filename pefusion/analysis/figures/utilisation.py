"""Any sweep's machine: what its CPU and each GPU were busy with over the sweep's time, from the MLflow system
metrics its parent run recorded (`analysis.runs.system_points`).
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from pefusion import record as R
from pefusion.analysis.figures.canvas import new_figure, series_colors


def utilisation_figure(points: pd.DataFrame) -> Figure | None:
    """The CPU's utilisation and each GPU's busy time (%) against the minutes since the first sample, one line
    per metric of `points` (runs.system_points: name, timestamp in Unix ms, value); None without samples."""
    if points.empty:
        return None
    fig, axes = new_figure(size=(7.0, 3.6))
    ax = axes[0, 0]
    start = points["timestamp"].min()
    for (name, rows), color in zip(points.groupby("name", sort=False), series_colors(points["name"].nunique())):
        rows = rows.sort_values("timestamp")
        label = "the machine's CPU utilisation" if name == R.SYSTEM_CPU else \
            f"GPU {name[len(R.SYSTEM_PREFIX + 'gpu_'):].split('_')[0]} busy time"
        ax.plot((rows["timestamp"] - start) / 60_000, rows["value"], color=color, lw=1.2, marker=".", ms=3,
                label=label)
    ax.set_xlabel("minutes since the first sample")
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7, loc="lower right")
    if points["name"].ne(R.SYSTEM_CPU).any():
        ax.set_title(R.GPU_BUSY_LABEL, fontsize=7)
    return fig
