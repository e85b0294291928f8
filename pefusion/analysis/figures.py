"""The papers' figures, drawn from the analysis tables (pefusion.analysis.fusion_tables, .student_tables) and saved
as PNG (dpi 150) and PDF.

Every figure is a `matplotlib.figure.Figure` on an explicit Agg canvas: no pyplot state, no display needed, and
importing this module never changes the backend of a notebook that imports it.

PE-fusion: paired-seed Δ per PE (the paper's Fig. 3), accuracy and latency per fusion (Fig. 4a/4b), accuracy per
length bucket per fusion. Student: Δε_t and Δε_g against α with the published α_c and α_l, ε_g, m and θ
against α, λ* against α, and the (α, ω) phase diagram with the published α_c(ω) curve; where the tables carry
the d → ∞ theory (student_tables.with_theory, theory_alpha_c) it is drawn dashed beside the simulated points.
Published curves are arguments (dict ω → α), so the figures do not depend on where the constants live.
Hyperparameter search: each trial's score against the searched keys, parallel coordinates, and the epochs per
trial against max_t. Any sweep: what the machine's CPU and GPUs were busy with over its time.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from pefusion import record as R
from pefusion.analysis import formats as FM
from pefusion.analysis import fusion_tables as FT
from pefusion.analysis import runs as RU
from pefusion.analysis import search as S
from pefusion.analysis import student_tables as ST
from pefusion.student.theory import BRANCH_ENDED

DPI = 150
Curve = Mapping[float, float]


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


def _colors(n: int) -> list:
    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _offsets(n: int, width: float = 0.6) -> np.ndarray:
    """Horizontal offsets that spread n series around each category tick."""
    return np.zeros(1) if n == 1 else np.linspace(-width / 2, width / 2, n)


# ---------------------------------------------------------------------------------------------------------
# PE-fusion
# ---------------------------------------------------------------------------------------------------------


def paired_delta_figure(summary: pd.DataFrame, per_seed: pd.DataFrame, pe_type: str, dataset: str) -> Figure:
    """The paper's Fig. 3 for one PE: x = fusion, one point per seed of Δ accuracy (pp) against the baseline,
    and the mean with its 95% t interval."""
    s = summary[summary["pe_type"] == pe_type].reset_index(drop=True)
    p = per_seed[per_seed["pe_type"] == pe_type]
    baseline = s["baseline"].iloc[0] if len(s) else "add"
    fig, axes = new_figure()
    ax = axes[0, 0]
    x = {fu: i for i, fu in enumerate(s["fusion"])}
    seeds = sorted(p["seed"].unique())
    for seed, color, dx in zip(seeds, _colors(len(seeds)), _offsets(len(seeds), 0.4)):
        pts = p[p["seed"] == seed]
        ax.scatter([x[f] + dx for f in pts["fusion"]], pts["delta" + FM.PP], color=color, s=22, label=f"seed {seed}",
                   zorder=2)
    low = np.nan_to_num((s["delta_mean"] - s["ci95_low"]).to_numpy(float))
    high = np.nan_to_num((s["ci95_high"] - s["delta_mean"]).to_numpy(float))
    ax.errorbar(range(len(s)), s["delta_mean"], yerr=[low, high], fmt="D", color="black", capsize=5, ms=6,
                label="mean ± 95 % t-interval (n − 1 df)", zorder=3)
    ax.axhline(0.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks(range(len(s)), [f"{fu}\n(n={n})" for fu, n in zip(s["fusion"], s["n_pairs"])])
    ax.set_xlim(-0.6, max(len(s) - 0.4, 0.6))
    ax.set_ylabel(f"Δ test accuracy vs {baseline} (pp)")
    ax.set_title(f"{pe_type}: paired-seed Δ = fusion − {baseline} ({dataset})", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return fig


def per_fusion_figure(table: pd.DataFrame, fusions: pd.DataFrame, quantity: str, dataset: str) -> Figure:
    """The paper's Fig. 4a (quantity 'test_acc', %) or 4b ('lat_ms', ms/sample): a bar per fusion, pooled over
    PEs and seeds (mean ± std), with each PE's mean ± std over seeds as markers."""
    ylabel = {"test_acc": "test accuracy (%)", "lat_ms": "inference latency (ms / sample)"}[quantity]
    fig, axes = new_figure(size=(7.0, 4.2))
    ax = axes[0, 0]
    order = list(fusions["fusion"])
    ax.bar(range(len(order)), fusions[f"{quantity}_mean"], yerr=np.nan_to_num(fusions[f"{quantity}_std"]),
           color="0.85", edgecolor="0.4", capsize=4, label="all PEs")
    pes = list(dict.fromkeys(table["pe_type"]))
    for pe, color, dx in zip(pes, _colors(len(pes)), _offsets(len(pes), 0.5)):
        rows = table[table["pe_type"] == pe]
        ax.errorbar([order.index(f) + dx for f in rows["fusion"]], rows[f"{quantity}_mean"],
                    yerr=np.nan_to_num(rows[f"{quantity}_std"]), fmt="o", color=color, ms=4, capsize=2, label=pe)
    ax.set_xticks(range(len(order)), order, rotation=20)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{ylabel.split(' (')[0]} per fusion ({dataset})", fontsize=10)
    ax.legend(fontsize=7, ncols=2)
    return fig


