"""The student study's (α, ω) phase diagram: each point called semantic, positional or undecided from its
seeds, with the published α_c(ω) and α_l(ω), the d → ∞ theory's α_c(ω), each ω's estimated α_c with its
interval and, for λ-CV points, the λ* of each fit; and the warning drawn under a map (and under the Δε figure of
`figures.student`) where too few seeds or too small a d cannot place the transition. The symbols of the student
keys and the paper's setting, which both write into their labels, live here, below the figures that use them.
"""
from __future__ import annotations

import math
import textwrap

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pefusion import record as R
from pefusion.analysis import student_tables as ST
from pefusion.analysis.figures.canvas import new_figure

SYMBOL = {R.OMEGA: "ω", R.SIGMA: "σ", R.D: "d", ST.LAM_FIXED: "λ", "source": ""}

# The paper's d, σ and λ: its α_c(ω) and α_l(ω) tables are the d → ∞ theory at this λ.
PAPER = ST.published_setting()


# Characters a line of the warning under a map holds at fontsize 7 in the map's width (a longer line ran off both
# edges).
WARNING_WIDTH = 120
# A map decides a point this far from α_c: points farther than this that stay undecided mean too few seeds.
DECIDE_WITHIN = 0.1


def size_warning(fig: Figure, frame: pd.DataFrame, alpha_c: ST.Curve | None = None,
                 theory: pd.DataFrame | None = None) -> None:
    """A line under a phase map that cannot place the transition: decided on too few seeds — a point more than
    DECIDE_WITHIN from α_c (the theory's at the map's σ and λ, else the published) left undecided, or the calls
    changing between semantic and positional more than once along α at some ω — or, below the paper's d, those
    or a seed-mean crossing more than 2·DECIDE_WITHIN from α_c (or none): at small d the semantic start keeps
    over-fitted minima that shift the crossing. It names which, with d and n = α·d."""
    far, flips, shifted = [], [], []
    for omega, grp in frame.groupby(R.OMEGA):
        grp = grp.sort_values(R.ALPHA)
        ref = _alpha_c_reference(omega, grp, alpha_c, theory)
        if ST.CALL in grp and not math.isnan(ref):
            far += [f"α {a:g}, ω {omega:g}" for a in grp.loc[grp[ST.CALL] == ST.UNDECIDED, R.ALPHA]
                    if abs(a - ref) > DECIDE_WITHIN]
        if ST.CALL in grp:
            calls = [c for c in grp[ST.CALL] if c != ST.UNDECIDED]
            if sum(c1 != c2 for c1, c2 in zip(calls, calls[1:])) > 1:
                flips.append(f"{omega:g}")
        alphas = grp[R.ALPHA].to_numpy(float)
        if not math.isnan(ref) and alphas.min() < ref < alphas.max():
            found = ST.alpha_c_of(alphas, grp["delta_eps_t_mean"].to_numpy(float))
            if math.isnan(found) or abs(found - ref) > 2 * DECIDE_WITHIN:
                shifted.append(f"{omega:g}")
    reasons = []
    ds = frame[R.D].dropna() if R.D in frame else pd.Series(dtype=float)
    if len(ds) and ds.max() < PAPER[R.D] and (far or flips or shifted):
        d = int(ds.max())
        alphas = frame[R.ALPHA].dropna()
        samples = f"n = α·d = {alphas.min() * d:.0f}–{alphas.max() * d:.0f} samples" if len(alphas) else ""
        reasons.append(f"d = {d} ({samples}), below the paper's d = {PAPER[R.D]}: too small to place the "
                       f"transition\n(finite-size noise can flip the sign of Δε_t near α_c)"
                       + (f"; the seed-mean crossing is more than {2 * DECIDE_WITHIN:g} from α_c at ω = "
                          f"{', '.join(shifted)}" if shifted else ""))
    seeds = int(frame["n_pairs"].min()) if "n_pairs" in frame and len(frame) else 0
    if far:
        reasons.append(f"{seeds} seed(s) leave {len(far)} point(s) more than {DECIDE_WITHIN:g} from α_c "
                       f"undecided (Δε_t not told from 0 by a t-test at 5 %; e.g. {far[0]}): more seeds are "
                       f"needed to place it")
    if flips:
        reasons.append(f"the calls change sign more than once along α at ω = {', '.join(flips)}: "
                       f"too few seeds or too small a d to place the transition")
    if reasons:  # a figure-level label: constrained layout makes room for its lines, not for their width
        lines = [wrapped for reason in reasons for line in reason.split("\n")
                 for wrapped in textwrap.wrap(line, WARNING_WIDTH)]
        fig.supxlabel("\n".join(lines), fontsize=7, color="tab:red")


