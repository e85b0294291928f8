"""A hyperparameter search's figures, from its scored trials (`analysis.search.search_points`) and epoch budget:
each trial's best validation accuracy against each searched key, parallel coordinates across the keys, and the
epochs each trial trained against max_t. Trials the scheduler stopped early are drawn apart (hollow or dashed).
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from pefusion import record as R
from pefusion.analysis import runs as RU
from pefusion.analysis import search as S
from pefusion.analysis.figures.canvas import new_figure, series_colors, series_offsets

_MARKERS = "osD^vP<>Xh"
_STATUS_COLOURS = {R.STATUS_OK: "tab:blue", R.STATUS_STOPPED: "tab:orange"}  # any other status failed: red
_SCORE_LABEL = "best validation accuracy (%)"


def _status_handles(solid: bool) -> list[Line2D]:
    """Legend entries telling trials that ran max_t epochs from those the scheduler stopped: filled and hollow
    markers (solid) or solid and dashed lines."""
    if solid:
        return [Line2D([], [], ls="", marker="o", color="0.3", label="ran max_t epochs"),
                Line2D([], [], ls="", marker="o", color="0.3", markerfacecolor="none",
                       label="stopped early by the scheduler")]
    return [Line2D([], [], color="0.3", label="ran max_t epochs"),
            Line2D([], [], color="0.3", ls="--", label="stopped early by the scheduler")]


def _categories(points: S.SearchPoints, key: str) -> list:
    """The key's choices that some trial took, in the distribution's order."""
    present = set(points.frame[key])
    return [c for c in points.distributions[key].choices if c in present]


def search_score_figure(points: S.SearchPoints) -> Figure | None:
    """Each scored trial's best validation accuracy (%) against each searched key that varies (log axis for a
    log-sampled key), one colour and marker per value of the first other categorical key (batch size against
    lr); trials stopped early are hollow, those that ran max_t epochs filled. None when no key varies."""
    if not points.keys:
        return None
    ncols = min(len(points.keys), 2)
    nrows = math.ceil(len(points.keys) / ncols)
    fig, axes = new_figure(nrows, ncols, size=(5.6 * ncols, 4.0 * nrows))
    frame = points.frame
    categorical = [k for k in points.keys if points.kind(k) == S.CATEGORICAL]
    for ax, key in zip(axes.flat, points.keys):
        by = next((k for k in categorical if k != key), None)
        groups = [(None, frame)] if by is None else [(v, frame[frame[by] == v]) for v in _categories(points, by)]
        cats = _categories(points, key) if points.kind(key) == S.CATEGORICAL else None
        handles = []
        for (value, rows), color, marker, dx in zip(groups, series_colors(len(groups)), _MARKERS * 10,
                                                    series_offsets(len(groups), 0.3)):
            x = rows[key].map(cats.index) + dx if cats else rows[key].astype(float)
            for status, face in ((R.STATUS_OK, color), (R.STATUS_STOPPED, "none")):
                mask = (rows[R.STATUS] == status).to_numpy()
                if mask.any():
                    ax.scatter(x[mask], rows[S.SCORE][mask], marker=marker, s=42, facecolors=face,
                               edgecolors=color, linewidths=1.4, zorder=2)
            if by is not None:
                handles.append(Line2D([], [], ls="", marker=marker, color=color, label=f"{by} = {value}"))
        if cats:
            ax.set_xticks(range(len(cats)), [str(c) for c in cats])
            ax.set_xlim(-0.6, len(cats) - 0.4)
        elif points.kind(key) == S.LOG:
            ax.set_xscale("log")
        ax.set_xlabel(key + (" (log scale)" if points.kind(key) == S.LOG else ""))
        ax.set_ylabel(_SCORE_LABEL)
        ax.grid(alpha=0.3)
        ax.legend(handles=handles + _status_handles(solid=True), fontsize=7, loc="best")
    for ax in list(axes.flat)[len(points.keys):]:
        ax.set_visible(False)
    fig.suptitle(f"{len(frame)} scored trials: best validation accuracy against each searched key", fontsize=10)
    return fig


def _axis(points: S.SearchPoints, key: str) -> tuple[np.ndarray, list[float], list[str]]:
    """A parallel-coordinates axis: each trial's position in [0, 1], tick positions and their labels."""
    values = points.frame[key]
    if key != S.SCORE and points.kind(key) == S.CATEGORICAL:
        cats = _categories(points, key)
        span = max(len(cats) - 1, 1)
        return values.map(cats.index).to_numpy(float) / span, [i / span for i in range(len(cats))], \
            [str(c) for c in cats]
    log = key != S.SCORE and points.kind(key) == S.LOG
    v = np.log10(values.to_numpy(float)) if log else values.to_numpy(float)
    lo, hi = float(v.min()), float(v.max())
    span = hi - lo or 1.0
    ticks = [lo, (lo + hi) / 2, hi] if hi > lo else [lo]
    return (v - lo) / span, [(t - lo) / span for t in ticks], [f"{10 ** t if log else t:.3g}" for t in ticks]


