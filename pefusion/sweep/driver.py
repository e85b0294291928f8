"""The one sweep driver: settle the sweep, start or join Ray, record it, run or restore the Tuner, write the results,
finish the parent.

Every sweep of both studies runs through `run_sweep`, so what a sweep does at its end (and, later, on
interruptions and failures) is decided here once. The engine knows neither study: a study's command line hands it
a `StudySweep` (`pefusion.sweep.study`: its MLflow experiment, the trainable and what it is shipped, a per-point
check, the search space, its optimised metric, the params every child run records, how trials are named, identified
and shown, and for `--gpus-per-trial auto` a probe of its largest trial's GPU memory) and the `SweepOptions` of the
flags every sweep shares.

A sweep ends the same way whatever the study: `<out>/<name>_<results_file>.csv` with one row per trial (failed
ones with their error, never dropped), the tables the caller derives from those rows as `<name>_<key>.csv`, all
logged to the sweep's MLflow parent run, which is then finished with the counts of trials and failures.

What goes wrong is decided here too (docs/operations.md). Ctrl-C or SIGTERM: Tune saves the experiment, the trials
keep their last epoch checkpoint, the results CSV lists every trial with its own configuration and
`interrupted`/`pending` for those that did not finish, their MLflow runs and the parent are KILLED (never
FINISHED), and `run_sweep` raises `SweepInterrupted` with the line to print (the exact `--resume` command); the
command exits 130. A trial whose process or node is lost is restarted from its last checkpoint up to
`--max-failures` times; an exception of its own code is recorded once as 'error' (`catching_errors`). A request no
node can hold is refused before any trial starts (`pefusion.sweep.gpus.check_resources`). MLflow writes wait out an
unreachable tracking server (`SweepRecorder.later`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from pefusion import record as R
from pefusion.errors import SweepInterrupted
from pefusion.storage import redact
from pefusion.sweep import console
from pefusion.sweep.console import counted
from pefusion.sweep.options import SweepOptions, path_name
from pefusion.sweep.outcomes import Outcomes, result_rows
from pefusion.sweep.progress import Progress
from pefusion.sweep.enginecost import engine_cost
from pefusion.sweep.gpus import local_node
from pefusion.sweep.plan import (SweepPlan, finished_configs, make_plan, process_age, time_trials,
                                 trials_at_once)
from pefusion.sweep.settle import SettledSweep, is_remote, settle, settle_trials, validate
from pefusion.sweep.space import grid_size
from pefusion.sweep.study import StudySweep, varying_keys
from pefusion.sweep.tuner import cluster_gpus, run_tune, start_cluster, tune_env
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
    """Run (or with `opts.resume` continue) one sweep and write its results; see the module docstring. Its parent
    run gets the card time the sweep held: from here (the GPU probe and Ray's start included) to its end, times the
    cluster's GPUs (`SweepRecorder.log_card_time`)."""
    start = time.monotonic()
    settled = settle(study, opts)
    study, opts = settled.study, settled.opts
    shipped = study.ship()
    plan = _say_plan(study, opts, shipped, start, settled.path, measure=False)
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


def plan_sweep(study: StudySweep, opts: SweepOptions) -> SweepPlan | None:
    """`--plan`: what `run_sweep` would print before Ray starts (the points checked, GPUs per trial settled, the
    data read and the trials timed), and nothing more: no Ray, no MLflow run, no experiment folder."""
    start = time.monotonic()
    path = settle(study, opts).path if opts.resume else None  # (a resumed sweep's folder, checked)
    validate(study)
    study, opts = settle_trials(study, opts)
    return _say_plan(study, opts, (study.plan_ship or study.ship)(), start, path, measure=True)


def _say_plan(study: StudySweep, opts: SweepOptions, shipped: Mapping[str, Any], start: float,
              path: str | None, measure: bool) -> SweepPlan | None:
    """Print the sweep's description, its stacking, and its plan (`pefusion.sweep.plan`; None for a study that
    cannot time its trials): the engine's costs measured on this machine unless the sweep joins a cluster, and
    for a resumed sweep (its experiment at `path`) the trials it has left. `start`: the sweep's `time.monotonic()`
    at its start, from which its wall time is counted. `measure`: whether Ray's costs may be measured now (`--plan`)
    or only taken as `--plan` kept them (a sweep: a tiny Ray sweep before its own would cost more than it tells)."""
    line = study.describe(shipped)
    if line:
        print(line, flush=True)
    stacked = study.space.stacked_key()
    if stacked:
        values = study.space[stacked].values
        print(f"{stacked} {', '.join(map(str, values))} stacked: each of the {grid_size(study.space)} trials trains "
              f"its {len(values)} runs together, as one batched model", flush=True)
    if study.timer is None:
        return None
    timing = time_trials(study, opts, shipped, fresh=measure)
    at_once, _ = trials_at_once(opts.cpus_per_trial, opts.gpus_per_trial, local_node(opts), opts.max_concurrent,
                                grid_size(study.space) * study.num_samples)
    cost = None if opts.address else engine_cost(at_once, tune_env(), study.trainable.__module__,
                                                 measure_now=measure)
    finished = finished_configs(path) if opts.resume and path and not is_remote(opts) else []
    so_far, age = time.monotonic() - start, process_age()
    plan = make_plan(study, opts, timing, cost=cost, so_far=so_far, before=age - so_far if age else None,
                     finished=finished)
    print("\n".join(plan.lines), flush=True)
    return plan


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
