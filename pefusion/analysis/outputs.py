"""The files each study's analysis writes: result CSVs (+ Markdown and LaTeX for the summary table), the paired
deltas, the student tables with the d → ∞ theory beside them, and every figure the runs allow; what
`make_table1.py`, `paired_deltas.py` and `make_figures.py` write alone and the HTML report (`analysis.report`)
writes with its page.

Everything is written under an output folder (default `results/`), figures under `<out>/figures/`. Accuracies
in every CSV are in percent and accuracy deltas in percentage points (see pefusion.analysis.fusion_tables).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from pefusion import record as R
from pefusion.analysis import formats as FM
from pefusion.analysis import fusion_tables as FT
from pefusion.analysis import runs as RU
from pefusion.analysis import student_tables as ST
from pefusion.analysis.figures.canvas import save_figure
from pefusion.analysis.figures.fusion import paired_delta_figure, pefusion_figures
from pefusion.analysis.figures.student import student_figures
from pefusion.student.theory import CACHE_ALPHA_C, CACHE_POINTS, Solver


def per_dataset(trials: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(dataset, its PE-fusion runs) for each dataset of the trials; an AnalysisError without PE-fusion runs."""
    runs = RU.pefusion_runs(trials)
    if runs.empty:
        raise RU.AnalysisError("no PE-fusion trial runs in the selection (runs need params dataset, pe_type, fusion, "
                               "seed); for the student study pass --experiment student-attention")
    return [(ds, runs[runs[R.DATASET].astype(str) == ds]) for ds in FT.datasets(runs)]


def write_table1(trials: pd.DataFrame, out: str | Path) -> list[Path]:
    """summary_<dataset>.csv (accuracies in %, `_pct` headers), .md and .tex for each dataset of the PE-fusion runs:
    the summary table, named for what it is rather than for a paper table (it reproduces Table 3 for ArXiv-11,
    Table 1 for AG News and IMDB)."""
    out, paths = Path(out), []
    for dataset, runs in per_dataset(trials):
        slug, table = FM.dataset_slug(dataset), FT.table1(runs)
        paths.append(FM.write_csv(table, out / f"summary_{slug}.csv"))
        display = FT.table1_display(table, digits=2)  # the paper's Table 3 prints 2 decimals
        (out / f"summary_{slug}.md").write_text(f"Test accuracy (%), mean ± sample std over seeds — {dataset}\n\n"
                                                 + FM.to_markdown(display))
        (out / f"summary_{slug}.tex").write_text(FM.to_latex(
            display, f"Test accuracy (%) mean ± std over seeds, parameters and latency (ms/sample), {dataset}"))
        paths += [out / f"summary_{slug}.md", out / f"summary_{slug}.tex"]
    return paths


def write_paired_deltas(trials: pd.DataFrame, out: str | Path, baseline: str = "add",
                        figures: bool = True) -> list[Path]:
    """paired_deltas_<dataset>.csv, paired_deltas_per_seed_<dataset>.csv (pp) and, with `figures`, one Fig. 3-style
    figure per PE."""
    out, paths = Path(out), []
    for dataset, runs in per_dataset(trials):
        slug = FM.dataset_slug(dataset)
        summary, per_seed = FT.paired_deltas(runs, baseline)
        paths.append(FM.write_csv(summary, out / f"paired_deltas_{slug}.csv"))
        paths.append(FM.write_csv(per_seed, out / f"paired_deltas_per_seed_{slug}.csv"))
        for pe in dict.fromkeys(summary["pe_type"]) if figures else ():
            paths.append(save_figure(paired_delta_figure(summary, per_seed, pe, dataset), out / "figures",
                                       f"paired_deltas_{slug}_{FM.dataset_slug(pe)}"))
    return paths


def write_pefusion_summaries(trials: pd.DataFrame, out: str | Path) -> list[Path]:
    """fusion_summary_<dataset>.csv and length_buckets_<dataset>.csv (accuracies in %)."""
    out, paths = Path(out), []
    for dataset, runs in per_dataset(trials):
        slug = FM.dataset_slug(dataset)
        paths.append(FM.write_csv(FT.fusion_summary(runs), out / f"fusion_summary_{slug}.csv"))
        buckets = FT.length_bucket_summary(runs)
        if len(buckets):
            paths.append(FM.write_csv(buckets, out / f"length_buckets_{slug}.csv"))
    return paths


def student_with_theory(trials: pd.DataFrame, out: str | Path,
                        theory: Solver | None) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The long student frame and the d → ∞ α_c per fixed (σ, λ, ω), with the theory beside every point
    (computed by `theory`, cached under <out>); without `theory` the frame alone and None."""
    student = ST.student_frame(trials)
    if theory is None:
        return student, None
    student = ST.with_theory(student, out, theory)
    delta_summary = ST.student_delta_summary(ST.student_deltas(student))
    return student, ST.theory_alpha_c(delta_summary, out, theory)


def theory_files(out: str | Path) -> list[Path]:
    """The theory's cache files under <out> that exist (logged with the report)."""
    return [p for p in (Path(out) / CACHE_POINTS, Path(out) / CACHE_ALPHA_C) if p.exists()]


def write_student_tables(trials: pd.DataFrame, out: str | Path, alpha_c: ST.Curve | None = None,
                         theory: Solver | None = Solver()) -> list[Path]:
    """student_runs.csv (long frame), student_summary.csv, student_deltas.csv (per seed),
    student_delta_summary.csv and student_alpha_c.csv (estimated crossing beside the published α_c); with
    `theory`, the d → ∞ prediction beside each simulated value (<metric>_theory, alpha_c_theory) and the
    theory's cache files."""
    return write_student_frame_tables(*student_with_theory(trials, out, theory), Path(out), alpha_c)


def write_student_frame_tables(student: pd.DataFrame, alpha_c_theory: pd.DataFrame | None, out: Path,
                               alpha_c: ST.Curve | None) -> list[Path]:
    """write_student_tables from the student frame with its theory (`student_with_theory`)."""
    deltas = ST.student_deltas(student)
    delta_summary = ST.student_delta_summary(deltas)
    tables = {"student_runs": student, "student_summary": ST.student_summary(student), "student_deltas": deltas,
              "student_delta_summary": delta_summary,
              "student_alpha_c": ST.crossing_alphas(deltas, alpha_c, alpha_c_theory)}
    return [FM.write_csv(frame, out / f"{name}.csv") for name, frame in tables.items()] + theory_files(out)


def write_figures(trials: pd.DataFrame, out: str | Path, baseline: str = "add", alpha_c: ST.Curve | None = None,
                  alpha_l: ST.Curve | None = None, theory: Solver | None = Solver()) -> list[Path]:
    """Every figure the runs allow (PE-fusion ones per dataset, student ones, with the d → ∞ theory computed by
    `theory` and cached under <out>) into <out>/figures; PNG paths."""
    paths: list[Path] = []
    if len(RU.pefusion_runs(trials)):
        for _, runs in per_dataset(trials):
            paths += pefusion_figures(runs, Path(out) / "figures", baseline)
    if len(RU.student_runs(trials)):
        student, alpha_c_theory = student_with_theory(trials, out, theory)
        paths += student_figures(student, Path(out) / "figures", alpha_c, alpha_l, alpha_c_theory)
    if not paths:
        raise RU.AnalysisError("the trial runs have neither PE-fusion params (dataset, pe_type, fusion, seed) nor "
                               "student params (alpha, seed): nothing to plot")
    return paths
