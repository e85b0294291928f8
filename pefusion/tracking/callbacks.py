"""Tune's trial events as MLflow runs (`MLflowRuns`): a child run per run a trial carries, its epochs as series,
its end as the run's status, and on a resumed sweep what a previous driver left out.

Runs in the driver process only: the writes go to the recorder's writer thread (`SweepRecorder.later`), so Tune's
loop never waits on the tracking server. Statuses are `pefusion.record`'s.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

from ray import tune
from ray.tune.experiment import Trial

from pefusion import record as R
from pefusion.tracking.recorder import SweepRecorder
from pefusion.tracking.trials import (Run, error_summary, error_text, final_record, finals, record_only, run_part,
                                      runs_of, stored_epochs)


class MLflowRuns(tune.Callback):
    """Writes the sweep's trials to MLflow through `recorder` (whose parent run is the sweep's).

    `static_params` go on every child run beside its config, but for `resolved_keys` (a trial resolves those where
    it runs and reports them, `record.TRIAL_INFO`); `run_name` names a run from its config; `stack_key`: the
    search space's stacked key, whose trials carry one run per value.
    """

    def __init__(self, recorder: SweepRecorder, static_params: Mapping[str, Any],
                 run_name: Callable[[dict], str], *, resolved_keys: Sequence[str] = (),
                 stack_key: str | None = None) -> None:
        self.recorder = recorder
        self.static_params = dict(static_params)
        self.run_name = run_name
        self.resolved_keys = tuple(resolved_keys)
        self.stack_key = stack_key
        self.ran: set[str] = set()  # trials whose start this driver recorded
        self.nodes: dict[str, str] = {}  # run key -> the node its last result came from
        self.concluded: set[str] = set()  # trials Tune concluded in this driver
        self.ended_before: set[str] | None = None  # trials already ended when this driver began (a resumed sweep)

    def runs(self, trial: Trial) -> list[Run]:
        return runs_of(trial.trial_id, trial.config, self.stack_key)

    def params(self, run: Run) -> dict[str, Any]:
        """The params a run gets when it starts: the study's and the run's config, but for the keys the trial
        resolves itself (those come with its report, `record.TRIAL_INFO`)."""
        return {k: v for k, v in {**self.static_params, **run.config}.items() if k not in self.resolved_keys}

    # --- Tune's events (driver thread; the writes go to the recorder's writer thread) -------------------------
    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self.ended_before is None:
            self.ended_before = {t.trial_id for t in trials if t.status in (Trial.TERMINATED, Trial.ERROR)}

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._start(trial)

    def _start(self, trial: Trial) -> None:
        """A trial starts, or an event of a trial this driver had not seen start."""
        self.recorder.check_open()  # a store that cannot be used ends the sweep at the first event after it failed
        self.ran.add(trial.trial_id)
        for run in self.runs(trial):
            self.recorder.later(self.recorder.trial_run, run.key, self.params(run), self.run_name(run.config),
                                {R.TAG_STACKED: trial.trial_id} if run.member is not None else {})
        if trial.checkpoint is not None:  # resumed: epochs a lost write or a killed driver left out of MLflow
            self.recorder.later(self._backfill, trial)  # reads Ray's stored results: off the driver thread

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any) -> None:
        self.recorder.check_open()
        if trial.trial_id not in self.ran:
            self._start(trial)
        epoch = R.STATUS not in result and R.EPOCH in result
        for run in self.runs(trial):
            part = run_part(result, run)
            if part is None:
                continue
            if R.NODE in part and self.nodes.get(run.key) != part[R.NODE]:  # first result, or a retry
                self.nodes[run.key] = part[R.NODE]
                self.recorder.later(self.recorder.tag_trial, run.key, {R.TAG_NODE: part[R.NODE]})
                if part.get(R.TRIAL_INFO):  # reported with every result; recorded as it first arrives from a process
                    self.recorder.later(self.recorder.log_trial_info, run.key, dict(part[R.TRIAL_INFO]))
            if epoch:
                self.recorder.later(self.recorder.log_epoch, run.key, int(part[R.EPOCH]),
                                    record_only(part, run.config))

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        if trial.trial_id not in self.ran:
            self._start(trial)
        runs = self.runs(trial)
        for run, final in zip(runs, finals(trial, runs)):
            self.recorder.later(self._finish, run, final, trial.checkpoint if final[R.STATUS] == R.STATUS_OK else None)
        self.concluded.add(trial.trial_id)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """A trial Ray failed for good: its process or node was lost more than --max-failures times."""
        if trial.trial_id not in self.ran:
            self._start(trial)
        runs = self.runs(trial)
        for run, final in zip(runs, finals(trial, runs, failed=True)):
            self.recorder.later(self.recorder.finish_trial, run.key, final)
        self.concluded.add(trial.trial_id)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Tune's last event. A trial Tune had already concluded when a previous driver was killed (before, or
        while, its end was written to MLflow) is never reported again on resume: its runs are finished here from
        Tune's saved state, with the epochs Ray stored. A trial that started here and did not conclude was cut by
        Ctrl-C or SIGTERM: its runs are KILLED with the status tag 'interrupted', and --resume reopens them."""
        self.on_step_begin(0, trials)  # interrupted before Tune's first step: nothing has changed since the restore
        for trial in trials:
            if trial.trial_id in self.concluded:
                continue
            if trial.trial_id in self.ended_before:
                self.recorder.later(self._reconcile, trial)
            elif trial.trial_id in self.ran:
                for run in self.runs(trial):
                    self.recorder.later(self.recorder.interrupt_trial, run.key)

    # --- on the writer thread ------------------------------------------------------------------------------
    def _backfill(self, trial: Trial) -> None:
        for result in stored_epochs(trial):
            for run in self.runs(trial):
                part = run_part(result, run)
                if part is None:
                    continue
                if part.get(R.TRIAL_INFO):
                    self.recorder.log_trial_info(run.key, part[R.TRIAL_INFO])
                self.recorder.log_epoch(run.key, int(part[R.EPOCH]), record_only(part, run.config))

    def _finish(self, run: Run, final: dict[str, Any], checkpoint: Any) -> None:
        """A run's end; with a checkpoint (an ok run), its files: the trial's final checkpoint, or for a run of a
        stacked trial the folder named by its value in it."""
        if checkpoint is None:
            self.recorder.finish_trial(run.key, final)
            return
        with checkpoint.as_directory() as local_dir:
            folder = local_dir if run.member is None else os.path.join(local_dir, run.member)
            self.recorder.finish_trial(run.key, final, artifact_dir=folder)

    def _reconcile(self, trial: Trial) -> None:
        # Its runs may be RUNNING (a driver killed mid-finish), or missing altogether (the writes queued for them
        # were lost with a driver stopped while the tracking server was away): either way, write them from Ray.
        runs = self.runs(trial)
        for run in runs:
            self.recorder.trial_run(run.key, self.params(run), self.run_name(run.config),
                                    {R.TAG_STACKED: trial.trial_id} if run.member is not None else {})
        if all(self.recorder.is_done(run.key) for run in runs):
            return
        self._backfill(trial)
        for run in runs:
            if self.recorder.is_done(run.key):
                continue
            if trial.status == Trial.TERMINATED:
                final = final_record(trial, run)
                final.setdefault(R.STATUS, R.STATUS_STOPPED)
                self._finish(run, final, trial.checkpoint if final[R.STATUS] == R.STATUS_OK else None)
            else:
                self.recorder.finish_trial(run.key, {**final_record(trial, run), R.STATUS: R.STATUS_ERROR,
                                                     R.ERROR: error_summary(error_text(trial))})
