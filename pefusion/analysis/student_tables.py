"""Study B's tables (student attention): the long frame of student runs (one row per run and initialisation),
per-initialisation summaries, per-seed Δε = ε(positional) − ε(semantic) and their summary with each point called
semantic, positional or undecided from its seeds (a t-test at 5 %), the estimated crossing α_c with every sign
change and its 95 % interval (the t-test inverted along α) beside the published one, and the published α_c(ω), α_l(ω)
curves. With `with_theory` and
`theory_alpha_c`, the d → ∞ prediction (pefusion.student.theory, cached on disk) stands beside each simulated
point: ε_g, ε_t (= −Φ), m and θ of the same branch, σ, λ, ω and α, and α_c(ω) beside the estimated crossing.

Pure functions over the trial frame of pefusion.analysis.runs. Units: the errors ε_g, ε_t, ε_lin, the order
parameters m, θ and the ridge λ, λ* are reported as the runs recorded them (no conversion to percent; that is
for accuracies, in percent, and accuracy deltas, in percentage points (pp), in study A's tables); Δε is in the
units of ε.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, NamedTuple

import numpy as np
import pandas as pd

from pefusion import record as R
from pefusion.analysis.runs import (RUN_ID, START_TIME, SWEEP, AnalysisError, column, latest_ok,
                                    require_metrics, student_runs)
from pefusion.student import theory as TH
from pefusion.student.config import solution_reached

# Student initialisations compared by the Δ quantities (Δε = ε(positional) − ε(semantic), the paper's Fig. 2).
SEMANTIC, POSITIONAL = "semantic", "positional"
STUDENT_KEYS = (R.ALPHA, R.OMEGA, R.SIGMA, R.SEED, R.D)
STUDENT_METRICS = (R.EPS_G, R.EPS_T, R.M, R.THETA)
LAM_FIXED = "lam_fixed"  # the λ of a phase-diagram run; NaN for λ-CV runs, whose λ* is chosen per init
TEACHER_A = "teacher_A"  # the teacher's positional matrix (a point's param; 'default' when not recorded)
STUDENT_COLUMNS = (RUN_ID, START_TIME, "source", R.STATUS, R.ERROR, *STUDENT_KEYS, R.INIT, R.REACHED, TEACHER_A,
                   LAM_FIXED, *STUDENT_METRICS, R.EPS_LIN, R.LAMBDA_STAR)
# The d → ∞ prediction beside a simulated metric: <metric>_theory (θ in the simulations' units, |Q*ᵀQ|/d).
THEORY_SUFFIX = "_theory"
THEORY_METRICS = tuple(f"{m}{THEORY_SUFFIX}" for m in STUDENT_METRICS)
SOURCE_CV, SOURCE_PHASE = "lambda_cv", "phase_diagram"  # one init per run / both inits in one run
Curve = Mapping[float, float]  # a published or d → ∞ α(ω) table (α_c, α_l): ω -> α


def published_alpha_curves() -> tuple[dict[float, float], dict[float, float]]:
    """The student paper's α_c(ω) and α_l(ω) tables (pefusion.student.config)."""
    from pefusion.student.config import ALPHA_C_PUBLISHED, ALPHA_L_PUBLISHED

    return dict(ALPHA_C_PUBLISHED), dict(ALPHA_L_PUBLISHED)


def published_setting() -> dict[str, float]:
    """d, σ and λ of the paper's simulations and of its α_c(ω), α_l(ω) tables (σ = 0.5, λ = 0.01, d = 1000;
    the α tables are its d → ∞ theory)."""
    from pefusion.student.config import REPRODUCTION_POINT

    return {k: REPRODUCTION_POINT[k] for k in (R.D, R.SIGMA, R.LAMBDA)}


