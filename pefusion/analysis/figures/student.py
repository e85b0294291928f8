"""The student study's figures against α: Δε_t and Δε_g with the published α_c(ω) and α_l(ω)
(`figures.phase_map` draws the warning under it), ε_g, m and θ per initialisation, the cross-validated λ*, and
the d → ∞ theory's ε_g on each branch; the simulated points beside the theory's dashed lines where the tables
carry it. And every student figure of a sweep, the phase diagram included.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from pefusion import record as R
from pefusion.analysis import student_tables as ST
from pefusion.analysis.figures.canvas import new_figure, save_figure, series_colors
from pefusion.analysis.figures.phase_map import PAPER, SYMBOL, phase_diagram_figure, size_warning
from pefusion.student.theory import BRANCH_ENDED


def _groups(frame: pd.DataFrame, keys: Sequence[str]) -> list[tuple[str, pd.DataFrame, tuple]]:
    """(legend label, rows, colour) per group of `keys`; the label names only the keys that vary (ω always)."""
    shown = [k for k in keys if k == R.OMEGA or frame[k].nunique(dropna=False) > 1]
    groups = list(frame.groupby(keys, sort=True, dropna=False))
    out = []
    for (values, rows), color in zip(groups, series_colors(len(groups))):
        values = dict(zip(keys, values))
        label = ", ".join(f"{SYMBOL.get(k, k)}={values[k]:g}" if isinstance(values[k], float) else str(values[k])
                          for k in shown if not pd.isna(values[k]))
        out.append((label, rows.sort_values(R.ALPHA), color))
    return out


def _alpha_lines(ax, omega_colors: Mapping[float, tuple], alpha_c: ST.Curve | None, alpha_l: ST.Curve | None) -> None:
    """Vertical lines at the published α_c(ω) (dashed) and α_l(ω) (dotted) for each ω on the plot, in the
    colour of that ω's first series."""
    for omega, color in omega_colors.items():
        for curve, style, name in ((alpha_c, "--", "α_c"), (alpha_l, ":", "α_l")):
            value = ST.interpolate_curve(curve, omega) if curve else math.nan
            if not math.isnan(value):  # thin, so that the dashed theory curves stay distinguishable
                ax.axvline(value, color=color, ls=style, lw=0.8, alpha=0.7,
                           label=f"{name}(ω={omega:g}) = {value:.3g} (paper, d → ∞, λ = {PAPER[R.LAMBDA]:g})")


def student_delta_figure(delta_summary: pd.DataFrame, alpha_c: ST.Curve | None = None,
                         alpha_l: ST.Curve | None = None) -> Figure:
    """Δε_t and Δε_g = ε(positional) − ε(semantic) against α (mean ± std over seeds), one line per ω, with
    the published α_c(ω) and α_l(ω). Above zero the semantic solution is lower."""
    fig, axes = new_figure(1, 2, size=(11.0, 4.2))
    keys = [k for k in ST.DELTA_GROUP if k != R.ALPHA]
    groups = _groups(delta_summary, keys)
    omega_colors: dict[float, tuple] = {}
    for _, rows, color in groups:
        omega_colors.setdefault(float(rows[R.OMEGA].iloc[0]), color)
    for ax, quantity, name in zip(axes[0], ("delta_eps_t", "delta_eps_g"), ("ε_t", "ε_g")):
        for label, rows, color in groups:
            mean, std = rows[f"{quantity}_mean"].to_numpy(float), np.nan_to_num(rows[f"{quantity}_std"])
            ax.plot(rows[R.ALPHA], mean, marker="o", ms=3, color=color, label=label)
            ax.fill_between(rows[R.ALPHA], mean - std, mean + std, color=color, alpha=0.2, lw=0)
            _theory_line(ax, rows, f"{quantity}{ST.THEORY_SUFFIX}", color, label=f"{label}, d → ∞ theory")
        _alpha_lines(ax, omega_colors, alpha_c, alpha_l)
        ax.axhline(0.0, color="gray", lw=0.8)
        ax.set_xlabel("α = n / d")
        ax.set_ylabel(f"Δ{name} = {name}(positional) − {name}(semantic)")
        ax.legend(fontsize=7)
    axes[0, 0].set_title("training loss difference", fontsize=10)
    axes[0, 1].set_title("test error difference", fontsize=10)
    size_warning(fig, delta_summary)
    return fig


def _theory_line(ax, rows: pd.DataFrame, column: str, color, label: str | None = None) -> bool:
    """The d → ∞ theory's values of `column` at the rows' α, dashed in the series' colour; False if none."""
    if column not in rows or not rows[column].notna().any():
        return False
    ax.plot(rows[R.ALPHA], rows[column], ls="--", lw=1.2, color=color, label=label)
    return True


_THEORY_HANDLE = Line2D([], [], ls="--", color="0.3", label="dashed: d → ∞ theory at the same α, λ")


