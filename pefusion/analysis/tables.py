"""Turn MLflow runs into the papers' tables: Table 1, paired-seed deltas, length buckets, student summaries.

Two layers:
- loaders (`load_trial_runs`, `load_sweep`) read MLflow once into a flat DataFrame, one row per trial run,
  with its params (numbers parsed), its final metric values and its outcome (`status`, `error`);
- pure functions over that DataFrame build each table, so tests and notebooks use them without MLflow.

Units: MLflow stores accuracies as fractions in [0, 1]. Every table built here reports accuracy in percent and
accuracy deltas in percentage points (pp) — the unit of the paper's Table 3 — so our numbers and the published
ones stand side by side. Latency is milliseconds per sample; `params` is the model's parameter count.

A run is a trial when it is tagged `pefusion.role=trial`, or when it is not a sweep parent and carries the
identity params of a PE-fusion trial (dataset, pe_type, fusion, seed) or of a student trial (alpha, seed): runs
written by other tools with those names are analysed like ours. Failed trials (status diverged or error) are
kept in the frame, excluded from every mean, counted and listed; trials stopped early by a scheduler (status
stopped) are not failures but have no test metrics, so test-accuracy tables leave them out too. Runs still
RUNNING are left out and counted.
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from pefusion import record as R
from pefusion.fusion.config import FUSIONS, PE_TYPES, TRIAL_KEYS
from pefusion.errors import ConfigError
from pefusion.sweep.tracking import check_tracking, resolve_tracking_uri

DEMO_HINT = ("run python sweeps/arxiv_grid.py --preset demo first "
             "(or python sweeps/lambda_cv.py --preset demo for the student study)")

# Columns of the trial frame that are not params or metrics.
RUN_ID, PARENT_RUN_ID, TRIAL_ID, SWEEP, START_TIME = "run_id", "parent_run_id", "trial_id", "sweep", "start_time"
ID_COLUMNS = (RUN_ID, PARENT_RUN_ID, TRIAL_ID, SWEEP, R.STATUS, R.ERROR, START_TIME)
PEFUSION_IDENTITY = (R.DATASET, R.PE_TYPE, R.FUSION, R.SEED)
STUDENT_IDENTITY = (R.ALPHA, R.SEED)

# The paper's Table 3 (ArXiv-11): test accuracy in %, mean ± std over seeds 0–4.
ARXIV_TABLE3: dict[tuple[str, str], tuple[float, float]] = {
    ("sinusoidal", "add"): (59.22, 1.07), ("sinusoidal", "concat"): (63.44, 2.27),
    ("sinusoidal", "gate_scalar"): (65.73, 4.01), ("sinusoidal", "mlp_gate"): (65.50, 2.31),
    ("learned", "add"): (62.29, 3.24), ("learned", "concat"): (60.83, 2.77),
    ("learned", "gate_scalar"): (64.61, 2.83), ("learned", "mlp_gate"): (64.28, 5.08),
    ("rope", "add"): (58.47, 2.58), ("rope", "concat"): (64.55, 1.82),
    ("rope", "gate_scalar"): (65.61, 2.81), ("rope", "mlp_gate"): (64.33, 3.67),
    ("relative", "add"): (62.48, 2.53), ("relative", "concat"): (59.83, 2.11),
    ("relative", "gate_scalar"): (65.55, 3.15), ("relative", "mlp_gate"): (65.23, 2.34),
}

# Student initialisations compared by the Δ quantities (Δε = ε(positional) − ε(semantic), the paper's Fig. 2).
SEMANTIC, POSITIONAL = "semantic", "positional"
STUDENT_KEYS = (R.ALPHA, R.OMEGA, R.SIGMA, R.SEED, R.D)
STUDENT_METRICS = (R.EPS_G, R.EPS_T, R.M, R.THETA)
LAM_FIXED = "lam_fixed"  # the λ of a phase-diagram run; NaN for λ-CV runs, whose λ* is chosen per init
STUDENT_COLUMNS = (RUN_ID, START_TIME, "source", R.STATUS, R.ERROR, *STUDENT_KEYS, R.INIT, LAM_FIXED,
                   *STUDENT_METRICS, R.EPS_LIN, R.LAMBDA_STAR)
SOURCE_CV, SOURCE_PHASE = "lambda_cv", "phase_diagram"  # one init per run / both inits in one run


class AnalysisError(ConfigError):
    """A problem with the runs to analyse (store, experiment, metrics). Its message is one line."""


# ---------------------------------------------------------------------------------------------------------
# Loading runs from MLflow
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Sweep:
    """The trial runs to analyse and, when they came from one sweep invocation, its parent run's tags."""

    tracking_uri: str
    experiment: str
    trials: pd.DataFrame
    parent_run_id: str | None = None
    parent_tags: dict[str, str] = field(default_factory=dict)
    n_unfinished: int = 0  # trial runs still RUNNING/SCHEDULED, left out

    @property
    def name(self) -> str:
        """The sweep script's name (tag pefusion.sweep), else what the runs look like."""
        return self.parent_tags.get(R.TAG_SWEEP) or study_of(self.trials)