def student_frame(trials: pd.DataFrame) -> pd.DataFrame:
    """All student runs as one long frame, one row per (run, initialisation), columns STUDENT_COLUMNS; `reached`
    names the solution each fit ended in from its m and θ (pefusion.student.config.solution_reached), beside the
    initialisation it started from.

    λ-CV runs (param `init`) give one row, their λ* in lam_star; phase-diagram runs (metrics `<metric>_semantic`
    and `<metric>_positional`, or tag pefusion.sweep=phase_diagram) give two rows at their fixed λ (`lam` param)
    in lam_fixed.
    """
    runs = student_runs(trials)
    if runs.empty:
        raise AnalysisError("no student trial runs (runs need params alpha and seed)")
    # A phase-diagram run fits both initialisations: recognised by its metric names, or its sweep tag when it
    # failed before recording any (its params may still carry a config `init`).
    both = column(runs, f"{R.EPS_T}_{SEMANTIC}").notna() | (runs[SWEEP] == SOURCE_PHASE)
    one_init, both_inits = runs[~both], runs[both]
    if len(one_init):
        require_metrics(one_init[one_init[R.STATUS] == R.STATUS_OK], [R.EPS_G, R.EPS_T])
    if len(both_inits):
        require_metrics(both_inits[both_inits[R.STATUS] == R.STATUS_OK],
                        [f"{m}_{init}" for m in (R.EPS_G, R.EPS_T) for init in (SEMANTIC, POSITIONAL)])
    parts = [pd.DataFrame({
        RUN_ID: one_init[RUN_ID], START_TIME: one_init[START_TIME], "source": SOURCE_CV,
        R.STATUS: one_init[R.STATUS], R.ERROR: one_init[R.ERROR],
        **{k: column(one_init, k) for k in STUDENT_KEYS}, R.INIT: column(one_init, R.INIT).fillna("unknown"),
        TEACHER_A: column(one_init, TEACHER_A).fillna("default"), LAM_FIXED: np.nan,
        **{m: column(one_init, m) for m in (*STUDENT_METRICS, R.EPS_LIN, R.LAMBDA_STAR)},
    })]
    for init in (SEMANTIC, POSITIONAL):
        parts.append(pd.DataFrame({
            RUN_ID: both_inits[RUN_ID], START_TIME: both_inits[START_TIME], "source": SOURCE_PHASE,
            R.STATUS: both_inits[R.STATUS], R.ERROR: both_inits[R.ERROR],
            **{k: column(both_inits, k) for k in STUDENT_KEYS}, R.INIT: init,
            TEACHER_A: column(both_inits, TEACHER_A).fillna("default"), LAM_FIXED: column(both_inits, R.LAMBDA),
            **{m: column(both_inits, f"{m}_{init}") for m in STUDENT_METRICS},
            R.EPS_LIN: column(both_inits, R.EPS_LIN), R.LAMBDA_STAR: np.nan,
        }))
    frame = pd.concat([p for p in parts if len(p)], ignore_index=True)
    frame = frame.assign(**{c: frame[c].astype(float) for c in (R.ALPHA, R.OMEGA, R.SIGMA, R.D, LAM_FIXED,
                                                                 *STUDENT_METRICS, R.EPS_LIN, R.LAMBDA_STAR)})
    # where each fit ended, from its overlaps (a start that escaped to the other solution says so)
    frame[R.REACHED] = solution_reached(frame[R.M].to_numpy(), frame[R.THETA].to_numpy())
    return frame[list(STUDENT_COLUMNS)]


def student_ok(student: pd.DataFrame) -> pd.DataFrame:
    """The ok student rows, the most recent per (source, alpha, omega, sigma, seed, d, fixed λ, init)."""
    ok = student[student[R.STATUS] == R.STATUS_OK]
    return latest_ok(ok, ["source", *STUDENT_KEYS, LAM_FIXED, R.INIT])[0]