def search_parallel_figure(points: S.SearchPoints) -> Figure | None:
    """Parallel coordinates: one line per scored trial across the searched keys that vary and its best
    validation accuracy, coloured by that accuracy; dashed for trials stopped early. None when no key varies."""
    if not points.keys:
        return None
    columns = [*points.keys, S.SCORE]
    fig, axes = new_figure(size=(max(5.0, 2.0 * len(columns) + 1.5), 4.2))
    ax = axes[0, 0]
    axes_data = [_axis(points, k) for k in columns]
    score = points.frame[S.SCORE].to_numpy(float)
    cmap, norm = colormaps["viridis"], Normalize(score.min(), score.max())
    stopped = (points.frame[R.STATUS] == R.STATUS_STOPPED).to_numpy()
    for i in np.argsort(score):  # best on top
        ax.plot(range(len(columns)), [y[i] for y, _, _ in axes_data], color=cmap(norm(score[i])), lw=1.6,
                ls="--" if stopped[i] else "-", alpha=0.9)
    for j, (_, ticks, labels) in enumerate(axes_data):
        ax.axvline(j, color="0.3", lw=0.8, zorder=0)
        for t, label in zip(ticks, labels):
            ax.text(j + 0.04, t, label, fontsize=7, va="center", color="0.2", zorder=3,
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
    ax.set_xticks(range(len(columns)), [k + (" (log)" if points.kind(k) == S.LOG else "") for k in points.keys]
                  + ["best val acc (%)"])
    ax.set_yticks([])
    ax.set_xlim(-0.2, len(columns) - 0.6)
    ax.set_ylim(-0.06, 1.06)
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    fig.colorbar(ScalarMappable(norm, cmap), ax=ax, label=_SCORE_LABEL)
    ax.legend(handles=_status_handles(solid=False), fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0),
              ncols=2, frameon=False)
    return fig


def search_budget_figure(budget: S.Budget) -> Figure:
    """Epochs each trial trained, most first, coloured by outcome, against max_t."""
    per = budget.per_trial
    fig, axes = new_figure(size=(max(6.4, 0.3 * len(per) + 2.0), 4.0))
    ax = axes[0, 0]
    ax.bar(range(len(per)), per[R.EPOCHS_RUN], color=[_STATUS_COLOURS.get(s, "tab:red") for s in per[R.STATUS]])
    ax.axhline(budget.max_t, color="black", ls="--", lw=1.2)
    if len(per) <= 40:
        ax.set_xticks(range(len(per)), per[RU.TRIAL_ID].astype(str), rotation=90, fontsize=6)
    else:
        ax.set_xticks([])
    ax.set_xlabel("trial, most epochs first")
    ax.set_ylabel("epochs trained")
    ax.set_ylim(0, budget.max_t * 1.4)  # room for the legend above the max_t line
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    present = set(per[R.STATUS])
    handles = [Patch(color=c, label=label) for status, c, label in (
        (R.STATUS_OK, _STATUS_COLOURS[R.STATUS_OK], "ran max_t epochs"),
        (R.STATUS_STOPPED, _STATUS_COLOURS[R.STATUS_STOPPED], "stopped early by the scheduler"))
        if status in present]
    if present - set(_STATUS_COLOURS):
        handles.append(Patch(color="tab:red", label="failed"))
    handles.append(Line2D([], [], color="black", ls="--", label=f"max_t = {budget.max_t} epochs"))
    ax.legend(handles=handles, fontsize=7, loc="upper right")
    ax.set_title(f"epochs trained: {budget.epochs_trained:.0f} of {budget.epochs_full_budget:.0f} "
                 f"({100 * budget.fraction:.1f} %)", fontsize=10)
    return fig