def _check_store(uri: str) -> None:
    """Fail with one line before MLflow would create an empty store or retry an unreachable server for minutes."""
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        if not path.exists():
            raise AnalysisError(f"no MLflow store at {path} (tracking URI {uri}); {DEMO_HINT}, "
                                f"or pass --tracking-uri")
    else:
        check_tracking(uri)


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    _check_store(uri)
    return MlflowClient(tracking_uri=uri)


def _one_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _experiment_id(client, uri: str, experiment: str) -> str:
    from mlflow.exceptions import MlflowException

    try:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            names = sorted(e.name for e in client.search_experiments())
            raise AnalysisError(f"no experiment named {experiment!r} at {uri} (experiments there: "
                                f"{', '.join(names) or 'none'}); {DEMO_HINT}, or pass --experiment")
    except MlflowException as exc:
        raise AnalysisError(f"cannot read MLflow store {uri}: {_one_line(exc)}") from None
    return exp.experiment_id


def _all_runs(client, experiment_id: str) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _parse_param(values: pd.Series) -> pd.Series:
    """Params arrive as strings: make a column integer, or float, when every value parses as one."""
    present = values.dropna()
    for kind, parse in (("Int64", int), ("float64", float)):
        try:
            parsed = [parse(v) for v in present]
        except (TypeError, ValueError):
            continue
        out = pd.Series(pd.NA if kind == "Int64" else np.nan, index=values.index, dtype=kind)
        out[present.index] = parsed
        return out
    return values


def _run_outcome(run) -> tuple[str | None, str]:
    """(status, error) of a finished run; status None for a run still going."""
    tags, mlflow_status = run.data.tags, run.info.status
    if mlflow_status in ("RUNNING", "SCHEDULED"):
        return None, ""
    status = tags.get(R.TAG_STATUS) or (R.STATUS_OK if mlflow_status == "FINISHED" else R.STATUS_ERROR)
    error = tags.get(R.TAG_ERROR, "")
    if status not in R.SUCCESS_STATUSES and not error:
        error = f"MLflow run status {mlflow_status}, no reason recorded"
    return status, error


def _is_trial(run) -> bool:
    role = run.data.tags.get(R.TAG_ROLE)
    if role is not None:
        return role == "trial"
    params = run.data.params
    return all(k in params for k in PEFUSION_IDENTITY) or all(k in params for k in STUDENT_IDENTITY)


def runs_frame(runs: Iterable) -> tuple[pd.DataFrame, int]:
    """One row per finished trial run: ID_COLUMNS, then params (parsed), then final metric values.

    Returns the frame and the number of trial runs left out because they are still running. Params win a name
    clash with a metric (the metric is kept as 'metric.<name>'); a param named like an id column is kept as
    'param.<name>'.
    """
    rows, params_seen, unfinished = [], {}, 0
    for run in runs:
        if not _is_trial(run):
            continue
        status, error = _run_outcome(run)
        if status is None:
            unfinished += 1
            continue
        tags = run.data.tags
        row: dict[str, Any] = {
            RUN_ID: run.info.run_id, PARENT_RUN_ID: tags.get(R.TAG_PARENT), TRIAL_ID: tags.get(R.TAG_TRIAL_ID),
            SWEEP: tags.get(R.TAG_SWEEP), R.STATUS: status, R.ERROR: error, START_TIME: run.info.start_time,
        }
        for key, value in run.data.params.items():
            name = f"param.{key}" if key in ID_COLUMNS else key
            params_seen[name] = None
            row[name] = value
        row.update({(f"metric.{k}" if k in row else k): v for k, v in run.data.metrics.items()})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=None if rows else list(ID_COLUMNS))
    for name in params_seen:
        if name in frame:
            frame[name] = _parse_param(frame[name])
    return frame, unfinished


def load_sweep(tracking_uri: str | None, experiment: str, parent_run: str | None = None,
               latest_sweep: bool = False) -> Sweep:
    """Trial runs of `parent_run` (a run id or a unique prefix of one); with `latest_sweep`, of the most recent
    sweep parent run of the experiment; otherwise every finished trial run of the experiment.

    Raises AnalysisError (one line) for an unreachable store, an unknown experiment or run, or no trial runs.
    """
    uri = resolve_tracking_uri(tracking_uri)
    client = _client(uri)
    exp_id = _experiment_id(client, uri, experiment)
    runs = _all_runs(client, exp_id)
    parent = None
    if parent_run:
        matches = [r for r in runs if r.info.run_id.startswith(parent_run)]
        if len(matches) != 1:
            what = "no run" if not matches else f"{len(matches)} runs"
            raise AnalysisError(f"{what} in experiment {experiment!r} match --parent-run {parent_run!r}")
        parent = matches[0]
    elif latest_sweep:
        sweeps = [r for r in runs if r.data.tags.get(R.TAG_ROLE) == "sweep"]
        parent = max(sweeps, key=lambda r: r.info.start_time) if sweeps else None
    if parent is not None:
        runs = [r for r in runs if r.data.tags.get(R.TAG_PARENT) == parent.info.run_id]
    trials, unfinished = runs_frame(runs)
    if trials.empty and parent is not None:
        raise AnalysisError(f"sweep run {parent.info.run_id[:8]} ({parent.data.tags.get(R.TAG_SWEEP, 'unnamed')}) "
                            f"of experiment {experiment!r} has no finished trial runs ({unfinished} still "
                            f"running); pick another with --parent-run")
    if trials.empty:
        raise AnalysisError(f"experiment {experiment!r} has no finished trial runs; {DEMO_HINT}")
    return Sweep(uri, experiment, trials, parent.info.run_id if parent else None,
                 dict(parent.data.tags) if parent else {}, unfinished)