def student_summary(student: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std over seeds of ε_g, ε_t, m, θ, ε_lin, λ* per (source, alpha, omega, sigma, d,
    fixed λ, init); lam_fixed is the λ of phase-diagram runs and NaN for λ-CV runs (their λ is lam_star)."""
    keys = ["source", R.ALPHA, R.OMEGA, R.SIGMA, R.D, LAM_FIXED, R.INIT]
    values = [*STUDENT_METRICS, R.EPS_LIN, R.LAMBDA_STAR, *(m for m in THEORY_METRICS if m in student)]
    grouped = student_ok(student).groupby(keys, sort=True, dropna=False)
    out = grouped[values].agg(["mean", lambda v: v.std(ddof=1)])
    out.columns = [f"{m}_{'mean' if s == 'mean' else 'std'}" for m, s in out.columns]
    out.insert(0, "n_seeds", grouped[R.SEED].nunique())
    return out.reset_index()


DELTA_COLUMNS = ["source", *STUDENT_KEYS, LAM_FIXED, "eps_g_semantic", "eps_g_positional", "eps_t_semantic",
                 "eps_t_positional", "delta_eps_g", "delta_eps_t"]


def student_deltas(student: pd.DataFrame) -> pd.DataFrame:
    """Per-seed pairs of positional and semantic runs at the same (alpha, omega, sigma, seed, d) — and the same
    λ for phase-diagram runs — with Δε_g and Δε_t = ε(positional) − ε(semantic), and the theory's Δ beside
    them when the frame has it (`with_theory`)."""
    ok = student_ok(student)
    keys = ["source", *STUDENT_KEYS, LAM_FIXED]
    metrics = [m for m in (R.EPS_G, R.EPS_T, *(f"{m}{THEORY_SUFFIX}" for m in (R.EPS_G, R.EPS_T))) if m in ok]
    side = {init: ok.loc[ok[R.INIT] == init, [*keys, *metrics]].rename(
        columns={m: f"{m}_{init}" for m in metrics}) for init in (SEMANTIC, POSITIONAL)}
    # merge matches NaN keys with NaN keys, so runs of other tools without sigma or d still pair.
    wide = side[SEMANTIC].merge(side[POSITIONAL], on=keys, how="inner")
    for m in metrics:
        wide[f"delta_{m}"] = wide[f"{m}_positional"] - wide[f"{m}_semantic"]
    theory = [f"delta_{m}" for m in metrics if m.endswith(THEORY_SUFFIX)]
    return wide[DELTA_COLUMNS + theory].sort_values(keys, kind="stable").reset_index(drop=True)


DELTA_GROUP = ["source", R.ALPHA, R.OMEGA, R.SIGMA, R.D, LAM_FIXED]


UNDECIDED = "undecided"
CALL = "call"  # semantic, positional or undecided: the point called from its seeds
CALL_LEVEL = 0.95  # a point is called where the two-sided t-test of mean Δε_t = 0 rejects at 1 − CALL_LEVEL


def call_points(mean: np.ndarray, se: np.ndarray, n: np.ndarray, level: float = CALL_LEVEL) -> np.ndarray:
    """Each point called from its n seeds' paired gaps Δε_t (mean and standard error sd/√n): 'semantic' where
    the mean is above 0 by more than t_{n−1}·SE (the semantic solution has the lower training loss),
    'positional' where it is below by more, 'undecided' otherwise — the two-sided t-test at 1 − level (5 %:
    t_3 = 3.18 SE with 4 seeds, t_7 = 2.36 with 8). Always undecided with one seed (no SE): one fit pair cannot
    tell the global minimum from seed noise near α_c."""
    from scipy import special  # stats.t.ppf without its argument checks (simulations call this often)

    mean, se, n = (np.asarray(v, dtype=float) for v in (mean, se, n))
    with np.errstate(invalid="ignore"):
        critical = np.where(n >= 2, special.stdtrit(np.maximum(n - 1, 1), (1 + level) / 2), np.nan)
    decided = np.abs(mean) > critical * se  # False where se or the critical value is NaN
    return np.where(decided & (mean > 0), SEMANTIC, np.where(decided & (mean < 0), POSITIONAL, UNDECIDED))


def student_delta_summary(deltas: pd.DataFrame) -> pd.DataFrame:
    """Mean, sample std and standard error (std/√n) over seeds of Δε_g and Δε_t per (source, alpha, omega,
    sigma, d, fixed λ); which solution has the lower seed-mean training loss there (lower_train_loss, the sign
    alone: Δε_t > 0 semantic, < 0 positional) and the point's `call`, that sign where the t-test over the seeds'
    gaps rejects 0 at 5 % and 'undecided' otherwise (`call_points`)."""
    columns = [*DELTA_GROUP, "n_pairs", "delta_eps_g_mean", "delta_eps_g_std", "delta_eps_t_mean",
               "delta_eps_t_std", "delta_eps_t_se", "lower_train_loss", CALL]
    if deltas.empty:
        return pd.DataFrame(columns=columns)
    grouped = deltas.groupby(DELTA_GROUP, sort=True, dropna=False)
    theory = [c for c in deltas if c.endswith(THEORY_SUFFIX)]  # the d → ∞ Δ, mean over the seeds' λ
    out = pd.DataFrame({
        "n_pairs": grouped["delta_eps_t"].size(),
        "delta_eps_g_mean": grouped["delta_eps_g"].mean(),
        "delta_eps_g_std": grouped["delta_eps_g"].std(ddof=1),
        "delta_eps_t_mean": grouped["delta_eps_t"].mean(),
        "delta_eps_t_std": grouped["delta_eps_t"].std(ddof=1),
        **{c: grouped[c].mean() for c in theory},
    }).reset_index()
    out["delta_eps_t_se"] = out["delta_eps_t_std"] / np.sqrt(out["n_pairs"])
    out["lower_train_loss"] = np.select([out.delta_eps_t_mean > 0, out.delta_eps_t_mean < 0],
                                        [SEMANTIC, POSITIONAL], "tie")
    out[CALL] = call_points(out["delta_eps_t_mean"], out["delta_eps_t_se"], out["n_pairs"])
    return out[columns + theory]


def interpolate_curve(curve: Curve, omega: float) -> float:
    """A published α(ω) table read at ω (linear between tabulated ω; NaN outside the table)."""
    omegas = np.array(sorted(curve))
    if not omegas[0] <= omega <= omegas[-1]:
        return math.nan
    return float(np.interp(omega, omegas, [curve[o] for o in omegas]))


def sign_changes(alpha: np.ndarray, gap: np.ndarray) -> list[tuple[float, str]]:
    """Every sign change of a gap along α (sorted α; a zero counts with the side it joins): (α where the line
    between the two grid points around it crosses 0, '-+' or '+-'), in order of α."""
    out = []
    keep = ~np.isnan(gap)
    a, y = alpha[keep], gap[keep]
    for i in range(len(a) - 1):
        if (y[i] < 0 <= y[i + 1]) or (y[i] >= 0 > y[i + 1]):
            out.append((float(a[i] + (a[i + 1] - a[i]) * (-y[i]) / (y[i + 1] - y[i])), "-+" if y[i] < 0 else "+-"))
    return out


def alpha_c_of(alpha: np.ndarray, gap: np.ndarray) -> float:
    """The crossing α_c of one gap curve: the first − → + sign change (positional lower below it), NaN if none."""
    return next((a for a, kind in sign_changes(alpha, gap) if kind == "-+"), math.nan)


ALPHA_C_LEVEL = 0.95


class AlphaCInterval(NamedTuple):
    low: float  # -inf: the crossing may lie below the grid
    high: float  # +inf: it may lie above it
    why: str  # "" for an interval closed on both sides; else why a side is open, or why there is none (NaN)


def _segment_zeros(alpha: np.ndarray, bound: np.ndarray, left: int) -> list[float]:
    """Where `bound` (one side of the points' intervals) crosses 0 between alpha[left] and alpha[left + 1]: on
    the line through those two points and on the parabolas through them and a third neighbour (each side that
    exists). Their spread is the interpolation error between grid points."""
    lo, hi = alpha[left], alpha[left + 1]
    zeros = [float(lo + (hi - lo) * (-bound[left]) / (bound[left + 1] - bound[left]))]
    for first in (left - 1, left):
        if first < 0 or first + 3 > len(alpha):
            continue
        for root in np.roots(np.polyfit(alpha[first:first + 3], bound[first:first + 3], 2)):
            if abs(root.imag) < 1e-12 and lo <= root.real <= hi:
                zeros.append(float(root.real))
    return zeros


def alpha_c_interval(per_seed: np.ndarray, alpha: np.ndarray, level: float = ALPHA_C_LEVEL) -> AlphaCInterval:
    """The interval of α_c, the first − → + crossing of the mean gap Δε_t along α, by inverting each point's
    t-test: per_seed (S, A) holds each seed's Δε_t at each α of the sorted `alpha` (NaN where a seed has no pair;
    points with fewer than 2 seeds are left out). At each α the seed mean's two-sided t-interval at `level`
    (t with n − 1 degrees of freedom) says whether the gap is confidently negative (its upper end < 0), positive
    (its lower end > 0) or either; α_c lies after the last confidently negative point before the first
    confidently positive one that follows it, and before that positive one. The ends are where the intervals'
    upper and lower ends cross 0 between those grid points, on the line through the two points and on the
    parabolas through a third neighbour, the outermost of these (so interpolation error is inside the interval).

    A side is open (±inf) where no point on it is confidently signed — the crossing may lie beyond the grid —
    and `why` says so; NaN on both sides only where fewer than two α have two seeds. Calibrated by simulation
    (tests/test_analysis.py) on the demo's grid with seed noise correlated along α."""
    from scipy import special  # stats.t.ppf without its argument checks (simulations call this often)

    per_seed, alpha = np.asarray(per_seed, dtype=float), np.asarray(alpha, dtype=float)
    n = (~np.isnan(per_seed)).sum(0)
    usable = n >= 2
    if usable.sum() < 2:
        return AlphaCInterval(math.nan, math.nan, "fewer than two α with two seeds or more: no interval")
    values, a, n = per_seed[:, usable], alpha[usable], n[usable]
    mean = np.nanmean(values, axis=0)
    half = special.stdtrit(n - 1, (1 + level) / 2) * np.nanstd(values, axis=0, ddof=1) / np.sqrt(n)
    upper, lower = mean + half, mean - half
    negative, positive = np.flatnonzero(upper < 0), np.flatnonzero(lower > 0)
    if len(negative):  # the first confidently positive point after the first confidently negative one
        positive = positive[positive > negative[0]]
        if len(positive):
            negative = negative[negative < positive[0]]
    why = []
    if len(negative):
        last = negative[-1]
        low = float(a[-1]) if last == len(a) - 1 else min(_segment_zeros(a, upper, last))
    else:
        low = -math.inf
        why.append("open below: the gap is not confidently negative at any α before it")
    if len(positive):
        first = positive[0]
        high = float(a[0]) if first == 0 else max(_segment_zeros(a, lower, first - 1))
    else:
        high = math.inf
        why.append("open above: the gap is not confidently positive at any α after it")
    return AlphaCInterval(low, high, "; ".join(why))


CROSSING_COLUMNS = ["n_alpha", "n_seeds", "alpha_c_estimate", "alpha_c_low", "alpha_c_high", "alpha_c_open",
                    "sign_changes", "n_sign_changes", "n_call_changes", "alpha_c_published"]


def crossing_alphas(deltas: pd.DataFrame, alpha_c: Curve | None = None,
                    theory: pd.DataFrame | None = None) -> pd.DataFrame:
    """Where the seed-mean Δε_t changes sign along α, per (source, omega, sigma, d, fixed λ), from the per-seed
    pairs of `student_deltas`.

    alpha_c_estimate: the first − → + change (positional lower below it), linear between the grid points around
    it (NaN if none); alpha_c_low/high: its 95 % interval (`alpha_c_interval`), ±inf on a side where the
    crossing may lie beyond the grid, with alpha_c_open saying which and why ('' when closed); sign_changes:
    EVERY change of the seed-mean's sign, as 'α(−+)' or 'α(+−)', ';'-joined, and their number; n_call_changes:
    how often the points' calls (`call_points`) change between semantic and positional along α, undecided
    points skipped — more than one means the map cannot place a single transition. Beside: the published α_c(ω) and, given `theory`
    (`theory_alpha_c`), the d → ∞ α_c."""
    keys = [k for k in DELTA_GROUP if k != R.ALPHA]
    rows = []
    for group, grp in deltas.groupby(keys, sort=True, dropna=False):
        per_seed = grp.pivot_table(index=R.SEED, columns=R.ALPHA, values="delta_eps_t", aggfunc="mean")
        a = per_seed.columns.to_numpy(float)
        values = per_seed.to_numpy(float)  # (S, A)
        mean = per_seed.mean().to_numpy(float)
        se = (per_seed.std(ddof=1) / np.sqrt(per_seed.count())).to_numpy(float)
        changes = sign_changes(a, mean)
        calls = [c for c in call_points(mean, se, per_seed.count().to_numpy(float)) if c != UNDECIDED]
        low, high, why = alpha_c_interval(values, a)
        omega = dict(zip(keys, group))[R.OMEGA]
        rows.append({**dict(zip(keys, group)), "n_alpha": len(a), "n_seeds": len(per_seed),
                     "alpha_c_estimate": alpha_c_of(a, mean), "alpha_c_low": low, "alpha_c_high": high,
                     "alpha_c_open": why,
                     "sign_changes": ";".join(f"{x:.3f}({kind[0]}{kind[1]})".replace("-", "−") for x, kind in changes),
                     "n_sign_changes": len(changes),
                     "n_call_changes": sum(c1 != c2 for c1, c2 in zip(calls, calls[1:])),
                     "alpha_c_published": interpolate_curve(alpha_c, omega) if alpha_c else math.nan})
    out = pd.DataFrame(rows, columns=[*keys, *CROSSING_COLUMNS])
    if theory is None:
        return out
    return out.merge(theory, on=[R.SIGMA, LAM_FIXED, R.OMEGA], how="left")


# ---------------------------------------------------------------------------------------------------------
# The d → ∞ theory beside the simulations (pefusion.student.theory; computed once per point, cached on disk)
# ---------------------------------------------------------------------------------------------------------

ALPHA_C_THEORY = "alpha_c_theory"


def with_theory(student: pd.DataFrame, cache_dir: str | Path, solver: TH.Solver = TH.Solver()) -> pd.DataFrame:
    """The long frame with THEORY_METRICS: the fixed point of the row's branch (its init) at its α, ω, σ, teacher
    A and λ (the fixed λ of a phase-diagram run, the chosen λ* of a λ-CV run); ε_t's theory is −Φ, θ's is in the
    simulations' units. NaN for random initialisations, failed runs and points whose theory did not converge.
    Computed points are cached in <cache_dir>/student_theory_points.csv."""
    lam = student[LAM_FIXED].fillna(student[R.LAMBDA_STAR])
    points = pd.DataFrame({"sigma": student[R.SIGMA], "lam": lam, "omega": student[R.OMEGA],
                           "teacher_A": student[TEACHER_A], "alpha": student[R.ALPHA], "branch": student[R.INIT]})
    usable = (student[R.STATUS] == R.STATUS_OK) & points["branch"].isin(TH.BRANCHES) & points.notna().all(1)
    out = student.drop(columns=[c for c in THEORY_METRICS if c in student])
    if not usable.any():
        return out.assign(**{c: np.nan for c in THEORY_METRICS})
    solved = TH.cached_points(points[usable], cache_dir, solver)
    theory = solved.assign(**{
        f"{R.EPS_G}{THEORY_SUFFIX}": solved["eps_g"], f"{R.EPS_T}{THEORY_SUFFIX}": -solved["phi"],
        f"{R.M}{THEORY_SUFFIX}": solved["m"].abs(),
        f"{R.THETA}{THEORY_SUFFIX}": TH.simulation_theta(solved["theta"], solved["sigma"])})
    keys = list(points.columns)
    merged = points.merge(theory[[*keys, *THEORY_METRICS]], on=keys, how="left")
    merged.index = points.index
    return out.assign(**{c: merged[c].where(usable) for c in THEORY_METRICS})


def theory_alpha_c(delta_summary: pd.DataFrame, cache_dir: str | Path,
                   solver: TH.Solver = TH.Solver()) -> pd.DataFrame:
    """The d → ∞ α_c(ω) for every (σ, fixed λ, ω) of the phase-diagram rows (λ-CV rows have no single λ):
    columns sigma, lam_fixed, omega, alpha_c_theory; cached in <cache_dir>/student_theory_alpha_c.csv."""
    fixed = delta_summary[delta_summary[LAM_FIXED].notna() & delta_summary[R.SIGMA].notna()]
    rows = []
    for (sigma, lam), grp in fixed.groupby([R.SIGMA, LAM_FIXED], sort=True):
        omegas = sorted(set(grp[R.OMEGA].dropna()))
        for omega, value in TH.cached_alpha_c(omegas, cache_dir, sigma, lam, solver=solver).items():
            rows.append({R.SIGMA: sigma, LAM_FIXED: lam, R.OMEGA: omega, ALPHA_C_THEORY: value})
    return pd.DataFrame(rows, columns=[R.SIGMA, LAM_FIXED, R.OMEGA, ALPHA_C_THEORY])
