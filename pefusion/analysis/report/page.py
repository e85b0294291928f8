"""A sweep's HTML report, one self-contained page: what kind of sweep it is, its header (where its runs are, the
command, commit and trials), the remarks a reader of the tables must know, the sections of its study or search and
of its cost, its failed trials and the files written; logged back to the sweep's MLflow parent run under results/.
"""
from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from pefusion import record as R
from pefusion.analysis import compute as CO
from pefusion.analysis import formats as FM
from pefusion.analysis import runs as RU
from pefusion.analysis import student_tables as ST
from pefusion.analysis.report.compute import compute_section
from pefusion.analysis.report.fusion import pefusion_sections
from pefusion.analysis.report.markup import CSS, table_html
from pefusion.analysis.report.search import search_sections
from pefusion.analysis.report.student import student_sections
from pefusion.student.theory import Solver
from pefusion.tracking.store import log_artifacts_to_run, ui_link


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
                 alpha_c: ST.Curve | None = None, alpha_l: ST.Curve | None = None,
                 log_to_mlflow: bool = True, theory: Solver | None = Solver(),
                 say: Callable[[str], None] = lambda line: None) -> tuple[Path, list[Path]]:
    """Write the sweep's CSVs, figures and HTML page; log them to the parent run under results/ (when there is
    one and `log_to_mlflow`). A student sweep's report has the d → ∞ theory beside its points (`theory`: how it
    is solved; None: none), cached under `out` and logged with the tables; `say` is told what takes long, as it
    starts and how long it took. Returns (HTML path, other files written)."""
    out = Path(out)
    kind = report_kind(sweep)
    if kind == "pefusion":
        parts, written = pefusion_sections(sweep.trials, out, baseline, sweep.tracking_uri)
    elif kind == "student":
        parts, written = student_sections(sweep.trials, out, alpha_c, alpha_l, theory, say)
    else:
        parts, written = search_sections(sweep, out)
    costs, files = compute_section(sweep.trials, RU.epoch_points(sweep, CO.SERIES),
                                   RU.system_points(sweep, CO.utilisation_names(sweep.parent_metrics)),
                                   sweep.parent_metrics, out)
    parts, written = parts + costs, written + files
    remarks = notes(sweep)
    page = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>pefusion report: {html.escape(sweep.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>Sweep report: {html.escape(sweep.name)}</h1>", _header(sweep),
        *(f"<p class='note'>Note: {html.escape(r)}</p>" for r in remarks),
        *parts,
        "<h2>Failed trials</h2>", table_html(FM.display(RU.failed_trials(sweep.trials))),
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
