"""The one sweep driver: validate, start or join Ray, run or restore the Tuner, write the results, finish the parent.

Every sweep of both studies runs through `run_sweep`, so what a sweep does at its end (and, later, on
interruptions and failures) is decided here once. The engine knows neither study: a study's command line hands it
a `StudySweep` (`pefusion.sweep.study`: its MLflow experiment, the trainable and what it is shipped, a per-point
check, the search space, its optimised metric, the params every child run records, how trials are named, identified
and shown, and for `--gpus-per-trial auto` a probe of its largest trial's GPU memory) and the `SweepOptions` of the
flags every sweep shares.

A sweep ends the same way whatever the study: `<out>/<name>_<results_file>.csv` with one row per trial (failed
ones with their error, never dropped), the tables the caller derives from those rows as `<name>_<key>.csv`, all
logged to the sweep's MLflow parent run, which is then finished with the counts of trials and failures.

What goes wrong is decided here too (SPEC §9). Ctrl-C or SIGTERM: Tune saves the experiment, the trials keep their
last epoch checkpoint, the results CSV lists every trial with its own configuration and `interrupted`/`pending`
for those that did not finish, their MLflow runs and the parent are KILLED (never FINISHED), and `run_sweep`
raises `SweepInterrupted` with the line to print (the exact `--resume` command); the command exits 130. A trial
whose process or node is lost is restarted from its last checkpoint up to `--max-failures` times; an exception of
its own code is recorded once as 'error' (`catching_errors`). A request no node can hold is refused before any
trial starts (`check_resources`). MLflow writes wait out an unreachable tracking server (`SweepRecorder.later`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pefusion import record as R
from pefusion.errors import SweepInterrupted
from pefusion.sweep.console import counted
from pefusion.sweep.gpus import AUTO, auto_packing
from pefusion.sweep.space import Stack, grid_size
from pefusion.sweep.live import LiveSweep, result_rows
from pefusion.sweep.study import StudySweep
from pefusion.sweep.options import SweepOptions
from pefusion.sweep.tuner import check_local_request, run_tune


@dataclass
class SweepResult:
    rows: pd.DataFrame  # one row per trial: config, identity, record, status, error
    paths: list[Path] = field(default_factory=list)  # the CSVs written (and logged to the parent run)
    experiment_path: str = ""  # Ray's experiment folder: what --resume continues
    parent_run_id: str = ""

    @property
    def name(self) -> str:
        return self.experiment_path.rstrip("/").split("/")[-1]


def validate(study: StudySweep) -> int:
    """Check every point the space can produce (grid values, choices, both ends of each range), before Ray
    starts; returns how many were checked."""
    points = study.space.points()
    for point in points:
        study.check_point(point)
    return len(points)


def resolve_gpus(study: StudySweep, opts: SweepOptions) -> SweepOptions:
    """`opts` with `--gpus-per-trial auto` (typed, or the flag left out) replaced by the fraction it means here,
    printed and tagged on the parent run with its reason; a number as it is. Left out for a study whose trials
    never use a GPU: no GPU, and nothing to say."""
    if opts.gpus_per_trial is None and study.gpu_probe is None:
        return dataclasses.replace(opts, gpus_per_trial=0.0)
    if opts.gpus_per_trial not in (AUTO, None):
        return opts
    explicit = opts.gpus_per_trial == AUTO
    packing = auto_packing(study.gpu_probe, study.space.trial_points(), sweep=study.sweep, remote=bool(opts.address),
                           declared_gpus=opts.num_gpus, explicit=explicit)
    print(f"--gpus-per-trial auto{'' if explicit else ' (the default)'}: {packing.reason}", flush=True)
    return dataclasses.replace(opts, gpus_per_trial=packing.gpus_per_trial,
                               tags={**opts.tags, R.TAG_GPUS_PER_TRIAL: f"{packing.gpus_per_trial:g}",
                                     R.TAG_GPUS_AUTO: packing.reason})


def resolve_stacking(study: StudySweep, opts: SweepOptions) -> StudySweep:
    """`study` with its stackable key's grid trained together in one trial (a `stack`), or not: as `--stack-seeds`
    says, or the search-space file (a `stack`), and else separate trials, on every device: the separate trial is
    the path every card has run."""
    key = study.stackable
    if key is None or key not in study.space:
        return study
    stacked = isinstance(study.space[key], Stack)
    stack = opts.stack if opts.stack is not None else stacked
    if stack == stacked:
        return study
    return dataclasses.replace(study, space=study.space.stacked(key) if stack else study.space.unstacked(key))


def run_sweep(study: StudySweep, opts: SweepOptions, out_dir: str | Path = "results") -> SweepResult:
    """Run (or with `opts.resume` continue) one sweep and write its results; see the module docstring."""
    validate(study)
    study = resolve_stacking(study, opts)
    opts = resolve_gpus(study, opts)
    check_local_request(opts)
    shipped = study.ship()
    line = study.describe(shipped)
    if line:
        print(line, flush=True)
    stacked = study.space.stacked_key()
    if stacked:
        values = study.space[stacked].values
        print(f"{stacked} {', '.join(map(str, values))} stacked: each of the {grid_size(study.space)} trials trains "
              f"its {len(values)} runs together, as one batched model", flush=True)
    live, exp_path = run_tune(study, opts, shipped)
    recorder = live.recorder
    rows = pd.DataFrame(result_rows(live.trials))
    for key, value in study.identity.items():  # trials whose config does not vary the key
        rows[key] = rows[key].fillna(value) if key in rows else value
    keys = [k for k in study.sort_keys if k in rows.columns]
    rows = rows.sort_values(keys, kind="stable").reset_index(drop=True)
    result = SweepResult(rows, experiment_path=exp_path, parent_run_id=recorder.parent_run_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if live.interrupted:
        _interrupted(result, out / f"{result.name}_{study.results_file}.csv", study, opts, live)
    tables = {study.results_file: rows, **study.tables(rows)}
    for key, table in tables.items():
        path = out / f"{result.name}_{key}.csv"
        study.csv(table).to_csv(path, index=False)
        result.paths.append(path)
    recorder.log_parent_artifacts(result.paths)
    n_failed = int((~rows[R.STATUS].isin(R.SUCCESS_STATUSES)).sum()) if R.STATUS in rows else len(rows)
    recorder.finish_sweep({"n_trials": len(rows), "n_failed": n_failed, **study.parent_metrics(rows)})
    return result


def _interrupted(result: SweepResult, path: Path, study: StudySweep, opts: SweepOptions, live: LiveSweep) -> None:
    """An interrupted sweep: the results CSV of the trials Tune has made so far (no tables of a partial sweep),
    the parent run KILLED, and `SweepInterrupted` with the one line to print."""
    study.csv(result.rows).to_csv(path, index=False)
    live.recorder.interrupt_sweep()
    live.recorder.flush()
    statuses = list(result.rows[R.STATUS]) if R.STATUS in result.rows else []
    stacked = study.space.stacked_key()  # a stacked trial's rows are its runs
    per_trial = len(study.space[stacked].values) if stacked else 1
    # Tune makes its trials as it goes (a search, or a grid under --max-concurrent): some are not made yet
    n = max(live.total * per_trial, len(statuses))
    finished, running = sum(s in R.FINAL_STATUSES for s in statuses), statuses.count(R.STATUS_INTERRUPTED)
    what = "run" if stacked else "trial"
    raise SweepInterrupted(f"interrupted: {finished} of {counted(n, what)} finished ({running} running, "
                           f"{n - finished - running} pending); continue with: {opts.resume_command(result.name)}")