def load_trial_runs(tracking_uri: str | None, experiment: str, parent_run: str | None = None) -> pd.DataFrame:
    """Every finished trial run of the experiment (or of one sweep parent run) as a DataFrame, see runs_frame."""
    return load_sweep(tracking_uri, experiment, parent_run).trials


def published_alpha_curves() -> tuple[dict[float, float] | None, dict[float, float] | None]:
    """The student paper's α_c(ω) and α_l(ω) tables from pefusion.student, or (None, None) if not available."""
    try:
        from pefusion.student.config import ALPHA_C_PUBLISHED, ALPHA_L_PUBLISHED
    except ImportError:
        return None, None
    return dict(ALPHA_C_PUBLISHED), dict(ALPHA_L_PUBLISHED)


# ---------------------------------------------------------------------------------------------------------
# Selecting and checking runs
# ---------------------------------------------------------------------------------------------------------


def _has(frame: pd.DataFrame, names: Sequence[str]) -> pd.Series:
    if not all(n in frame for n in names):
        return pd.Series(False, index=frame.index)
    return frame[list(names)].notna().all(axis=1)


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    """A column, or NaN when no run recorded that name."""
    return frame[name] if name in frame else pd.Series(np.nan, index=frame.index)


def study_of(trials: pd.DataFrame) -> str:
    """'pefusion', 'student' or 'unknown': which study the trial runs belong to, from their params."""
    if _has(trials, PEFUSION_IDENTITY).any():
        return "pefusion"
    if _has(trials, STUDENT_IDENTITY).any():
        return "student"
    return "unknown"


def pefusion_runs(trials: pd.DataFrame) -> pd.DataFrame:
    """The PE-fusion trial runs (those with params dataset, pe_type, fusion, seed)."""
    return trials[_has(trials, PEFUSION_IDENTITY)]


def failed(trials: pd.DataFrame) -> pd.DataFrame:
    """Trial runs that failed: diverged, error, or an MLflow FAILED/KILLED run. Trials stopped early by a
    scheduler (status stopped) completed normally and are not failures; they have no test metrics."""
    return trials[~trials[R.STATUS].isin(R.SUCCESS_STATUSES)]


def require_metrics(ok: pd.DataFrame, names: Sequence[str]) -> None:
    """Raise AnalysisError naming the first metric that some ok run lacks, with how many runs lack it."""
    for name in names:
        missing = ok[RUN_ID] if name not in ok else ok.loc[ok[name].isna(), RUN_ID]
        if len(missing):
            raise AnalysisError(f"metric {name!r} is missing from {len(missing)} of {len(ok)} ok trial runs "
                                f"(e.g. run {missing.iloc[0][:8]}); trials must record the metrics of SPEC §3")


def _latest_ok(runs: pd.DataFrame, keys: Sequence[str]) -> tuple[pd.DataFrame, int]:
    """The ok runs, the most recent one per `keys` cell (a sweep repeated without --parent-run leaves older
    copies), and how many older copies were set aside."""
    ok = runs[runs[R.STATUS] == R.STATUS_OK].sort_values(START_TIME, kind="stable")
    latest = ok.drop_duplicates(list(keys), keep="last")
    return latest, len(ok) - len(latest)


def latest_ok_pefusion(trials: pd.DataFrame) -> pd.DataFrame:
    """One ok PE-fusion run per (dataset, pe_type, fusion, seed): the most recent."""
    return _latest_ok(pefusion_runs(trials), PEFUSION_IDENTITY)[0]


def notes(sweep: Sweep) -> list[str]:
    """One-line remarks a reader of the tables must know: failed, superseded and unfinished runs."""
    out = []
    trials = sweep.trials
    n_failed = len(failed(trials))
    if n_failed:
        out.append(f"{n_failed} of {len(trials)} trial runs failed (diverged or error): excluded from every mean, "
                   f"counted, and listed in the report")
    superseded = 0
    if len(pefusion_runs(trials)):
        superseded += _latest_ok(pefusion_runs(trials), PEFUSION_IDENTITY)[1]
    if len(student_runs(trials)):
        student = student_frame(trials)
        superseded += int((student[R.STATUS] == R.STATUS_OK).sum()) - len(_student_ok(student))
    n_stopped = int((trials[R.STATUS] == R.STATUS_STOPPED).sum())
    if n_stopped:
        out.append(f"{n_stopped} trials were stopped early by the scheduler: they have no test metrics and are "
                   f"left out of the test-accuracy tables")
    if superseded:
        out.append(f"{superseded} older ok results repeat the cell (same identity params and seed) of a newer run "
                   f"and are left out; pass --parent-run to analyse one sweep")
    if sweep.n_unfinished:
        out.append(f"{sweep.n_unfinished} trial runs are still running and are left out")
    return out


