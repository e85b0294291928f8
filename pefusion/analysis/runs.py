"""Trial runs read from MLflow into one flat DataFrame, and the selections every table starts from.

`load_trial_runs` and `load_sweep` read MLflow once: one row per trial run, with its params (numbers parsed),
its final metric values and its outcome (`status`, `error`). The tables (`fusion_tables`, `student_tables`)
are pure functions over that frame, so tests and notebooks use them without MLflow.

Units: MLflow stores accuracies as fractions in [0, 1], and the frame keeps them so; every table built from it
reports accuracy in percent and accuracy deltas in percentage points (pp).

A run is a trial when it is tagged `pefusion.role=trial`, or when it is not a sweep parent and carries the
identity params of a PE-fusion trial (dataset, pe_type, fusion, seed) or of a student trial (alpha, seed): runs
written by other tools with those names are analysed like ours. Failed trials (status diverged or error) are
kept in the frame, excluded from every mean, counted and listed; trials stopped early by a scheduler (status
stopped) are not failures but have no test metrics, so test-accuracy tables leave them out too; their
best_val_acc is read from their val_acc per epoch. Runs still RUNNING are left out and counted. Reading only:
MLflow is written by pefusion.tracking alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.tracking.store import check_tracking, mlflow_client, resolve_tracking_uri

DEMO_HINT = ("run python sweeps/arxiv_grid.py --preset demo first "
             "(or python sweeps/lambda_cv.py --preset demo for the student study)")

# Columns of the trial frame that are not params or metrics.
RUN_ID, PARENT_RUN_ID, TRIAL_ID, SWEEP, START_TIME = "run_id", "parent_run_id", "trial_id", "sweep", "start_time"
ID_COLUMNS = (RUN_ID, PARENT_RUN_ID, TRIAL_ID, SWEEP, R.STATUS, R.ERROR, START_TIME)
PEFUSION_IDENTITY = (R.DATASET, R.PE_TYPE, R.FUSION, R.SEED)
STUDENT_IDENTITY = (R.ALPHA, R.SEED)


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
    parent_metrics: dict[str, float] = field(default_factory=dict)  # what the sweep logged when it finished
    experiment_id: str = ""  # MLflow's id of the experiment (for links to its UI)
    unfinished_runs: tuple[str, ...] = ()  # the ids of the `n_unfinished` runs

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


def runs_frame(runs: Iterable) -> tuple[pd.DataFrame, list[str]]:
    """One row per finished trial run: ID_COLUMNS, then params (parsed), then final metric values.

    Returns the frame and the ids of the trial runs left out because they are still running. Params win a name
    clash with a metric (the metric is kept as 'metric.<name>'); a param named like an id column is kept as
    'param.<name>'.
    """
    rows, params_seen, unfinished = [], {}, []
    for run in runs:
        if not _is_trial(run):
            continue
        status, error = _run_outcome(run)
        if status is None:
            unfinished.append(run.info.run_id)
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
    _check_store(uri)
    client = mlflow_client(uri)
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
    _best_val_acc_of_stopped(client, trials)
    _records_missing(trials)
    if trials.empty and parent is not None:
        raise AnalysisError(f"sweep run {parent.info.run_id[:8]} ({parent.data.tags.get(R.TAG_SWEEP, 'unnamed')}) "
                            f"of experiment {experiment!r} has no finished trial runs ({len(unfinished)} still "
                            f"running); pick another with --parent-run")
    if trials.empty:
        raise AnalysisError(f"experiment {experiment!r} has no finished trial runs; {DEMO_HINT}")
    return Sweep(uri, experiment, trials, parent.info.run_id if parent else None,
                 dict(parent.data.tags) if parent else {}, len(unfinished),
                 dict(parent.data.metrics) if parent else {}, exp_id, tuple(unfinished))


def _records_missing(trials: pd.DataFrame) -> None:
    """Mark 'ok' PE-fusion trial runs without a final record (no test_acc) where the sweep's other ok runs have
    one as failed, naming why (in place): a run cut while its record was written, or corrupted since. The
    report then counts and lists them, and goes on with the others. (Where no ok run has one, the tables that
    need it say so: `require_metrics`.)"""
    if trials.empty or R.TEST_ACC not in trials or not all(k in trials for k in PEFUSION_IDENTITY):
        return
    ok = (trials[R.STATUS] == R.STATUS_OK) & trials[list(PEFUSION_IDENTITY)].notna().all(axis=1)
    has = trials[R.TEST_ACC].notna()
    if not (ok & has).any():
        return
    cut = ok & ~has
    trials.loc[cut, R.STATUS] = R.STATUS_ERROR
    trials.loc[cut, R.ERROR] = (f"MLflow run says ok, but its final record is missing ({R.TEST_ACC} and the "
                                f"others): cut while written, or corrupted")


def _best_val_acc_of_stopped(client, trials: pd.DataFrame) -> None:
    """Fill best_val_acc of trials stopped by the scheduler from their val_acc per epoch (in place).

    A stopped trial never sends its final record, so MLflow holds only its epochs, and its latest val_acc is that
    of the epoch it was stopped at, not its best: the best is what a search scored it by.
    """
    stopped = trials.index[(trials[R.STATUS] == R.STATUS_STOPPED) & column(trials, R.BEST_VAL_ACC).isna()]
    best = {i: max((m.value for m in client.get_metric_history(trials.at[i, RUN_ID], R.VAL_ACC)), default=np.nan)
            for i in stopped}
    if best:
        trials[R.BEST_VAL_ACC] = column(trials, R.BEST_VAL_ACC).astype(float)
        trials.loc[list(best), R.BEST_VAL_ACC] = list(best.values())


def epoch_points(sweep: Sweep, names: Sequence[str]) -> pd.DataFrame:
    """The per-epoch points of the metrics `names` of every trial run of `sweep` that has them: one row per
    (run_id, epoch), a column per name (NaN where a run has no point of it). One read per run and name."""
    trials = sweep.trials
    wanted = [(run_id, name) for name in names for run_id in trials.loc[column(trials, name).notna(), RUN_ID]]
    client = mlflow_client(sweep.tracking_uri) if wanted else None  # (none opened, none made, for nothing to read)
    points: dict[tuple[str, int], dict[str, float]] = {}
    for run_id, name in wanted:
        for m in client.get_metric_history(run_id, name):
            if m.step >= 1:  # (step 0 holds final values)
                points.setdefault((run_id, m.step), {})[name] = m.value
    index = pd.MultiIndex.from_tuples(list(points), names=[RUN_ID, R.EPOCH])
    return pd.DataFrame(list(points.values()), index=index, columns=list(names)).sort_index().reset_index()


def system_points(sweep: Sweep, names: Sequence[str]) -> pd.DataFrame:
    """The samples of the sweep's parent-run metrics `names` that it has (MLflow's system metrics): one row per
    sample, columns name, timestamp (Unix ms) and value; empty without a parent run or such metrics."""
    rows, present = [], [n for n in names if n in sweep.parent_metrics] if sweep.parent_run_id else []
    for name in present:
        history = mlflow_client(sweep.tracking_uri).get_metric_history(sweep.parent_run_id, name)
        rows += [(name, m.timestamp, m.value) for m in history]
    return pd.DataFrame(rows, columns=["name", "timestamp", "value"])


def load_trial_runs(tracking_uri: str | None, experiment: str, parent_run: str | None = None) -> pd.DataFrame:
    """Every finished trial run of the experiment (or of one sweep parent run) as a DataFrame, see runs_frame."""
    return load_sweep(tracking_uri, experiment, parent_run).trials


# ---------------------------------------------------------------------------------------------------------
# Selecting and checking runs
# ---------------------------------------------------------------------------------------------------------


def _has(frame: pd.DataFrame, names: Sequence[str]) -> pd.Series:
    if not all(n in frame for n in names):
        return pd.Series(False, index=frame.index)
    return frame[list(names)].notna().all(axis=1)


def column(frame: pd.DataFrame, name: str) -> pd.Series:
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


def student_runs(trials: pd.DataFrame) -> pd.DataFrame:
    """The student trial runs (those with params alpha and seed)."""
    return trials[_has(trials, STUDENT_IDENTITY)]


def failed(trials: pd.DataFrame) -> pd.DataFrame:
    """Trial runs that failed: diverged, error, or an MLflow FAILED/KILLED run. Trials stopped early by a
    scheduler (status stopped) completed normally and are not failures; they have no test metrics."""
    return trials[~trials[R.STATUS].isin(R.SUCCESS_STATUSES)]


def failed_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The failed trial runs with what identifies them and their error, for listing in reports."""
    bad = failed(trials)
    keys = [k for k in (*PEFUSION_IDENTITY, R.ALPHA, R.OMEGA, R.INIT) if k in bad and bad[k].notna().any()]
    out = bad[[TRIAL_ID, RUN_ID, *keys, R.STATUS, R.ERROR]].copy()
    out[RUN_ID] = out[RUN_ID].str[:8]
    return out.reset_index(drop=True)


def require_metrics(ok: pd.DataFrame, names: Sequence[str]) -> None:
    """Raise AnalysisError naming the first metric that some ok run lacks, with how many runs lack it."""
    for name in names:
        missing = ok[RUN_ID] if name not in ok else ok.loc[ok[name].isna(), RUN_ID]
        if len(missing):
            raise AnalysisError(f"metric {name!r} is missing from {len(missing)} of {len(ok)} ok trial runs "
                                f"(e.g. run {missing.iloc[0][:8]}); trials must record the metrics of a PE-fusion "
                                "trial (docs/operations.md)")


def latest_ok(runs: pd.DataFrame, keys: Sequence[str]) -> tuple[pd.DataFrame, int]:
    """The ok runs, the most recent one per `keys` cell (a sweep repeated without --parent-run leaves older
    copies), and how many older copies were set aside."""
    ok = runs[runs[R.STATUS] == R.STATUS_OK].sort_values(START_TIME, kind="stable")
    latest = ok.drop_duplicates(list(keys), keep="last")
    return latest, len(ok) - len(latest)