def length_bucket_figure(buckets: pd.DataFrame, dataset: str) -> Figure:
    """Test accuracy (%) per document-length bucket, one panel per PE, one line per fusion (mean ± std)."""
    pes = list(dict.fromkeys(buckets["pe_type"]))
    ncols = min(len(pes), 2)
    nrows = math.ceil(len(pes) / ncols)
    fig, axes = new_figure(nrows, ncols, size=(5.2 * ncols, 3.6 * nrows))
    labels = list(dict.fromkeys(buckets["bucket"]))
    for ax, pe in zip(axes.flat, pes):
        rows = buckets[buckets["pe_type"] == pe]
        fusions = list(dict.fromkeys(rows["fusion"]))
        for fu, color, dx in zip(fusions, _colors(len(fusions)), _offsets(len(fusions), 0.2)):
            line = rows[rows["fusion"] == fu].set_index("bucket").reindex(labels)
            ax.errorbar(np.arange(len(labels)) + dx, line["test_acc_mean"], yerr=np.nan_to_num(line["test_acc_std"]),
                        marker="o", ms=4, capsize=3, color=color, label=fu)
        docs = rows.groupby("bucket")["n_docs_mean"].mean().reindex(labels)
        ax.set_xticks(range(len(labels)),
                      [lab if pd.isna(n) else f"{lab}\n(n={n:.0f})" for lab, n in zip(labels, docs)], fontsize=8)
        ax.set_title(pe, fontsize=10)
        ax.set_ylabel("test accuracy (%)")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(pes):]:
        ax.set_visible(False)
    fig.suptitle(f"accuracy per document length (tokens before truncation), {dataset}", fontsize=10)
    return fig


def pefusion_figures(runs: pd.DataFrame, out_dir: str | Path, baseline: str = "add") -> list[Path]:
    """Every PE-fusion figure for the runs of one dataset; returns the PNG paths (PDFs sit beside them)."""
    dataset = FT.one_dataset(RU.pefusion_runs(runs))
    slug = FM.dataset_slug(dataset)
    paths = []
    summary, per_seed = FT.paired_deltas(runs, baseline)
    for pe in dict.fromkeys(summary["pe_type"]):
        paths.append(save_figure(paired_delta_figure(summary, per_seed, pe, dataset), out_dir,
                                 f"paired_deltas_{slug}_{FM.dataset_slug(pe)}"))
    table, fusions = FT.table1(runs), FT.fusion_summary(runs)
    paths.append(save_figure(per_fusion_figure(table, fusions, "test_acc", dataset), out_dir,
                             f"accuracy_per_fusion_{slug}"))
    if fusions["lat_ms_mean"].notna().any():
        paths.append(save_figure(per_fusion_figure(table, fusions, "lat_ms", dataset), out_dir,
                                 f"latency_per_fusion_{slug}"))
    buckets = FT.length_bucket_summary(runs)
    if len(buckets):
        paths.append(save_figure(length_bucket_figure(buckets, dataset), out_dir, f"accuracy_per_length_{slug}"))
    return paths


# ---------------------------------------------------------------------------------------------------------
# Student study
# ---------------------------------------------------------------------------------------------------------

_SYMBOL = {R.OMEGA: "ω", R.SIGMA: "σ", R.D: "d", ST.LAM_FIXED: "λ", "source": ""}


def _groups(frame: pd.DataFrame, keys: Sequence[str]) -> list[tuple[str, pd.DataFrame, tuple]]:
    """(legend label, rows, colour) per group of `keys`; the label names only the keys that vary (ω always)."""
    shown = [k for k in keys if k == R.OMEGA or frame[k].nunique(dropna=False) > 1]
    groups = list(frame.groupby(keys, sort=True, dropna=False))
    out = []
    for (values, rows), color in zip(groups, _colors(len(groups))):
        values = dict(zip(keys, values))
        label = ", ".join(f"{_SYMBOL.get(k, k)}={values[k]:g}" if isinstance(values[k], float) else str(values[k])
                          for k in shown if not pd.isna(values[k]))
        out.append((label, rows.sort_values(R.ALPHA), color))
    return out


def _alpha_lines(ax, omega_colors: Mapping[float, tuple], alpha_c: Curve | None, alpha_l: Curve | None) -> None:
    """Vertical lines at the published α_c(ω) (dashed) and α_l(ω) (dotted) for each ω on the plot, in the
    colour of that ω's first series."""
    for omega, color in omega_colors.items():
        for curve, style, name in ((alpha_c, "--", "α_c"), (alpha_l, ":", "α_l")):
            value = ST.interpolate_curve(curve, omega) if curve else math.nan
            if not math.isnan(value):  # thin, so that the dashed theory curves stay distinguishable
                ax.axvline(value, color=color, ls=style, lw=0.8, alpha=0.7,
                           label=f"{name}(ω={omega:g}) = {value:.3g} (paper, d → ∞, λ = {_PAPER[R.LAMBDA]:g})")