def _alpha_c_reference(omega: float, grp: pd.DataFrame, alpha_c: ST.Curve | None,
                       theory: pd.DataFrame | None) -> float:
    """α_c at ω for a map's slice: the d → ∞ theory's at its σ and λ where given, else the published table."""
    if theory is not None and ST.LAM_FIXED in grp and grp[ST.LAM_FIXED].notna().any():
        row = theory[np.isclose(theory[R.OMEGA], omega) & np.isclose(theory[ST.LAM_FIXED], grp[ST.LAM_FIXED].iloc[0])
                     & np.isclose(theory[R.SIGMA], grp[R.SIGMA].iloc[0])]
        if len(row) and row[ST.ALPHA_C_THEORY].notna().any():
            return float(row[ST.ALPHA_C_THEORY].dropna().iloc[0])
    return ST.interpolate_curve(alpha_c, omega) if alpha_c else math.nan


def _lambda_star_labels(ax, grid: pd.DataFrame, student: pd.DataFrame) -> None:
    """Beside each point of a λ-CV phase figure, the λ* each initialisation chose there (one value per seed,
    distinct values joined by '/'): its two fits are at these λ, not at the published α_c's λ = 0.01."""
    ok = ST.student_ok(student)
    ok = ok[(ok["source"] == ST.SOURCE_CV) & ok[R.LAMBDA_STAR].notna()]
    for row in grid.itertuples():
        here = ok[np.isclose(ok[R.ALPHA], getattr(row, R.ALPHA)) & np.isclose(ok[R.OMEGA], getattr(row, R.OMEGA))]
        if here.empty:
            continue
        text = "\n".join(f"{init[:3]} " + "/".join(f"{v:g}" for v in sorted(set(here.loc[here[R.INIT] == init,
                                                                                         R.LAMBDA_STAR])))
                         for init in (ST.SEMANTIC, ST.POSITIONAL) if (here[R.INIT] == init).any())
        ax.annotate(text, (getattr(row, R.ALPHA), getattr(row, R.OMEGA)), xytext=(0, 9), textcoords="offset points",
                    rotation=90, ha="center", va="bottom", fontsize=6, color="0.2",
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=0.5))


def _escaped(ax, grid: pd.DataFrame, student: pd.DataFrame) -> None:
    """A cross on each point where some fit ended in the other solution than the one it started from (its
    overlaps name where it ended: student_tables' `reached`), the number of such fits beside it."""
    ok = ST.student_ok(student)
    ok = ok[ok[R.INIT].isin((ST.SEMANTIC, ST.POSITIONAL)) & (ok[R.REACHED] != ok[R.INIT])]
    label = "a start ended in the other solution (count)"
    for row in grid.itertuples():
        here = ok[np.isclose(ok[R.ALPHA], getattr(row, R.ALPHA)) & np.isclose(ok[R.OMEGA], getattr(row, R.OMEGA))
                  & (ok["source"] == row.source)]
        if len(here):
            ax.scatter([getattr(row, R.ALPHA)], [getattr(row, R.OMEGA)], marker="x", c="k", s=40, label=label)
            ax.annotate(str(len(here)), (getattr(row, R.ALPHA), getattr(row, R.OMEGA)), xytext=(5, -9),
                        textcoords="offset points", fontsize=6)
            label = None


def _alpha_c_intervals(ax, crossings: pd.DataFrame, chosen: dict, grid: pd.DataFrame) -> None:
    """Each ω's α_c estimate and 95 % interval (student_tables.crossing_alphas) as a bar across α; a side open to
    ±∞ (the crossing may lie beyond the grid) drawn as an arrow to the map's edge."""
    rows = crossings
    for key, value in chosen.items():
        if key in rows:
            rows = rows[(rows[key] == value) | (rows[key].isna() & pd.isna(value))]
    edge_low, edge_high = float(grid[R.ALPHA].min()), float(grid[R.ALPHA].max())
    label = "α_c here, 95 % interval (arrow: open beyond the grid)"
    for row in rows.itertuples():
        low, high = getattr(row, "alpha_c_low"), getattr(row, "alpha_c_high")
        if pd.isna(low) or pd.isna(high):
            continue
        omega = getattr(row, R.OMEGA)
        left, right = max(low, edge_low - 0.1), min(high, edge_high + 0.1)
        ax.plot([left, right], [omega, omega], color="tab:purple", lw=2, alpha=0.8, label=label)
        label = None
        for end, is_open, marker in ((left, math.isinf(low), "<"), (right, math.isinf(high), ">")):
            ax.plot([end], [omega], marker=marker if is_open else "|", color="tab:purple", ms=8)
        if not pd.isna(getattr(row, "alpha_c_estimate")):
            ax.plot([getattr(row, "alpha_c_estimate")], [omega], "o", color="tab:purple", ms=4)


