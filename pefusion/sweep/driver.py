"""The one sweep driver: what `pefusion.sweep.settle` settled (the options, the probe, the plan), run: start or join
Ray, record it, run or restore the Tuner, write the results, finish the parent.

Every sweep of both studies runs through `run_settled` (`run_sweep`: settle, then run, in one call), so what a
sweep does at its end (and, later, on interruptions and failures) is decided here once. The engine knows neither
study: a study's command line hands it a `StudySweep` (`pefusion.sweep.study`: its MLflow experiment, the trainable
and what it is shipped, a per-point check, the search space, its optimised metric, the params every child run
records, how trials are named, identified and shown, and for `--gpus-per-trial auto` a probe of its largest trial's
GPU memory) and the `SweepOptions` of the flags every sweep shares.

A sweep ends the same way whatever the study: `<out>/<name>_<results_file>.csv` with one row per trial (failed
ones with their error, never dropped), the tables the caller derives from those rows as `<name>_<key>.csv`, all
logged to the sweep's MLflow parent run, which is then finished with the counts of trials and failures.

What goes wrong is decided here too (docs/operations.md). Ctrl-C or SIGTERM: Tune saves the experiment, the trials
keep their last epoch checkpoint, the results CSV lists every trial with its own configuration and
`interrupted`/`pending` for those that did not finish, their MLflow runs and the parent are KILLED (never
FINISHED), and `run_settled` raises `SweepInterrupted` with the line to print (the exact `--resume` command); the
command exits 130. A trial whose process or node is lost is restarted from its last checkpoint up to
`--max-failures` times; an exception of its own code is recorded once as 'error' (`catching_errors`). A request no
node can hold is refused before any trial starts (`pefusion.sweep.gpus.check_resources`). MLflow writes wait out an
unreachable tracking server (`SweepRecorder.later`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pefusion import record as R
from pefusion.errors import SweepInterrupted
from pefusion.storage import path_name, redact
from pefusion.sweep import console
from pefusion.sweep.cluster import cluster_gpus, start_cluster
from pefusion.sweep.console import counted
from pefusion.sweep.options import SweepOptions
from pefusion.sweep.outcomes import Outcomes, result_rows
from pefusion.sweep.progress import Progress
from pefusion.sweep.settle import SettledSweep, settle
from pefusion.sweep.study import StudySweep, varying_keys
from pefusion.sweep.tuner import run_tune
from pefusion.tracking.callbacks import MLflowRuns
from pefusion.tracking.recorder import SweepRecorder
from pefusion.tracking.store import TrackingError


@dataclass
class SweepResult:
    rows: pd.DataFrame  # one row per trial: config, identity, record, status, error
    paths: list[Path] = field(default_factory=list)  # the CSVs written (and logged to the parent run)
    experiment_path: str = ""  # Ray's experiment folder: what --resume continues
    parent_run_id: str = ""

    @property
    def name(self) -> str:
        return path_name(self.experiment_path)


def run_sweep(study: StudySweep, opts: SweepOptions, out_dir: str | Path = "results") -> SweepResult:
    """One sweep in one call: `settle` it, then `run_settled` (what a script that has no `--plan` to stop at calls)."""
    settled = settle(study, opts)
    return run_settled(settled, out_dir)


def run_settled(settled: SettledSweep, out_dir: str | Path = "results") -> SweepResult:
    """Run (or with `--resume` continue) the sweep `settle` settled and write its results; see the module
    docstring. Its parent run gets the card time the sweep held: from the start of its settling (the GPU probe
    included) to its end, times the cluster's GPUs (`SweepRecorder.log_card_time`)."""
    if settled.opts.plan:
        raise ValueError("a sweep settled for --plan is said, not run: settle it without opts.plan to run it")
    study, opts, shipped, plan, start = settled.study, settled.opts, settled.shipped, settled.plan, settled.started
    console.quiet(settled.path, opts.verbose)  # Ray's and MLflow's messages to the experiment's driver.log
    start_cluster(opts)
    # Opened while Tune starts the trials' processes (both take seconds); a trial's first event waits for it.
    recorder = SweepRecorder(settled.tracking_uri, settled.experiment, opts.sweep, settled.path, wait=False,
                             announce=True, system_metrics=True,
                             tags={R.TAG_RAY_ADDRESS: opts.address or "local", R.TAG_COMMAND: opts.command,
                                   **opts.tags})
    if plan is not None:
        recorder.later(recorder.log_plan, plan.metrics(), plan.tags())
    for folder, files in study.parent_files(shipped).items():
        recorder.later(recorder.log_parent_artifacts, files, folder)
    # A resumed sweep's trials carry the runs they were made with, whatever this driver's flags say.
    stack_key = study.space.stacked_key() or study.stackable
    outcomes = Outcomes(stack_key, study.metric, study.mode, study.best_metric)
    callbacks = [
        MLflowRuns(recorder, study.static_params, study.run_name, resolved_keys=study.resolved_keys,
                   stack_key=stack_key),
        Progress(study.run_name, shown=study.shown, varying=varying_keys(study.space), labels=study.labels,
                 progress=opts.progress, stack_key=stack_key, planned_epochs=study.planned_epochs,
                 may_end_early=study.may_end_early, testing_s_planned=plan.testing_s if plan else 0.0),
        outcomes,
    ]
    try:
        run_tune(settled, shipped, callbacks)
    except Exception:
        if recorder.open_error is not None:  # raised by a trial event (`MLflowRuns`)
            raise TrackingError(recorder.open_error) from None
        raise
    recorder.wait_open()  # a resumed sweep with nothing left to run never waited for it
    recorder.flush()

    rows = pd.DataFrame(result_rows(outcomes.trials))
    for key, value in study.identity.items():  # trials whose config does not vary the key
        rows[key] = rows[key].fillna(value) if key in rows else value
    keys = [k for k in study.sort_keys if k in rows.columns]
    rows = rows.sort_values(keys, kind="stable").reset_index(drop=True)
    result = SweepResult(rows, experiment_path=redact(settled.path), parent_run_id=recorder.parent_run_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gpus = cluster_gpus()
    if outcomes.interrupted:
        recorder.log_card_time(time.monotonic() - start, gpus)
        _interrupted(result, out / f"{result.name}_{study.results_file}.csv", settled, recorder, outcomes)
    tables = {study.results_file: rows, **study.tables(rows)}
    for key, table in tables.items():
        path = out / f"{result.name}_{key}.csv"
        study.csv(table).to_csv(path, index=False)
        result.paths.append(path)
    recorder.log_parent_artifacts(result.paths)
    recorder.log_card_time(time.monotonic() - start, gpus)
    n_failed = int((~rows[R.STATUS].isin(R.SUCCESS_STATUSES)).sum()) if R.STATUS in rows else len(rows)
    recorder.finish_sweep({"n_trials": len(rows), "n_failed": n_failed, **study.parent_metrics(rows)})
    return result


def _interrupted(result: SweepResult, path: Path, settled: SettledSweep, recorder: SweepRecorder,
                 outcomes: Outcomes) -> None:
    """An interrupted sweep: the results CSV of the trials Tune has made so far (no tables of a partial sweep),
    the parent run KILLED, and `SweepInterrupted` with the one line to print."""
    study = settled.study
    study.csv(result.rows).to_csv(path, index=False)
    recorder.interrupt_sweep()
    recorder.flush()
    statuses = list(result.rows[R.STATUS]) if R.STATUS in result.rows else []
    stacked = study.space.stacked_key()  # a stacked trial's rows are its runs
    per_trial = len(study.space[stacked].values) if stacked else 1
    # Tune makes its trials as it goes (a search, or a grid under --max-concurrent): some are not made yet
    n = max(outcomes.total * per_trial, len(statuses))
    finished, running = sum(s in R.FINAL_STATUSES for s in statuses), statuses.count(R.STATUS_INTERRUPTED)
    what = "run" if stacked else "trial"
    raise SweepInterrupted(f"interrupted: {finished} of {counted(n, what)} finished ({running} running, "
                           f"{n - finished - running} pending); continue with: {settled.resume_command}")
