"""Write what the analysis scripts produce: result CSVs (+ markdown and LaTeX for Table 1), figures, and one
self-contained HTML page per sweep, logged back to the sweep's MLflow parent run.

Everything is written under an output folder (default `results/`), figures under `<out>/figures/`. Accuracies
in every CSV are in percent and accuracy deltas in percentage points (see pefusion.analysis.fusion_tables).
"""
from __future__ import annotations

import base64
import html
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd

from pefusion import record as R
from pefusion.analysis import compute as CO
from pefusion.analysis import formats as FM
from pefusion.analysis import fusion_tables as FT
from pefusion.analysis import runs as RU
from pefusion.analysis import search as SE
from pefusion.analysis import student_tables as ST
from pefusion.analysis.figures.canvas import save_figure
from pefusion.analysis.figures.fusion import paired_delta_figure, pefusion_figures
from pefusion.analysis.figures.search import search_budget_figure, search_parallel_figure, search_score_figure
from pefusion.analysis.figures.student import student_figures
from pefusion.analysis.figures.utilisation import utilisation_figure
from pefusion.student.theory import CACHE_ALPHA_C, CACHE_POINTS, Solver
from pefusion.tracking.store import log_artifacts_to_run, ui_link

Curve = Mapping[float, float]


def notes(sweep: RU.Sweep) -> list[str]:
    """One-line remarks a reader of the tables must know: failed, superseded and unfinished runs."""
    out = []
    trials = sweep.trials
    n_failed = len(RU.failed(trials))
    if n_failed:
        out.append(f"{n_failed} of {len(trials)} trial runs failed (diverged or error): excluded from every mean, "
                   f"counted, and listed in the report")
    superseded = 0
    if len(RU.pefusion_runs(trials)) and not is_search(sweep):  # a search's trials share one identity on purpose
        superseded += RU.latest_ok(RU.pefusion_runs(trials), RU.PEFUSION_IDENTITY)[1]
    if len(RU.student_runs(trials)):
        student = ST.student_frame(trials)
        superseded += int((student[R.STATUS] == R.STATUS_OK).sum()) - len(ST.student_ok(student))
    n_stopped = int((trials[R.STATUS] == R.STATUS_STOPPED).sum())
    if n_stopped and is_search(sweep):
        out.append(f"{n_stopped} trials were stopped early by the scheduler: they have no test metrics and are "
                   f"scored by the best validation accuracy of the epochs they ran")
    elif n_stopped:
        out.append(f"{n_stopped} trials were stopped early by the scheduler: they have no test metrics and are "
                   f"left out of the test-accuracy tables")
    if superseded:
        out.append(f"{superseded} older ok results repeat the cell (same identity params and seed) of a newer run "
                   f"and are left out; pass --parent-run to analyse one sweep")
    if sweep.n_unfinished:
        runs = ", ".join(sweep.unfinished_runs[:10]) + (", ..." if len(sweep.unfinished_runs) > 10 else "")
        out.append(f"{sweep.n_unfinished} trial run{'s' if sweep.n_unfinished > 1 else ''} still running "
                   f"(or left so by a driver that died) {'are' if sweep.n_unfinished > 1 else 'is'} left out: "
                   f"{runs}")
    return out