def _ordered(values: Iterable[str], canonical: Sequence[str]) -> list[str]:
    """Known names in the project's order, unknown ones (other tools) after them alphabetically."""
    values = set(values)
    return [v for v in canonical if v in values] + sorted(values - set(canonical))


def datasets(trials: pd.DataFrame) -> list[str]:
    """The dataset names of the PE-fusion runs, sorted."""
    return sorted(pefusion_runs(trials)[R.DATASET].astype(str).unique())


def dataset_slug(dataset: str) -> str:
    """A file-name-safe form of a dataset name: 'ccdv/arxiv-classification' -> 'ccdv-arxiv-classification'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(dataset)).strip("-") or "dataset"


def is_arxiv(dataset: str) -> bool:
    """True for the paper's ArXiv-11 dataset (any name containing 'arxiv')."""
    return "arxiv" in str(dataset).lower()


def one_dataset(runs: pd.DataFrame) -> str:
    names = runs[R.DATASET].astype(str).unique()
    if len(names) != 1:
        raise AnalysisError(f"expected the runs of one dataset, got {len(names)}: {', '.join(sorted(names))}")
    return names[0]


def _cells(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """The (pe_type, fusion) cells present in the runs (ok or failed), in the project's order."""
    present = set(zip(runs[R.PE_TYPE].astype(str), runs[R.FUSION].astype(str)))
    return [(pe, fu) for pe in _ordered({p for p, _ in present}, PE_TYPES)
            for fu in _ordered({f for _, f in present}, FUSIONS) if (pe, fu) in present]


def _sample_std(values: pd.Series) -> float:
    return float(values.std(ddof=1)) if values.notna().sum() >= 2 else math.nan


# ---------------------------------------------------------------------------------------------------------
# PE-fusion tables
# ---------------------------------------------------------------------------------------------------------

TABLE1_COLUMNS = ("pe_type", "fusion", "n_seeds", "test_acc_mean", "test_acc_std", "params_mean", "lat_ms_mean",
                  "lat_ms_std", "n_failed")
TABLE1_DOC = {
    "n_seeds": "ok runs (one per seed) in the cell",
    "test_acc_mean": "mean test accuracy over seeds, %",
    "test_acc_std": "sample standard deviation (ddof=1) of test accuracy over seeds, %",
    "params_mean": "mean parameter count",
    "lat_ms_mean": "mean over seeds of each run's mean inference latency, ms per sample",
    "lat_ms_std": "sample standard deviation over seeds of each run's mean latency, ms per sample",
    "n_failed": "diverged or errored runs in the cell, excluded from the means",
    "published_mean": "the paper's Table 3 mean test accuracy, % (ArXiv only)",
    "published_std": "the paper's Table 3 standard deviation over seeds 0-4, % (ArXiv only)",
}


def table1(runs: pd.DataFrame) -> pd.DataFrame:
    """Table 1 for the PE-fusion runs of one dataset: one row per (pe_type, fusion), columns TABLE1_COLUMNS
    (see TABLE1_DOC; accuracies in %), plus published_mean/published_std for the ArXiv dataset."""
    runs = pefusion_runs(runs)
    if runs.empty:
        raise AnalysisError("no PE-fusion trial runs (runs need params dataset, pe_type, fusion, seed)")
    dataset = one_dataset(runs)
    ok = latest_ok_pefusion(runs)
    require_metrics(ok, [R.TEST_ACC])
    rows = []
    for pe, fu in _cells(runs):
        cell = ok[(ok[R.PE_TYPE] == pe) & (ok[R.FUSION] == fu)]
        acc = cell[R.TEST_ACC].astype(float) * 100
        lat = cell[R.LAT_MS_MEAN].astype(float) if R.LAT_MS_MEAN in cell else pd.Series(dtype=float)
        n_params = cell[R.PARAMS].astype(float) if R.PARAMS in cell else pd.Series(dtype=float)
        all_cell = runs[(runs[R.PE_TYPE] == pe) & (runs[R.FUSION] == fu)]
        rows.append({
            "pe_type": pe, "fusion": fu, "n_seeds": len(cell),
            "test_acc_mean": acc.mean() if len(acc) else math.nan, "test_acc_std": _sample_std(acc),
            "params_mean": n_params.mean() if n_params.notna().any() else math.nan,
            "lat_ms_mean": lat.mean() if lat.notna().any() else math.nan, "lat_ms_std": _sample_std(lat),
            "n_failed": len(failed(all_cell)),
        })
    table = pd.DataFrame(rows, columns=list(TABLE1_COLUMNS))
    if is_arxiv(dataset):
        published = [ARXIV_TABLE3.get((pe, fu), (math.nan, math.nan)) for pe, fu in zip(table.pe_type, table.fusion)]
        table["published_mean"] = [p[0] for p in published]
        table["published_std"] = [p[1] for p in published]
    return table


def format_mean_std(mean: float, std: float, digits: int = 2) -> str:
    """'mean ± std' for tables; '–' for no value, the mean alone when std is undefined (one seed)."""
    if pd.isna(mean):
        return "–"
    return f"{mean:.{digits}f}" if pd.isna(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def table1_display(table: pd.DataFrame) -> pd.DataFrame:
    """Table 1 as strings for reading: 'mean ± std' cells, published values beside ours (both in %)."""
    def pm(prefix: str, digits: int = 2) -> list[str]:
        return [format_mean_std(m, s, digits) for m, s in zip(table[f"{prefix}_mean"], table[f"{prefix}_std"])]

    out = pd.DataFrame({"PE": table.pe_type, "fusion": table.fusion, "seeds": table.n_seeds.astype(str),
                        "test acc % (ours)": pm("test_acc")})
    if "published_mean" in table:
        out["test acc % (paper)"] = pm("published")
    out["params"] = ["–" if pd.isna(p) else f"{p:,.0f}" for p in table.params_mean]
    out["latency ms/sample"] = pm("lat_ms", 3)
    out["failed"] = table.n_failed.astype(str)
    return out


def to_markdown(display: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table of a frame of strings."""
    lines = ["| " + " | ".join(display.columns) + " |", "|" + "---|" * len(display.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in display.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    text = str(text).replace("\\", r"\textbackslash{}")
    for ch in "&%$#_{}":
        text = text.replace(ch, "\\" + ch)
    return text.replace("±", r"$\pm$").replace("–", "--").replace("~", r"\textasciitilde{}")


def to_latex(display: pd.DataFrame, caption: str) -> str:
    """A booktabs LaTeX table of a frame of strings."""
    header = " & ".join(_latex_escape(c) for c in display.columns) + r" \\"
    body = [" & ".join(_latex_escape(v) for v in row) + r" \\" for row in display.itertuples(index=False)]
    return "\n".join([r"\begin{table}[t]", r"\centering", rf"\caption{{{_latex_escape(caption)}}}",
                      r"\begin{tabular}{" + "l" * len(display.columns) + "}", r"\toprule", header, r"\midrule",
                      *body, r"\bottomrule", r"\end{tabular}", r"\end{table}"]) + "\n"


PAIRED_COLUMNS = ("pe_type", "fusion", "baseline", "n_pairs", "delta_mean", "delta_std", "ci95_low", "ci95_high",
                  "t_pvalue", "wilcoxon_pvalue", "n_unpaired", "note")


def paired_stats(acc: Sequence[float], acc_baseline: Sequence[float]) -> dict[str, Any]:
    """Statistics of paired differences acc − acc_baseline (already matched by seed, same order).

    Mean, sample std (ddof=1), 95% t interval, paired t-test and Wilcoxon signed-rank p-values (scipy); a test
    that cannot run (n < 2, all differences zero or all equal) gives NaN and says why in `note`.
    """
    a, b = np.asarray(acc, dtype=float), np.asarray(acc_baseline, dtype=float)
    delta = a - b
    n = len(delta)
    out = {"n_pairs": n, "delta_mean": delta.mean() if n else math.nan, "delta_std": math.nan,
           "ci95_low": math.nan, "ci95_high": math.nan, "t_pvalue": math.nan, "wilcoxon_pvalue": math.nan,
           "note": ""}
    if n < 2:
        out["note"] = "no seed on both sides" if n == 0 else "one pair: no spread, no test"
        return out
    std = delta.std(ddof=1)
    half = stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)
    out.update(delta_std=std, ci95_low=out["delta_mean"] - half, ci95_high=out["delta_mean"] + half)
    scale = max(1.0, float(np.abs(delta).max()))
    if np.ptp(delta) <= 1e-12 * scale:
        out["note"] = "all differences equal: tests undefined"
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out["t_pvalue"] = float(stats.ttest_rel(a, b).pvalue)
        out["wilcoxon_pvalue"] = float(stats.wilcoxon(a, b).pvalue)
    return out


def paired_deltas(runs: pd.DataFrame, baseline: str = "add") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Paired-seed comparison of each fusion against `baseline`, per PE, for the runs of one dataset.

    Δ = test_acc(fusion) − test_acc(baseline) in percentage points, for the seeds with an ok run on both sides;
    a seed with an ok run on one side only is left out and counted in n_unpaired. Returns (summary with
    PAIRED_COLUMNS, per-seed frame pe_type, fusion, baseline, seed, test_acc, test_acc_baseline, delta).
    """
    runs = pefusion_runs(runs)
    if runs.empty:
        raise AnalysisError("no PE-fusion trial runs (runs need params dataset, pe_type, fusion, seed)")
    one_dataset(runs)
    fusions = set(runs[R.FUSION].astype(str))
    if baseline not in fusions:
        raise AnalysisError(f"baseline fusion {baseline!r} has no runs; fusions present: "
                            f"{', '.join(_ordered(fusions, FUSIONS))}")
    ok = latest_ok_pefusion(runs)
    require_metrics(ok, [R.TEST_ACC])
    acc = ok.assign(acc=ok[R.TEST_ACC].astype(float) * 100)
    rows, per_seed = [], []
    for pe, fu in _cells(runs):
        if fu == baseline:
            continue
        base = acc[(acc[R.PE_TYPE] == pe) & (acc[R.FUSION] == baseline)].set_index(R.SEED)["acc"]
        other = acc[(acc[R.PE_TYPE] == pe) & (acc[R.FUSION] == fu)].set_index(R.SEED)["acc"]
        seeds = sorted(set(base.index) & set(other.index))
        result = paired_stats(other.loc[seeds].to_numpy(), base.loc[seeds].to_numpy())
        if base.empty:
            result["note"] = f"no ok {baseline!r} runs for this PE"
        rows.append({"pe_type": pe, "fusion": fu, "baseline": baseline, **result,
                     "n_unpaired": len(set(base.index) ^ set(other.index))})
        per_seed += [{"pe_type": pe, "fusion": fu, "baseline": baseline, "seed": s, "test_acc": other[s],
                      "test_acc_baseline": base[s], "delta": other[s] - base[s]} for s in seeds]
    summary = pd.DataFrame(rows, columns=list(PAIRED_COLUMNS))
    per_seed_frame = pd.DataFrame(per_seed, columns=["pe_type", "fusion", "baseline", "seed", "test_acc",
                                                     "test_acc_baseline", "delta"])
    return summary, per_seed_frame


def fusion_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Accuracy (%) and latency (ms/sample) per fusion, pooled over PEs and seeds (the paper's Fig. 4a/4b)."""
    ok = latest_ok_pefusion(runs)
    rows = []
    for fu in _ordered(set(pefusion_runs(runs)[R.FUSION].astype(str)), FUSIONS):
        cell = ok[ok[R.FUSION] == fu]
        acc = cell[R.TEST_ACC].astype(float) * 100 if R.TEST_ACC in cell else pd.Series(dtype=float)
        lat = cell[R.LAT_MS_MEAN].astype(float) if R.LAT_MS_MEAN in cell else pd.Series(dtype=float)
        rows.append({"fusion": fu, "n_runs": len(cell), "n_pe_types": cell[R.PE_TYPE].nunique(),
                     "test_acc_mean": acc.mean() if acc.notna().any() else math.nan,
                     "test_acc_std": _sample_std(acc),
                     "lat_ms_mean": lat.mean() if lat.notna().any() else math.nan, "lat_ms_std": _sample_std(lat)})
    return pd.DataFrame(rows, columns=["fusion", "n_runs", "n_pe_types", "test_acc_mean", "test_acc_std",
                                       "lat_ms_mean", "lat_ms_std"])


def _bucket_order(label: str) -> tuple[int, int]:
    match = re.fullmatch(r"(le|gt)(\d+)", label)
    if not match:
        return (2, 0)
    return (0 if match[1] == "le" else 1, int(match[2]))


def length_buckets(runs: pd.DataFrame) -> list[str]:
    """The length-bucket labels recorded by the runs (test_acc_len_<label> or test_n_len_<label>; a bucket
    without test documents has a count but no accuracy), shortest first."""
    labels = {str(c)[len(prefix):] for c in runs.columns
              for prefix in (R.LENGTH_METRIC_PREFIX, R.LENGTH_COUNT_PREFIX) if str(c).startswith(prefix)}
    return sorted(labels, key=lambda lab: (_bucket_order(lab), lab))


def length_bucket_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Test accuracy (%) per length bucket per (pe_type, fusion): mean and sample std over seeds, seeds with
    documents in the bucket, and the mean number of test documents in it. Empty if no run recorded buckets."""
    ok = latest_ok_pefusion(runs)
    rows = []
    for pe, fu in _cells(ok):
        cell = ok[(ok[R.PE_TYPE] == pe) & (ok[R.FUSION] == fu)]
        for label in length_buckets(ok):
            acc = _column(cell, R.length_metric(label)).astype(float) * 100
            count_col = R.LENGTH_COUNT_PREFIX + label
            docs = cell[count_col].astype(float) if count_col in cell else pd.Series(dtype=float)
            rows.append({"pe_type": pe, "fusion": fu, "bucket": label, "n_seeds": int(acc.notna().sum()),
                         "test_acc_mean": acc.mean() if acc.notna().any() else math.nan,
                         "test_acc_std": _sample_std(acc),
                         "n_docs_mean": docs.mean() if docs.notna().any() else math.nan})
    return pd.DataFrame(rows, columns=["pe_type", "fusion", "bucket", "n_seeds", "test_acc_mean", "test_acc_std",
                                       "n_docs_mean"])


def failed_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The failed trial runs with what identifies them and their error, for listing in reports."""
    bad = failed(trials)
    keys = [k for k in (*PEFUSION_IDENTITY, R.ALPHA, R.OMEGA, R.INIT) if k in bad and bad[k].notna().any()]
    out = bad[[TRIAL_ID, RUN_ID, *keys, R.STATUS, R.ERROR]].copy()
    out[RUN_ID] = out[RUN_ID].str[:8]
    return out.reset_index(drop=True)


def search_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials of a hyperparameter search, best first: the config keys that vary, status, and the metrics that
    rank them (accuracies in %)."""
    varied = [k for k in TRIAL_KEYS if k in trials and trials[k].nunique(dropna=True) > 1]
    metrics = [m for m in (R.BEST_VAL_ACC, R.OPTIMISED_METRIC, R.TEST_ACC, R.EPOCHS_RUN) if m in trials]
    out = trials[[TRIAL_ID, *varied, R.STATUS, *metrics]].copy()
    for m in (R.BEST_VAL_ACC, R.VAL_ACC, R.TEST_ACC):
        if m in out:
            out[m] = out[m].astype(float) * 100
    rank = R.BEST_VAL_ACC if R.BEST_VAL_ACC in out else R.OPTIMISED_METRIC
    if rank in out:
        out = out.sort_values(rank, ascending=R.OPTIMISED_MODE != "max", na_position="last")
    return out.reset_index(drop=True)


# ---------------------------------------------------------------------------------------------------------
# Student study
# ---------------------------------------------------------------------------------------------------------


def student_runs(trials: pd.DataFrame) -> pd.DataFrame:
    """The student trial runs (those with params alpha and seed)."""
    return trials[_has(trials, STUDENT_IDENTITY)]


def student_frame(trials: pd.DataFrame) -> pd.DataFrame:
    """All student runs as one long frame, one row per (run, initialisation), columns STUDENT_COLUMNS.

    λ-CV runs (param `init`) give one row, their λ* in lam_star; phase-diagram runs (metrics `<metric>_semantic`
    and `<metric>_positional`, or tag pefusion.sweep=phase_diagram) give two rows at their fixed λ (`lam` param)
    in lam_fixed.
    """
    runs = student_runs(trials)
    if runs.empty:
        raise AnalysisError("no student trial runs (runs need params alpha and seed)")
    # A phase-diagram run fits both initialisations: recognised by its metric names, or its sweep tag when it
    # failed before recording any (its params may still carry a config `init`).
    both = _column(runs, f"{R.EPS_T}_{SEMANTIC}").notna() | (runs[SWEEP] == SOURCE_PHASE)
    one_init, both_inits = runs[~both], runs[both]
    if len(one_init):
        require_metrics(one_init[one_init[R.STATUS] == R.STATUS_OK], [R.EPS_G, R.EPS_T])
    if len(both_inits):
        require_metrics(both_inits[both_inits[R.STATUS] == R.STATUS_OK],
                        [f"{m}_{init}" for m in (R.EPS_G, R.EPS_T) for init in (SEMANTIC, POSITIONAL)])
    parts = [pd.DataFrame({
        RUN_ID: one_init[RUN_ID], START_TIME: one_init[START_TIME], "source": SOURCE_CV,
        R.STATUS: one_init[R.STATUS], R.ERROR: one_init[R.ERROR],
        **{k: _column(one_init, k) for k in STUDENT_KEYS}, R.INIT: _column(one_init, R.INIT).fillna("unknown"),
        LAM_FIXED: np.nan,
        **{m: _column(one_init, m) for m in (*STUDENT_METRICS, R.EPS_LIN, R.LAMBDA_STAR)},
    })]
    for init in (SEMANTIC, POSITIONAL):
        parts.append(pd.DataFrame({
            RUN_ID: both_inits[RUN_ID], START_TIME: both_inits[START_TIME], "source": SOURCE_PHASE,
            R.STATUS: both_inits[R.STATUS], R.ERROR: both_inits[R.ERROR],
            **{k: _column(both_inits, k) for k in STUDENT_KEYS}, R.INIT: init,
            LAM_FIXED: _column(both_inits, R.LAMBDA),
            **{m: _column(both_inits, f"{m}_{init}") for m in STUDENT_METRICS},
            R.EPS_LIN: _column(both_inits, R.EPS_LIN), R.LAMBDA_STAR: np.nan,
        }))
    frame = pd.concat([p for p in parts if len(p)], ignore_index=True)
    frame = frame.assign(**{c: frame[c].astype(float) for c in (R.ALPHA, R.OMEGA, R.SIGMA, R.D, LAM_FIXED,
                                                                 *STUDENT_METRICS, R.EPS_LIN, R.LAMBDA_STAR)})
    return frame[list(STUDENT_COLUMNS)]


def _student_ok(student: pd.DataFrame) -> pd.DataFrame:
    """The ok student rows, the most recent per (source, alpha, omega, sigma, seed, d, fixed λ, init)."""
    ok = student[student[R.STATUS] == R.STATUS_OK]
    return _latest_ok(ok, ["source", *STUDENT_KEYS, LAM_FIXED, R.INIT])[0]


def student_summary(student: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std over seeds of ε_g, ε_t, m, θ, ε_lin, λ* per (source, alpha, omega, sigma, d,
    fixed λ, init); lam_fixed is the λ of phase-diagram runs and NaN for λ-CV runs (their λ is lam_star)."""
    keys = ["source", R.ALPHA, R.OMEGA, R.SIGMA, R.D, LAM_FIXED, R.INIT]
    values = [*STUDENT_METRICS, R.EPS_LIN, R.LAMBDA_STAR]
    grouped = _student_ok(student).groupby(keys, sort=True, dropna=False)
    out = grouped[values].agg(["mean", lambda v: v.std(ddof=1)])
    out.columns = [f"{m}_{'mean' if s == 'mean' else 'std'}" for m, s in out.columns]
    out.insert(0, "n_seeds", grouped[R.SEED].nunique())
    return out.reset_index()


DELTA_COLUMNS = ["source", *STUDENT_KEYS, LAM_FIXED, "eps_g_semantic", "eps_g_positional", "eps_t_semantic",
                 "eps_t_positional", "delta_eps_g", "delta_eps_t"]


def student_deltas(student: pd.DataFrame) -> pd.DataFrame:
    """Per-seed pairs of positional and semantic runs at the same (alpha, omega, sigma, seed, d) — and the same
    λ for phase-diagram runs — with Δε_g and Δε_t = ε(positional) − ε(semantic)."""
    ok = _student_ok(student)
    keys = ["source", *STUDENT_KEYS, LAM_FIXED]
    side = {init: ok.loc[ok[R.INIT] == init, [*keys, R.EPS_G, R.EPS_T]].rename(
        columns={R.EPS_G: f"eps_g_{init}", R.EPS_T: f"eps_t_{init}"}) for init in (SEMANTIC, POSITIONAL)}
    # merge matches NaN keys with NaN keys, so runs of other tools without sigma or d still pair.
    wide = side[SEMANTIC].merge(side[POSITIONAL], on=keys, how="inner")
    wide["delta_eps_g"] = wide["eps_g_positional"] - wide["eps_g_semantic"]
    wide["delta_eps_t"] = wide["eps_t_positional"] - wide["eps_t_semantic"]
    return wide[DELTA_COLUMNS].sort_values(keys, kind="stable").reset_index(drop=True)


DELTA_GROUP = ["source", R.ALPHA, R.OMEGA, R.SIGMA, R.D, LAM_FIXED]


def student_delta_summary(deltas: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std over seeds of Δε_g and Δε_t per (source, alpha, omega, sigma, d, fixed λ), and which
    solution has the lower training loss there (Δε_t > 0: semantic; < 0: positional)."""
    columns = [*DELTA_GROUP, "n_pairs", "delta_eps_g_mean", "delta_eps_g_std", "delta_eps_t_mean",
               "delta_eps_t_std", "lower_train_loss"]
    if deltas.empty:
        return pd.DataFrame(columns=columns)
    grouped = deltas.groupby(DELTA_GROUP, sort=True, dropna=False)
    out = pd.DataFrame({
        "n_pairs": grouped["delta_eps_t"].size(),
        "delta_eps_g_mean": grouped["delta_eps_g"].mean(),
        "delta_eps_g_std": grouped["delta_eps_g"].std(ddof=1),
        "delta_eps_t_mean": grouped["delta_eps_t"].mean(),
        "delta_eps_t_std": grouped["delta_eps_t"].std(ddof=1),
    }).reset_index()
    out["lower_train_loss"] = np.select([out.delta_eps_t_mean > 0, out.delta_eps_t_mean < 0],
                                        [SEMANTIC, POSITIONAL], "tie")
    return out[columns]


def interpolate_curve(curve: Mapping[float, float], omega: float) -> float:
    """A published α(ω) table read at ω (linear between tabulated ω; NaN outside the table)."""
    omegas = np.array(sorted(curve))
    if not omegas[0] <= omega <= omegas[-1]:
        return math.nan
    return float(np.interp(omega, omegas, [curve[o] for o in omegas]))


def crossing_alphas(delta_summary: pd.DataFrame, alpha_c: Mapping[float, float] | None = None) -> pd.DataFrame:
    """Where the mean Δε_t changes sign from − (positional lower) to + (semantic lower) along α, per (source,
    omega, sigma, d, fixed λ): the estimated α_c, linear between the grid points around the first crossing (NaN
    if none), beside the published α_c(ω)."""
    keys = [k for k in DELTA_GROUP if k != R.ALPHA]
    rows = []
    for group, grp in delta_summary.groupby(keys, sort=True, dropna=False):
        grp = grp.sort_values(R.ALPHA)
        a, y = grp[R.ALPHA].to_numpy(float), grp["delta_eps_t_mean"].to_numpy(float)
        estimate = math.nan
        for i in range(len(a) - 1):
            if y[i] < 0 <= y[i + 1]:
                estimate = a[i] + (a[i + 1] - a[i]) * (-y[i]) / (y[i + 1] - y[i])
                break
        omega = dict(zip(keys, group))[R.OMEGA]
        rows.append({**dict(zip(keys, group)), "n_alpha": len(a), "alpha_c_estimate": estimate,
                     "alpha_c_published": interpolate_curve(alpha_c, omega) if alpha_c else math.nan})
    return pd.DataFrame(rows, columns=[*keys, "n_alpha", "alpha_c_estimate", "alpha_c_published"])