def phase_diagram_figure(delta_summary: pd.DataFrame, alpha_c: ST.Curve | None = None,
                         alpha_l: ST.Curve | None = None, theory: pd.DataFrame | None = None,
                         student: pd.DataFrame | None = None, crossings: pd.DataFrame | None = None) -> Figure:
    """Each point called from its seeds (student_tables.call_points: semantic, positional or undecided) over
    (α, ω): which solution reaches the lower training loss, with the published
    α_c(ω) (and α_l(ω)) curves (the paper's d → ∞ values at λ = 0.01) and, given `theory`
    (student_tables.theory_alpha_c), the d → ∞ α_c(ω) at the slice's σ and λ. Uses the (source, σ, d, λ) slice
    with the most grid points. For λ-CV points, given the long `student` frame, each point is labelled with the
    λ* of its semantic and positional fits, and a cross marks a point where a fit ended in the other solution.
    Given `crossings` (student_tables.crossing_alphas), each ω's estimated α_c and its 95 % interval are drawn as
    a bar, an arrow where a side is open. Below the paper's d, or where too few seeds decide the points, the
    figure says it cannot place the transition (`size_warning`)."""
    keys = ["source", R.SIGMA, R.D, ST.LAM_FIXED]
    sizes = delta_summary.groupby(keys, dropna=False).size()
    chosen = sizes.idxmax()
    mask = np.logical_and.reduce([(delta_summary[k] == v) | (delta_summary[k].isna() & pd.isna(v))
                                  for k, v in zip(keys, chosen)])
    grid = delta_summary[mask]
    fig, axes = new_figure(size=(6.4, 4.6))
    ax = axes[0, 0]
    for side, color, text in ((ST.SEMANTIC, "tab:blue", "semantic lower (t-test of the seeds' Δε_t, 5 %)"),
                              (ST.POSITIONAL, "tab:red", "positional lower (t-test, 5 %)"),
                              (ST.UNDECIDED, "0.6", "undecided (Δε_t not told from 0 at 5 %)")):
        pts = grid[grid[ST.CALL] == side]
        if len(pts):
            ax.scatter(pts[R.ALPHA], pts[R.OMEGA], c=color, marker="s", s=60, label=text)
    if student is not None:
        _escaped(ax, grid, student)
    lam = f"λ = {PAPER[R.LAMBDA]:g}"
    for curve, style, name in ((alpha_c, "k-", f"α_c(ω), paper: d → ∞, {lam}"),
                               (alpha_l, "k:", f"α_l(ω), paper: d → ∞, {lam}")):
        if curve:
            omegas = sorted(curve)
            ax.plot([curve[o] for o in omegas], omegas, style, lw=1.5, label=name)
    chosen_keys = dict(zip(keys, chosen))
    if theory is not None and not pd.isna(chosen_keys[ST.LAM_FIXED]):
        line = theory[(theory[R.SIGMA] == chosen_keys[R.SIGMA])
                      & (theory[ST.LAM_FIXED] == chosen_keys[ST.LAM_FIXED])]
        line = line[line[ST.ALPHA_C_THEORY].notna()].sort_values(R.OMEGA)
        if len(line):
            ax.plot(line[ST.ALPHA_C_THEORY], line[R.OMEGA], "--", color="tab:green", marker="x", lw=1.5,
                    label="α_c(ω), d → ∞ theory")
    if crossings is not None:
        _alpha_c_intervals(ax, crossings, chosen_keys, grid)
    ax.set_xlabel("α = n / d")
    ax.set_ylabel("ω (weight of the positional teacher)")
    context = ", ".join(f"{SYMBOL.get(k, k)}={v:g}" if isinstance(v, float) else str(v)
                        for k, v in zip(keys, chosen) if not pd.isna(v))
    cv = chosen_keys["source"] == ST.SOURCE_CV
    if cv and student is not None:
        _lambda_star_labels(ax, grid, student)
        context += ")\nλ = λ* of each fit, as labelled (sem: semantic, pos: positional initialisation"
        ax.margins(y=0.35)  # room for the vertical labels
    ax.set_title(f"phase diagram: sign of Δε_t ({context})", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    size_warning(fig, grid, alpha_c, theory)
    return fig