def _per_dataset(trials: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
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
    for dataset, runs in _per_dataset(trials):
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
    for dataset, runs in _per_dataset(trials):
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
    for dataset, runs in _per_dataset(trials):
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


def write_student_tables(trials: pd.DataFrame, out: str | Path, alpha_c: Curve | None = None,
                         theory: Solver | None = Solver()) -> list[Path]:
    """student_runs.csv (long frame), student_summary.csv, student_deltas.csv (per seed),
    student_delta_summary.csv and student_alpha_c.csv (estimated crossing beside the published α_c); with
    `theory`, the d → ∞ prediction beside each simulated value (<metric>_theory, alpha_c_theory) and the
    theory's cache files."""
    return _student_tables(*student_with_theory(trials, out, theory), Path(out), alpha_c)


def _student_tables(student: pd.DataFrame, alpha_c_theory: pd.DataFrame | None, out: Path,
                    alpha_c: Curve | None) -> list[Path]:
    """write_student_tables from the student frame with its theory (`student_with_theory`)."""
    deltas = ST.student_deltas(student)
    delta_summary = ST.student_delta_summary(deltas)
    tables = {"student_runs": student, "student_summary": ST.student_summary(student), "student_deltas": deltas,
              "student_delta_summary": delta_summary,
              "student_alpha_c": ST.crossing_alphas(deltas, alpha_c, alpha_c_theory)}
    return [FM.write_csv(frame, out / f"{name}.csv") for name, frame in tables.items()] + theory_files(out)


def write_figures(trials: pd.DataFrame, out: str | Path, baseline: str = "add", alpha_c: Curve | None = None,
                  alpha_l: Curve | None = None, theory: Solver | None = Solver()) -> list[Path]:
    """Every figure the runs allow (PE-fusion ones per dataset, student ones, with the d → ∞ theory computed by
    `theory` and cached under <out>) into <out>/figures; PNG paths."""
    paths: list[Path] = []
    if len(RU.pefusion_runs(trials)):
        for _, runs in _per_dataset(trials):
            paths += pefusion_figures(runs, Path(out) / "figures", baseline)
    if len(RU.student_runs(trials)):
        student, alpha_c_theory = student_with_theory(trials, out, theory)
        paths += student_figures(student, Path(out) / "figures", alpha_c, alpha_l, alpha_c_theory)
    if not paths:
        raise RU.AnalysisError("the trial runs have neither PE-fusion params (dataset, pe_type, fusion, seed) nor "
                               "student params (alpha, seed): nothing to plot")
    return paths


# ---------------------------------------------------------------------------------------------------------
# HTML report
# ---------------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; padding: 0 1em; color: #222; }
.table { max-width: 100%; overflow-x: auto; margin: 0.5em 0 1.5em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; }
th.num, td.num { text-align: right; }
th { background: #f3f3f3; vertical-align: bottom; max-width: 11em; }
td { max-width: 28em; overflow-wrap: anywhere; }
code, pre { background: #f6f6f6; padding: 2px 4px; white-space: pre-wrap; word-break: break-all; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
.note { color: #8a5a00; } .muted { color: #666; font-size: 0.9em; }
table.meta td, table.meta th { text-align: left; vertical-align: top; max-width: none; }
"""


def _table_html(shown: pd.DataFrame, caption: str = "") -> str:
    """A table for reading (a frame of strings, formats.display or a study's *_display), in a box that scrolls
    sideways on a narrow window instead of running off the page, with a one-line caption above it."""
    above = f"<p class='muted'>{html.escape(caption)}</p>" if caption else ""
    if shown.empty:
        return above + "<p class='muted'>(none)</p>"
    cells = shown.astype(str).replace({"nan": "–", "<NA>": "–", "None": "–"})
    numeric = [bool(cells[c].map(lambda v: bool(_NUMERIC.match(v))).all()) for c in cells]  # right-aligned
    head = "".join(f"<th class='{'num' if n else 'text'}'>{html.escape(str(c))}</th>" for c, n in zip(cells, numeric))
    body = "".join("<tr>" + "".join(f"<td class='{'num' if n else 'text'}'>{html.escape(v)}</td>"
                                    for v, n in zip(row, numeric)) + "</tr>" for row in cells.itertuples(index=False))
    return above + f"<div class='table'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


_NUMERIC = re.compile(r"^(–|[-−+]?[\d.,]+(e[-+]?\d+)?( ± [\d.,e+-]+)?|\[[-\d., ]+\])$")


def _image_html(png: Path, caption: str = "") -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    text = f"<figcaption class='muted'>{html.escape(caption)}</figcaption>" if caption else ""
    return f"<figure><img alt='{html.escape(png.stem)}' src='data:image/png;base64,{data}'>{text}</figure>"


def is_search(sweep: RU.Sweep) -> bool:
    """True for a hyperparameter search (its trials differ in the searched keys, not in their identity)."""
    return sweep.parent_tags.get(R.TAG_SWEEP) == "lr_batch_asha"


def report_kind(sweep: RU.Sweep) -> str:
    """'search' for hyperparameter searches, else the study of the runs ('pefusion' or 'student')."""
    if is_search(sweep):
        return "search"
    kind = RU.study_of(sweep.trials)
    if kind == "unknown":
        raise RU.AnalysisError("the trial runs have neither PE-fusion params (dataset, pe_type, fusion, seed) nor "
                               "student params (alpha, seed): nothing to report")
    return kind


def _best_runs_html(best: pd.DataFrame, tracking_uri: str) -> str:
    """Each cell's best run and the command that makes its MLflow model (a classifier of raw text) and prints the
    line that loads it."""
    shown = FM.display(best.drop(columns=[RU.RUN_ID]))
    shown["MLflow model (prints the line that loads it)"] = [
        f"pefusion-export --run {run_id} --tracking-uri {tracking_uri}" for run_id in best[RU.RUN_ID]]
    return _table_html(shown, "The seed with the highest best validation accuracy of each cell (chosen on "
                              "validation, never on test). Its command makes the run's MLflow model once, or finds "
                              "it: a pyfunc model that reads a text column and answers the label and each class's "
                              "probability.")


def _pefusion_sections(trials: pd.DataFrame, out: Path, baseline: str,
                       tracking_uri: str) -> tuple[list[str], list[Path]]:
    parts, written = [], []
    written += write_table1(trials, out) + write_paired_deltas(trials, out, baseline, figures=False)
    written += write_pefusion_summaries(trials, out)
    figures = write_figures(trials, out, baseline)
    for dataset, runs in _per_dataset(trials):
        slug = FM.dataset_slug(dataset)
        table = FT.table1(runs)
        summary, _ = FT.paired_deltas(runs, baseline)
        buckets = FT.length_bucket_summary(runs)
        parts.append(f"<h2>Dataset {html.escape(dataset)}</h2>")
        paper = (f" The paper's {table.attrs['published']} (2 decimals, as published) stands beside ours. Ours "
                 f"− paper is compared as two samples, our seeds against the paper's five (its mean and SD), by "
                 f"Welch's t-test: the difference's 95 % interval, and the verdict above or below where it "
                 f"excludes 0 (a 5 % two-sided test; simulated with 5 seeds a side, 4–5 % of verdicts say above "
                 f"or below when both come from one distribution, at SD ratios 0.25–4), consistent where it holds "
                 f"0. Consistent is not 'reproduced': it says a difference smaller than the detectable column "
                 f"(found 80 % of the time by these seeds) could be missed. The protocol column names every "
                 f"recorded setting, and the data, that differ from the preset's.") if "published_mean" in table \
            else ""
        parts.append("<h3>Table 1</h3>")
        parts.append(_table_html(FT.table1_display(table), "Test accuracy in %, mean ± sample standard deviation "
                                 f"(SD, ddof = 1) over seeds; latency in ms per sample, mean ± SD over seeds.{paper}"))
        parts.append("<h3>Best run per cell</h3>")
        parts.append(_best_runs_html(FT.best_runs(runs), tracking_uri))
        shown, wilcoxon_note = FT.paired_display(summary)
        parts.append(f"<h3>Paired-seed Δ accuracy against {html.escape(baseline)}</h3>")
        if wilcoxon_note:
            parts.append(f"<p class='note'>{html.escape(wilcoxon_note)}</p>")
        parts.append(_table_html(shown, "Δ = test accuracy(fusion) − test accuracy(baseline) in percentage points, "
                                        "for the seeds with an ok run on both sides (unpaired seeds are left out); "
                                        "95 % t interval of the mean Δ (t with n − 1 degrees of freedom; "
                                        "simulated, it holds the true Δ 95 % of the time with 3 and with 5 "
                                        "seeds); paired t-test and Wilcoxon signed-rank p-values, 2 significant "
                                        "figures."))
        parts += [_image_html(p) for p in figures if p.stem.startswith(f"paired_deltas_{slug}_")]
        parts.append("<h3>Accuracy and latency per fusion</h3>")
        parts.append(_table_html(FM.display(FT.fusion_summary(runs)), "Pooled over PEs and seeds."))
        parts += [_image_html(p) for p in figures if p.stem in (f"accuracy_per_fusion_{slug}",
                                                                 f"latency_per_fusion_{slug}")]
        if len(buckets):
            parts.append("<h3>Accuracy per document length</h3>")
            parts.append(_table_html(FT.length_bucket_display(buckets),
                                     "Test accuracy in %, mean ± SD over seeds, per bucket of document length "
                                     "in tokens before truncation; rows in Table 1's order."))
            parts += [_image_html(p) for p in figures if p.stem == f"accuracy_per_length_{slug}"]
    return parts, written + figures


def _student_sections(trials: pd.DataFrame, out: Path, alpha_c: Curve | None, alpha_l: Curve | None,
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
    written = _student_tables(student, alpha_c_theory, out, alpha_c)
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
        _table_html(FM.display(delta_summary, drop=tuple(FM.constant_columns(delta_summary, slice_keys)[0])),
                    "Δε = ε(positional) − ε(semantic), mean ± sample SD over seeds (SE = SD/√n): Δε_t > 0 means the "
                    "semantic solution reaches the lower training loss; a point is called semantic or positional "
                    "where a two-sided t-test of its seeds' gaps (n − 1 degrees of freedom) rejects 0 at 5 % "
                    "(|mean| > 3.18 SE with 4 seeds, 2.36 with 8), undecided otherwise; simulated, a point whose "
                    f"gap is 0 is called 5 % of the time.{where}"),
        f"<h3>Estimated α_c beside the published one{html.escape(published)}</h3>",
        _table_html(FM.display(ST.crossing_alphas(deltas, alpha_c, alpha_c_theory)),
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
        _table_html(FM.display(summary[simulated], drop=tuple(same)),
                    f"Simulations: mean ± sample SD over seeds.{where}"),
    ]
    if theory_cols:
        parts.append(_table_html(FM.display(summary[keys + theory_cols], drop=tuple(same)),
                                 "The d → ∞ theory at the same points (for λ-CV runs at each seed's λ*: mean ± SD "
                                 "over seeds)."))
    parts += [_image_html(p) for p in figures]
    return parts, written + figures


def compute_line(totals: CO.Totals) -> str:
    """The sweep's cost in one line: its runs and devices, wall time, GPU-hours and CPU-hours (Σ wall × share),
    the card-hours it held (its wall time × its cluster's GPUs), and how each is counted."""
    wall = "not recorded" if pd.isna(totals.wall_s) else \
        f"{totals.wall_s:.0f} s ({totals.wall_s / 3600:.3g} h)"
    unpriced = f" {totals.unpriced} runs recorded no wall time or share and are left out of the hours." \
        if totals.unpriced else ""
    held = "Card-hours not recorded (a sweep that did not finish, or from before they were)." \
        if pd.isna(totals.card_hours) else \
        (f"Card-hours {totals.card_hours:.3g}: what renting the cluster cost, busy or not: the sweep command's wall "
         f"time, {totals.sweep_wall_s:.0f} s (Ray's start and the GPU probe included), × the {totals.cluster_gpus:g} "
         f"GPUs its Ray cluster had.")
    return (f"{totals.runs} runs on {', '.join(totals.devices) or 'devices not recorded'}. Sweep wall time {wall}, "
            f"from the first run's start to the last run's end (the trials' own clocks). GPU-hours "
            f"{totals.gpu_hours:.3g}, CPU-hours {totals.cpu_hours:.3g}: the sum over runs of wall × share ÷ 3600, "
            f"a run's wall summed over the processes that ran it (retries and resumes), its share the part of its "
            f"trial's GPUs or CPUs Ray gave it: the time the trials were given.{unpriced} {held}{plan_line(totals)}")


def plan_line(totals: CO.Totals) -> str:
    """What `--plan` estimated before the sweep started, beside what it measured (the command's wall time, which
    the estimate covers less Ray's start), or nothing where the parent run has no estimate."""
    if pd.isna(totals.plan_wall_s):
        return ""
    bound = "at most " if totals.plan_at_most else ""
    unit = "card-hours" if totals.gpu_hours > 0 else "core-hours"
    measured = "" if pd.isna(totals.sweep_wall_s) else \
        (f", against the {totals.sweep_wall_s:.0f} s the sweep command took "
         f"({totals.sweep_wall_s / totals.plan_wall_s:.2f}x the estimate)")
    return (f" Estimated before it started (--plan): wall {bound}{totals.plan_wall_s:.0f} s, {bound}"
            f"{totals.plan_device_hours:.3g} {unit}{measured}.")


def compute_section(trials: pd.DataFrame, epochs: pd.DataFrame, system: pd.DataFrame,
                    parent_metrics: Mapping[str, float], out: Path) -> tuple[list[str], list[Path]]:
    """The compute section and its files: per run its speed, epoch time, peak memory, where it ran and its hours
    (compute_runs.csv; `epochs`: runs.epoch_points of compute.SERIES), the sweep's totals (with the card time its
    parent run recorded, `parent_metrics`), and the machine's
    utilisation over the sweep when its parent run has system metrics (`system`: runs.system_points). Nothing
    when the runs recorded no cost and there are no system metrics."""
    table = CO.compute_table(trials, epochs)
    figure = utilisation_figure(system)
    if table.empty and figure is None:
        return [], []
    parts, written = ["<h2>Compute</h2>"], []
    if len(table):
        written.append(FM.write_csv(table, out / "compute_runs.csv"))
        parts.append(f"<p><b>{html.escape(compute_line(CO.totals(trials, table, parent_metrics)))}</b></p>")
        named = len(table.columns.intersection(SE.varied_keys(trials)))
        parts.append(_table_html(FM.display(table, drop=(RU.TRIAL_ID,) if named else ()),
                                 "Per run: training samples and tokens per second and the epoch's seconds "
                                 "(training and validation), means over its epochs (an epoch trains on every "
                                 "training document once); the peak memory torch held on the GPU in any epoch "
                                 "(CUDA runs only); its wall time and hours."))
    if figure is not None:
        png = save_figure(figure, out / "figures", "utilisation")
        written.append(png)
        parts.append(_image_html(png, "MLflow's system metrics of the sweep's parent run: the whole machine's CPU "
                                      f"and each GPU as NVML sees it, every process included. {R.GPU_BUSY_LABEL}."))
    return parts, written


def budget_line(budget: SE.Budget, scheduler: str | None) -> str:
    """'ASHA trained E of F epochs (P %)', and where the numbers come from."""
    who = {"asha": "ASHA", "fifo": "FIFO (no early stopping)"}.get(scheduler or "", "The search")
    source = "as the sweep's parent run recorded them" if budget.from_parent else \
        "summed from the trial runs: the parent run recorded no budget (the sweep did not finish)"
    n_stopped = int((budget.per_trial[R.STATUS] == R.STATUS_STOPPED).sum())
    return (f"{who} trained {budget.epochs_trained:.0f} of {budget.epochs_full_budget:.0f} epochs "
            f"({100 * budget.fraction:.1f} %): {len(budget.per_trial)} trials × max_t = {budget.max_t} epochs "
            f"without early stopping, {n_stopped} trials stopped early; {source}.")


def _search_sections(sweep: RU.Sweep, out: Path) -> tuple[list[str], list[Path]]:
    trials, tags = sweep.trials, sweep.parent_tags
    table = SE.search_table(trials)
    written = [FM.write_csv(table, out / "search_trials.csv")]
    parts = ["<h2>Search trials, best first</h2>",
             _table_html(FM.display(table), "Accuracies in %; a trial stopped early by the scheduler has no test "
                                            "accuracy (–) and is ranked by the best validation accuracy of the "
                                            "epochs it ran.")]

    space_file = tags.get(R.TAG_SEARCH_SPACE, "")
    points = SE.search_points(trials, SE.recorded_space(space_file), space_file)
    unscored = (f" {points.n_unscored} finished trials recorded no {SE.SCORE} and are left out."
                if points.n_unscored else "")
    parts.append(f"<h2>Validation accuracy against the searched keys</h2><p class='muted'>{len(points.frame)} "
                 f"finished trials (ok, or stopped early by the scheduler) scored by their best epoch's validation "
                 f"accuracy; failed trials are left out.{html.escape(unscored)}</p>")
    figure = search_score_figure(points)
    if figure is None:
        parts.append("<p class='note'>No searched key varies among the scored trials: nothing to plot.</p>")
    else:
        png = save_figure(figure, out / "figures", "search_scores")
        written.append(png)
        parts.append(_image_html(png, "Read off which values of each key gave the best validation accuracy; "
                                      "hollow markers are trials the scheduler stopped early, so their accuracy is "
                                      "that of fewer epochs than the filled ones."))

    importances, why_not = SE.param_importances(points)
    parts.append("<h2>Parameter importances</h2>")
    if why_not:
        parts.append(f"<p class='note'>{html.escape(why_not)}.</p>")
    else:
        written.append(FM.write_csv(importances, out / "search_importance.csv"))
        parts.append(f"<p class='muted'>fANOVA (optuna.importance, forest seed {SE.IMPORTANCE_SEED}) over the "
                     f"{len(points.frame)} scored trials rebuilt as an Optuna study: the share of the variance of "
                     f"the best validation accuracy each key explains on its own (the shares sum to 1).</p>")
        parts.append(_table_html(FM.display(importances)))

    figure = search_parallel_figure(points)
    if figure is not None:
        png = save_figure(figure, out / "figures", "search_parallel_coordinates")
        written.append(png)
        parts.append("<h2>Parallel coordinates</h2>")
        parts.append(_image_html(png, "Follow the brightest lines to see which combination of values reached "
                                      "the best accuracy; dashed lines are trials stopped early."))

    budget = SE.search_budget(trials, sweep.parent_metrics)
    parts.append("<h2>Epoch budget</h2>")
    if budget is None:
        parts.append(f"<p class='note'>No epoch budget: the trials record no {SE.MAX_EPOCHS} and the parent run "
                     f"no {R.EPOCHS_FULL_BUDGET}.</p>")
    else:
        parts.append(f"<p><b>{html.escape(budget_line(budget, tags.get(R.TAG_SCHEDULER)))}</b></p>")
        png = save_figure(search_budget_figure(budget), out / "figures", "search_budget")
        written.append(png)
        parts.append(_image_html(png, "Read off how many epochs each trial cost against max_t (dashed line): "
                                      "the gap between a bar and the line is what early stopping saved."))
    return parts, written


def _header(sweep: RU.Sweep) -> str:
    tags = sweep.parent_tags
    trials = sweep.trials
    n_failed, n_ok = len(RU.failed(trials)), int((trials[R.STATUS] == R.STATUS_OK).sum())
    rows = [
        ("experiment", sweep.experiment), ("tracking URI", sweep.tracking_uri),
        ("sweep", sweep.name), ("parent run", sweep.parent_run_id or "none: every finished trial run"),
        ("command line", tags.get(R.TAG_COMMAND, "not recorded")),
        ("git commit", tags.get(R.TAG_GIT_COMMIT, "not recorded")),
        ("search space", tags.get(R.TAG_SEARCH_SPACE, "not recorded")),
        ("Ray address", tags.get(R.TAG_RAY_ADDRESS, "not recorded")),
        ("trials", f"{len(trials)} finished: {n_ok} ok, {len(trials) - n_ok - n_failed} stopped early by the "
                   f"scheduler, {n_failed} failed"),
        ("report written", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
    ]
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td><code>{html.escape(str(v))}</code></td></tr>" for k, v in rows)
    if sweep.parent_run_id and sweep.experiment_id:
        link = ui_link(sweep.tracking_uri, sweep.experiment_id, sweep.parent_run_id)
        serve = "" if sweep.tracking_uri.startswith(("http://", "https://")) else (
            f" (first <code>mlflow ui --backend-store-uri {html.escape(sweep.tracking_uri)}</code>)")
        cells += (f"<tr><th>MLflow UI</th><td><a href='{html.escape(link)}'>the sweep's trial runs</a>{serve}"
                  f"<br><code>{html.escape(link)}</code></td></tr>")
    return f"<table class='meta'>{cells}</table>"


def report_path(sweep: RU.Sweep, out: str | Path) -> Path:
    """<out>/report_<sweep>_<run id 8>.html, or report_<study>_all.html without a parent run."""
    suffix = sweep.parent_run_id[:8] if sweep.parent_run_id else "all"
    return Path(out) / f"report_{FM.dataset_slug(sweep.name)}_{suffix}.html"


def build_report(sweep: RU.Sweep, out: str | Path = "results", baseline: str = "add",
                 alpha_c: Curve | None = None, alpha_l: Curve | None = None,
                 log_to_mlflow: bool = True, theory: Solver | None = Solver(),
                 say: Callable[[str], None] = lambda line: None) -> tuple[Path, list[Path]]:
    """Write the sweep's CSVs, figures and HTML page; log them to the parent run under results/ (when there is
    one and `log_to_mlflow`). A student sweep's report has the d → ∞ theory beside its points (`theory`: how it
    is solved; None: none), cached under `out` and logged with the tables; `say` is told what takes long, as it
    starts and how long it took. Returns (HTML path, other files written)."""
    out = Path(out)
    kind = report_kind(sweep)
    if kind == "pefusion":
        parts, written = _pefusion_sections(sweep.trials, out, baseline, sweep.tracking_uri)
    elif kind == "student":
        parts, written = _student_sections(sweep.trials, out, alpha_c, alpha_l, theory, say)
    else:
        parts, written = _search_sections(sweep, out)
    costs, files = compute_section(sweep.trials, RU.epoch_points(sweep, CO.SERIES),
                                   RU.system_points(sweep, CO.utilisation_names(sweep.parent_metrics)),
                                   sweep.parent_metrics, out)
    parts, written = parts + costs, written + files
    remarks = notes(sweep)
    page = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>pefusion report: {html.escape(sweep.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Sweep report: {html.escape(sweep.name)}</h1>", _header(sweep),
        *(f"<p class='note'>Note: {html.escape(r)}</p>" for r in remarks),
        *parts,
        "<h2>Failed trials</h2>", _table_html(FM.display(RU.failed_trials(sweep.trials))),
        "<h2>Files</h2><p class='muted'>" + "<br>".join(html.escape(str(p)) for p in written) + "</p>",
        "</body></html>",
    ]
    path = report_path(sweep, out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(page), encoding="utf-8")
    if log_to_mlflow and sweep.parent_run_id:
        log_to_parent(sweep, [path, *written])
    return path, written


def log_to_parent(sweep: RU.Sweep, paths: Sequence[Path]) -> None:
    """Log files to the sweep's parent run: results/ for tables and the page, results/figures/ for figures (PDFs
    beside the PNGs included)."""
    tables = [p for p in paths if p.suffix != ".png"]
    figures = [f for p in paths if p.suffix == ".png" for f in (p, p.with_suffix(".pdf"))]
    for files, folder in ((tables, R.ARTIFACT_RESULTS_DIR), (figures, f"{R.ARTIFACT_RESULTS_DIR}/figures")):
        log_artifacts_to_run(sweep.tracking_uri, sweep.parent_run_id, [f for f in files if f.exists()], folder)
