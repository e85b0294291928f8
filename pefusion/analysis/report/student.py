"""The student study's sections of the report: the positional-against-semantic gaps and their calls, the
estimated α_c beside the published one, each initialisation's simulations and the d → ∞ theory at the same points
(solved, or read from its cache, once), with the figures.
"""
from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Callable

import pandas as pd

from pefusion import record as R
from pefusion.analysis import formats as FM
from pefusion.analysis import student_tables as ST
from pefusion.analysis.figures.student import student_figures
from pefusion.analysis.outputs import student_with_theory, write_student_frame_tables
from pefusion.analysis.report.markup import image_html, table_html
from pefusion.student.theory import CACHE_POINTS, Solver


def student_sections(trials: pd.DataFrame, out: Path, alpha_c: ST.Curve | None, alpha_l: ST.Curve | None,
                     theory: Solver | None, say: Callable[[str], None]) -> tuple[list[str], list[Path]]:
    if theory is not None:  # solving it takes minutes the first time: the user is told, then how long it took
        cache = out / CACHE_POINTS
        say(f"report: the d → ∞ theory from {cache}, solving the points not in it yet" if cache.exists() else
            f"report: solving the d → ∞ theory at every point (minutes; cached in {cache}, so the next report of "
            f"these points takes seconds)")
    started = time.perf_counter()
    student, alpha_c_theory = student_with_theory(trials, out, theory)  # the theory computed (or read) once
    if theory is not None:
        say(f"report: the d → ∞ theory ready in {time.perf_counter() - started:.0f} s")
    written = write_student_frame_tables(student, alpha_c_theory, out, alpha_c)
    figures = student_figures(student, out / "figures", alpha_c, alpha_l, alpha_c_theory)
    deltas = ST.student_deltas(student)
    delta_summary = ST.student_delta_summary(deltas)
    published = "" if alpha_c else " (published α_c(ω) unavailable: pefusion.student has no ALPHA_C_PUBLISHED)"
    beside = "" if theory is None else (
        f"<p class='muted'>Columns marked d → ∞ theory are the prediction "
        f"(pefusion.student.theory: each branch followed from α = 2, {theory.nodes}³ Gauss–Hermite nodes × "
        f"2·{theory.zeta_nodes} along ζ split at the proximal switch) at each point's α, ω, σ and λ "
        f"(λ* for λ-CV runs): ε_t's is −Φ, θ's is |Q*ᵀQ|/d; dashed lines on the figures; empty where the "
        f"point's branch has ended.</p>")
    summary = ST.student_summary(student)
    slice_keys = ("source", R.OMEGA, R.SIGMA, R.D, ST.LAM_FIXED)
    same, in_every_row = FM.constant_columns(summary, slice_keys)
    where = f" In every row: {in_every_row}." if in_every_row else ""
    simulated = [c for c in summary if not c.endswith(("_theory_mean", "_theory_std"))]
    theory_cols = [c for c in summary if c not in simulated]
    keys = [c for c in ("source", R.ALPHA, R.OMEGA, R.SIGMA, R.D, ST.LAM_FIXED, R.INIT, "n_seeds") if c in summary]
    parts = [
        "<h2>Positional vs semantic solutions</h2>", beside,
        table_html(FM.display(delta_summary, drop=tuple(FM.constant_columns(delta_summary, slice_keys)[0])),
                    "Δε = ε(positional) − ε(semantic), mean ± sample SD over seeds (SE = SD/√n): Δε_t > 0 means the "
                    "semantic solution reaches the lower training loss; a point is called semantic or positional "
                    "where a two-sided t-test of its seeds' gaps (n − 1 degrees of freedom) rejects 0 at 5 % "
                    "(|mean| > 3.18 SE with 4 seeds, 2.36 with 8), undecided otherwise; simulated, a point whose "
                    f"gap is 0 is called 5 % of the time.{where}"),
        f"<h3>Estimated α_c beside the published one{html.escape(published)}</h3>",
        table_html(FM.display(ST.crossing_alphas(deltas, alpha_c, alpha_c_theory)),
                    "α_c: the first − → + sign change of the seed-mean Δε_t, linear between grid points, with its "
                    "95 % interval: from after the last α whose gap's 95 % t-interval lies below 0 to the first "
                    "α after it whose interval lies above 0, the ends where those intervals cross 0, "
                    "interpolated on lines and parabolas through the grid points (the outermost); −∞ or ∞ where "
                    "no point on that side is told from 0 (the crossing may lie beyond the grid, said in the "
                    "open column). Simulated on the demo's grid it holds the true crossing 98 % of the time "
                    "with 4 seeds and 97.5 % with 8. sign_changes lists every change of the mean's sign; "
                    "n_call_changes counts changes between points called semantic or positional, undecided "
                    "points skipped."),
        "<h3>Per initialisation</h3>",
        table_html(FM.display(summary[simulated], drop=tuple(same)),
                    f"Simulations: mean ± sample SD over seeds.{where}"),
    ]
    if theory_cols:
        parts.append(table_html(FM.display(summary[keys + theory_cols], drop=tuple(same)),
                                 "The d → ∞ theory at the same points (for λ-CV runs at each seed's λ*: mean ± SD "
                                 "over seeds)."))
    parts += [image_html(p) for p in figures]
    return parts, written + figures
