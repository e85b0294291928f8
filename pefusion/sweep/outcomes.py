"""How every trial of a sweep ended (`Outcomes`, a Ray Tune callback in the driver): finished, failed, stopped,
interrupted or pending, and the result rows built from that (`result_rows`), one per run a trial carries.

Statuses are `pefusion.record`'s.
"""
from __future__ import annotations

from typing import Any

from ray import tune
from ray.tune.experiment import Trial

from pefusion import record as R
from pefusion.tracking.trials import (Run, error_summary, error_text, finals, record_only, run_part, runs_of,
                                      trial_status)


class Outcomes(tune.Callback):
    """How each trial ended, as Tune concluded it in this driver or a previous driver left it (a resumed sweep).

    `stack_key`: the search space's stacked key, whose trials carry one run per value. A search's `metric` and
    `mode`: a trial the scheduler stopped has no final record, so its row holds its last epoch's `metric` and,
    under `best_metric`, the best value of `metric` over its epochs.
    """

    def __init__(self, stack_key: str | None = None, metric: str | None = None, mode: str | None = None,
                 best_metric: str | None = None) -> None:
        self.stack_key, self.metric, self.mode, self.best_metric = stack_key, metric, mode, best_metric
        self.total = 0  # the trials Tune plans (a search makes them as it goes)
        self.ran: set[str] = set()  # trials that ran in this driver
        self.concluded: dict[str, str] = {}  # trial id -> final status, as Tune concluded them here
        self.ended_before: set[str] | None = None  # trials already ended when this driver began
        self.trials: list[dict[str, Any]] = []  # the end state: one dict per trial
        self.interrupted = False

    def runs(self, trial: Trial) -> list[Run]:
        return runs_of(trial.trial_id, trial.config, self.stack_key)

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info: Any) -> None:
        if total_num_samples:
            self.total = int(total_num_samples)

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self.ended_before is None:
            self.ended_before = {t.trial_id for t in trials if t.status in (Trial.TERMINATED, Trial.ERROR)}

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.ran.add(trial.trial_id)

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any) -> None:
        self.ran.add(trial.trial_id)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.ran.add(trial.trial_id)
        self.concluded[trial.trial_id] = trial_status(finals(trial, self.runs(trial)))

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.ran.add(trial.trial_id)
        self.concluded[trial.trial_id] = trial_status(finals(trial, self.runs(trial), failed=True))

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Tune's last event: how every trial ended; an interruption leaves some unfinished.

        Any trial that did not conclude in this driver, nor before it, was cut by Ctrl-C or SIGTERM: Tune marks a
        running one TERMINATED as it stops its actor (having saved it as running, so --resume continues it); it is
        'interrupted', never 'stopped', and one never started is 'pending'.
        """
        self.on_step_begin(0, trials)  # interrupted before Tune's first step: nothing has changed since the restore
        snapshot = []
        for trial in trials:
            status = self.concluded.get(trial.trial_id)
            if status is None and trial.trial_id in self.ended_before:
                status = str((trial.last_result or {}).get(R.STATUS, R.STATUS_STOPPED)) \
                    if trial.status == Trial.TERMINATED else R.STATUS_ERROR
            elif status is None:
                # (Tune marks TERMINATED every trial it had asked an actor for, even one still waiting for resources)
                started = trial.trial_id in self.ran or trial.checkpoint is not None
                status = R.STATUS_INTERRUPTED if started else R.STATUS_PENDING
                self.interrupted = True
            snapshot.append({"trial_id": trial.trial_id, "runs": self.runs(trial), "status": status,
                             "last_result": dict(trial.last_result or {}), "error": error_text(trial)
                             if trial.status == Trial.ERROR else "", "best": self._best(trial)})
        self.trials = snapshot

    def _best(self, trial: Trial) -> dict[str, Any]:
        """A trial's best value of the optimised metric over its results, under the study's name for it."""
        if not (self.metric and self.mode and self.best_metric):
            return {}
        return {self.metric: (trial.last_result or {}).get(self.metric),
                self.best_metric: trial.metric_analysis.get(self.metric, {}).get(self.mode)}


def result_rows(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per run of `Outcomes.trials` (a trial is one run, a stacked trial one per stacked value): its
    config and final record, failed ones with their reason (never dropped), runs a scheduler stopped with their
    best epoch, unfinished ones (an interrupted sweep) with their own configuration and status 'interrupted' or
    'pending'."""
    rows = []
    for trial in trials:
        status = trial["status"]
        for run in trial["runs"]:
            last = run_part(trial["last_result"], run) or {}
            row: dict[str, Any] = {"trial_id": run.key, **run.config}
            if status in (R.STATUS_INTERRUPTED, R.STATUS_PENDING):
                row.update({R.STATUS: status, R.ERROR: "", R.EPOCHS_RUN: last.get(R.EPOCH)})
            elif trial["error"]:
                row.update({R.STATUS: R.STATUS_ERROR, R.ERROR: error_summary(trial["error"])})
            elif R.STATUS in last:
                row.update(record_only(last, run.config))
            else:  # stopped by the scheduler: its last epoch's optimised metric and its best so far count
                row.update({R.STATUS: R.STATUS_STOPPED, R.ERROR: "", R.EPOCHS_RUN: last.get(R.EPOCH),
                            **trial["best"]})
            row.update(last.get(R.TRIAL_INFO) or {})  # what the trial resolved replaces what its config asked for
            rows.append(row)
    return rows