def student_order_figure(summary: pd.DataFrame) -> Figure:
    """ε_g, m = |1ᵀQ|/d (positional overlap) and θ = |Q*ᵀQ|/d (semantic overlap) against α, per initialisation,
    with the d → ∞ theory of the same branch dashed where the summary has it."""
    fig, axes = new_figure(1, 3, size=(15.0, 4.2))
    groups = _groups(summary, ["source", R.OMEGA, R.SIGMA, R.D, ST.LAM_FIXED, R.INIT])
    for ax, quantity, name in zip(axes[0], (R.EPS_G, R.M, R.THETA),
                                  ("ε_g (test error)", "m = |1ᵀQ| / d", "θ = |Q*ᵀQ| / d")):
        theory = False
        for label, rows, color in groups:
            ax.errorbar(rows[R.ALPHA], rows[f"{quantity}_mean"], yerr=np.nan_to_num(rows[f"{quantity}_std"]),
                        marker="o", ms=3, capsize=2, color=color, label=label)
            theory |= _theory_line(ax, rows, f"{quantity}{ST.THEORY_SUFFIX}_mean", color)
        ax.set_xlabel("α = n / d")
        ax.set_ylabel(name)
        handles, _ = ax.get_legend_handles_labels()
        ax.legend(handles=handles + ([_THEORY_HANDLE] if theory else []), fontsize=7)
    return fig


def theory_eps_g_figure(curve: pd.DataFrame, simulated: pd.DataFrame | None = None, title: str = "") -> Figure:
    """ε_g against α on the semantic and positional branches of the d → ∞ theory (a theory_curve frame: columns
    alpha, branch, eps_g, converged, status), with simulated points (columns alpha, init, eps_g; mean ± std over
    rows) as markers in the branch's colour. Where a branch ends inside the curve's range (status branch_ended),
    its last point is marked × and labelled."""
    fig, axes = new_figure()
    ax = axes[0, 0]
    colors = {ST.SEMANTIC: "tab:blue", ST.POSITIONAL: "tab:red"}
    for branch, color in colors.items():
        rows = curve[(curve["branch"] == branch) & curve["converged"].astype(bool)].sort_values("alpha")
        ax.plot(rows["alpha"], rows["eps_g"], color=color, lw=1.6, label=f"{branch}, d → ∞ theory")
        ended = curve[(curve["branch"] == branch) & (curve["status"] == BRANCH_ENDED)]
        if len(ended) and len(rows):
            below = ended["alpha"].max() < rows["alpha"].min()
            last = rows.iloc[0] if below else rows.iloc[-1]
            ax.plot(last["alpha"], last["eps_g"], ls="", marker="x", ms=9, mew=2, color=color)
            ax.annotate(f"{branch} branch ends {'below' if below else 'above'} α = {last['alpha']:g}",
                        (last["alpha"], last["eps_g"]), xytext=(8, 6), textcoords="offset points", fontsize=8,
                        color=color)
        if simulated is not None and len(simulated):
            sim = simulated[simulated[R.INIT] == branch].groupby(R.ALPHA)[R.EPS_G].agg(["mean", "std", "size"])
            ax.errorbar(sim.index, sim["mean"], yerr=np.nan_to_num(sim["std"]), ls="", marker="o", ms=5,
                        capsize=2, color=color, label=f"{branch}, simulation")
    ax.set_xlabel("α = n / d")
    ax.set_ylabel("ε_g (test error)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return fig


def lambda_star_figure(summary: pd.DataFrame) -> Figure | None:
    """The cross-validated λ* against α per initialisation (log scale); None without λ-CV runs."""
    rows_cv = summary[summary[f"{R.LAMBDA_STAR}_mean"].notna()]
    if rows_cv.empty:
        return None
    fig, axes = new_figure()
    ax = axes[0, 0]
    for (label, rows, color), marker in zip(_groups(rows_cv, [R.OMEGA, R.SIGMA, R.D, R.INIT]), "os^vD<>" * 10):
        ax.plot(rows[R.ALPHA], rows[f"{R.LAMBDA_STAR}_mean"], marker=marker, ms=5, color=color, label=label,
                alpha=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("α = n / d")
    ax.set_ylabel("λ* (cross-validated, mean over seeds)")
    ax.legend(fontsize=7)
    return fig


def student_figures(student: pd.DataFrame, out_dir: str | Path, alpha_c: ST.Curve | None = None,
                    alpha_l: ST.Curve | None = None, theory_alpha_c: pd.DataFrame | None = None) -> list[Path]:
    """Every student figure from the long student frame (student_tables.student_frame, with the theory's
    columns if student_tables.with_theory added them); returns the PNG paths."""
    paths = []
    summary = ST.student_summary(student)
    delta_summary = ST.student_delta_summary(ST.student_deltas(student))
    if len(delta_summary):
        paths.append(save_figure(student_delta_figure(delta_summary, alpha_c, alpha_l), out_dir, "student_deltas"))
        crossings = ST.crossing_alphas(ST.student_deltas(student))
        paths.append(save_figure(phase_diagram_figure(delta_summary, alpha_c, alpha_l, theory_alpha_c, student,
                                                      crossings), out_dir, "student_phase_diagram"))
    if len(summary):
        paths.append(save_figure(student_order_figure(summary), out_dir, "student_order_parameters"))
    lam_fig = lambda_star_figure(summary) if len(summary) else None
    if lam_fig is not None:
        paths.append(save_figure(lam_fig, out_dir, "student_lambda_star"))
    return paths