_PAPER = ST.published_setting()


# Characters a line of the warning under a map holds at fontsize 7 in the map's width (a longer line ran off both
# edges).
WARNING_WIDTH = 120
# A map decides a point this far from α_c: points farther than this that stay undecided mean too few seeds.
DECIDE_WITHIN = 0.1


def _size_warning(fig: Figure, frame: pd.DataFrame, alpha_c: Curve | None = None,
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
    if len(ds) and ds.max() < _PAPER[R.D] and (far or flips or shifted):
        d = int(ds.max())
        alphas = frame[R.ALPHA].dropna()
        samples = f"n = α·d = {alphas.min() * d:.0f}–{alphas.max() * d:.0f} samples" if len(alphas) else ""
        reasons.append(f"d = {d} ({samples}), below the paper's d = {_PAPER[R.D]}: too small to place the "
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


def _alpha_c_reference(omega: float, grp: pd.DataFrame, alpha_c: Curve | None,
                       theory: pd.DataFrame | None) -> float:
    """α_c at ω for a map's slice: the d → ∞ theory's at its σ and λ where given, else the published table."""
    if theory is not None and ST.LAM_FIXED in grp and grp[ST.LAM_FIXED].notna().any():
        row = theory[np.isclose(theory[R.OMEGA], omega) & np.isclose(theory[ST.LAM_FIXED], grp[ST.LAM_FIXED].iloc[0])
                     & np.isclose(theory[R.SIGMA], grp[R.SIGMA].iloc[0])]
        if len(row) and row[ST.ALPHA_C_THEORY].notna().any():
            return float(row[ST.ALPHA_C_THEORY].dropna().iloc[0])
    return ST.interpolate_curve(alpha_c, omega) if alpha_c else math.nan


def student_delta_figure(delta_summary: pd.DataFrame, alpha_c: Curve | None = None,
                         alpha_l: Curve | None = None) -> Figure:
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
    _size_warning(fig, delta_summary)
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


def phase_diagram_figure(delta_summary: pd.DataFrame, alpha_c: Curve | None = None,
                         alpha_l: Curve | None = None, theory: pd.DataFrame | None = None,
                         student: pd.DataFrame | None = None, crossings: pd.DataFrame | None = None) -> Figure:
    """Each point called from its seeds (student_tables.call_points: semantic, positional or undecided) over
    (α, ω): which solution reaches the lower training loss, with the published
    α_c(ω) (and α_l(ω)) curves (the paper's d → ∞ values at λ = 0.01) and, given `theory`
    (student_tables.theory_alpha_c), the d → ∞ α_c(ω) at the slice's σ and λ. Uses the (source, σ, d, λ) slice
    with the most grid points. For λ-CV points, given the long `student` frame, each point is labelled with the
    λ* of its semantic and positional fits, and a cross marks a point where a fit ended in the other solution.
    Given `crossings` (student_tables.crossing_alphas), each ω's estimated α_c and its 95 % interval are drawn as
    a bar, an arrow where a side is open. Below the paper's d, or where too few seeds decide the points, the
    figure says it cannot place the transition (`_size_warning`)."""
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
    lam = f"λ = {_PAPER[R.LAMBDA]:g}"
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
    context = ", ".join(f"{_SYMBOL.get(k, k)}={v:g}" if isinstance(v, float) else str(v)
                        for k, v in zip(keys, chosen) if not pd.isna(v))
    cv = chosen_keys["source"] == ST.SOURCE_CV
    if cv and student is not None:
        _lambda_star_labels(ax, grid, student)
        context += ")\nλ = λ* of each fit, as labelled (sem: semantic, pos: positional initialisation"
        ax.margins(y=0.35)  # room for the vertical labels
    ax.set_title(f"phase diagram: sign of Δε_t ({context})", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    _size_warning(fig, grid, alpha_c, theory)
    return fig


def student_figures(student: pd.DataFrame, out_dir: str | Path, alpha_c: Curve | None = None,
                    alpha_l: Curve | None = None, theory_alpha_c: pd.DataFrame | None = None) -> list[Path]:
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


# ---------------------------------------------------------------------------------------------------------
# Hyperparameter search
# ---------------------------------------------------------------------------------------------------------

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
        for (value, rows), color, marker, dx in zip(groups, _colors(len(groups)), _MARKERS * 10,
                                                    _offsets(len(groups), 0.3)):
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


# ---------------------------------------------------------------------------------------------------------
# Any sweep: the machine
# ---------------------------------------------------------------------------------------------------------


def utilisation_figure(points: pd.DataFrame) -> Figure | None:
    """The CPU's utilisation and each GPU's busy time (%) against the minutes since the first sample, one line
    per metric of `points` (runs.system_points: name, timestamp in Unix ms, value); None without samples."""
    if points.empty:
        return None
    fig, axes = new_figure(size=(7.0, 3.6))
    ax = axes[0, 0]
    start = points["timestamp"].min()
    for (name, rows), color in zip(points.groupby("name", sort=False), _colors(points["name"].nunique())):
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
