"""The driver's view of a running sweep: Tune's trial events forwarded to MLflow, progress lines, how every trial
ended (finished, failed, interrupted, pending), and the result rows built from that.

Runs in the driver process only. MLflow writes go to the recorder's writer thread (`SweepRecorder.later`), so
Tune's loop never waits on the tracking server; statuses follow SPEC §9 (`pefusion.record`).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ray import tune
from ray.tune.experiment import Trial
from ray.tune.result import AUTO_RESULT_KEYS, EXPR_RESULT_FILE

from pefusion import record as R
from pefusion.sweep.tracking import SweepRecorder

# Keys Ray adds to every result besides AUTO_RESULT_KEYS.
RAY_EXTRA_KEYS = {"trial_id", "done", "should_checkpoint", "experiment_tag", "checkpoint_dir_name"}
def _stored_epochs(trial: Trial) -> list[dict[str, Any]]:
    """The per-epoch results Ray stored for `trial` (its result.json, on any storage), oldest first."""
    try:
        fs, path = trial.storage.storage_filesystem, f"{trial.storage.trial_fs_path}/{EXPR_RESULT_FILE}"
        with fs.open_input_stream(path) as f:
            lines = f.read().decode().splitlines()
    except (OSError, AttributeError):
        return []
    results = [json.loads(ln) for ln in lines if ln.strip()]
    return [r for r in results if R.STATUS not in r and R.EPOCH in r]


@dataclass
class LiveSweep:
    """What the driver knows of the sweep it is running: MLflow forwarding, progress lines, how trials ended.

    Lives in the driver only. Tune pickles its callbacks with the experiment, so `TrialEvents` holds nothing and
    finds the sweep of this process in `_LIVE`: a resumed sweep gets this driver's options, not the first one's.
    """

    recorder: SweepRecorder
    static_params: Mapping[str, Any]
    run_name: Callable[[dict], str]
    progress_metric: str | None = None
    progress: bool = True
    every_s: float = 30.0
    total: int = 0
    started_at: float = field(default_factory=time.time)
    said_at: float = field(default_factory=time.time)
    ran: set[str] = field(default_factory=set)  # trials that ran in this driver
    ended_before: set[str] | None = None  # trials already ended when this driver began (a resumed sweep)
    nodes: dict[str, str] = field(default_factory=dict)  # trial id -> the node its last result came from
    concluded: dict[str, str] = field(default_factory=dict)  # trial id -> final status, as Tune concluded them
    finished_here: int = 0  # trials that ended in this driver (the rate behind the time-left estimate)
    trials: list[dict[str, Any]] = field(default_factory=list)  # the end state: one dict per trial
    interrupted: bool = False

    # --- Tune events (driver thread; MLflow writes go to the recorder's writer thread) ---------------------------
    def start(self, trial: Trial) -> None:
        self.recorder.check_open()  # a store that cannot be used ends the sweep at the first event after it failed
        self.ran.add(trial.trial_id)
        params = {**self.static_params, **trial.config}
        self.recorder.later(self.recorder.trial_run, trial.trial_id, params, self.run_name(trial.config))
        if trial.checkpoint is not None:  # resumed: epochs a lost write or a killed driver left out of MLflow
            self.recorder.later(self._backfill, trial.trial_id, _stored_epochs(trial))

    def _backfill(self, trial_id: str, epochs: list[dict[str, Any]]) -> None:
        for result in epochs:
            self.recorder.log_epoch(trial_id, int(result[R.EPOCH]),
                                    {k: result[k] for k in R.EPOCH_METRICS if k in result})

    def result(self, trial: Trial, result: Mapping[str, Any]) -> None:
        self.recorder.check_open()
        if trial.trial_id not in self.ran:
            self.start(trial)
        if R.NODE in result and self.nodes.get(trial.trial_id) != result[R.NODE]:  # first result, or a retry
            self.nodes[trial.trial_id] = result[R.NODE]
            self.recorder.later(self.recorder.tag_trial, trial.trial_id, {R.TAG_NODE: result[R.NODE]})
        if R.STATUS not in result and R.EPOCH in result:
            self.recorder.later(self.recorder.log_epoch, trial.trial_id, int(result[R.EPOCH]),
                                {k: result[k] for k in R.EPOCH_METRICS if k in result})

    def complete(self, trial: Trial, trials: list[Trial]) -> None:
        if trial.trial_id not in self.ran:
            self.start(trial)
        final = _final(trial)
        if R.STATUS not in final:  # stopped by the scheduler before its final report
            final.update({R.STATUS: R.STATUS_STOPPED, R.EPOCHS_RUN: (trial.last_result or {}).get(R.EPOCH, 0)})
        checkpoint = trial.checkpoint if final[R.STATUS] == R.STATUS_OK else None
        self.recorder.later(self._finish, trial.trial_id, final, checkpoint)
        self._concluded(trial, final, trials)

    def _finish(self, trial_id: str, final: dict[str, Any], checkpoint: Any) -> None:
        if checkpoint is None:
            self.recorder.finish_trial(trial_id, final)
            return
        with checkpoint.as_directory() as local_dir:
            self.recorder.finish_trial(trial_id, final, artifact_dir=local_dir)

    def error(self, trial: Trial, trials: list[Trial]) -> None:
        """A trial Ray failed for good: its process or node was lost more than --max-failures times."""
        if trial.trial_id not in self.ran:
            self.start(trial)
        final = {**_final(trial), R.STATUS: R.STATUS_ERROR, R.ERROR: error_summary(_error_text(trial))}
        self.recorder.later(self.recorder.finish_trial, trial.trial_id, final)
        self._concluded(trial, final, trials)

    def _concluded(self, trial: Trial, final: Mapping[str, Any], trials: list[Trial]) -> None:
        self.concluded[trial.trial_id] = str(final[R.STATUS])
        self.finished_here += 1
        if self.progress:
            value = final.get(self.progress_metric) if self.progress_metric else None
            shown = f"{self.progress_metric} {value:.4g}" if isinstance(value, (int, float)) else final[R.STATUS]
            self.say(trials, f"{self.run_name(trial.config) or trial.trial_id} {final[R.STATUS]}: {shown}")

    def first_step(self, trials: list[Trial]) -> None:
        if self.ended_before is None:
            self.ended_before = {t.trial_id for t in trials if t.status in (Trial.TERMINATED, Trial.ERROR)}

    def step(self, trials: list[Trial]) -> None:
        if self.progress and time.time() - self.said_at >= self.every_s:
            self.say(trials)

    def say(self, trials: list[Trial], ended: str = "") -> None:
        """One progress line: done (failed) / running / pending of n, elapsed, time left, the trial that ended."""
        self.said_at = time.time()
        n = max(self.total, len(trials))
        # Tune calls back before it marks the trial ended: count ends from what this driver saw
        over = set(self.concluded) | (self.ended_before or set())
        done = len(over)
        running = sum(t.status == Trial.RUNNING and t.trial_id not in over for t in trials)
        failed = sum(s not in R.SUCCESS_STATUSES for s in self.concluded.values())
        elapsed = self.said_at - self.started_at
        if n <= done:
            left = "0s left"
        elif self.finished_here:
            left = f"~{_duration(elapsed / self.finished_here * (n - done))} left"
        else:
            left = "time left known after the first trial"
        print(f"[{time.strftime('%H:%M:%S')}] {done}/{n} done ({failed} failed), {running} running, "
              f"{n - done - running} pending; {_duration(elapsed)} elapsed, {left}"
              + (f"; {ended}" if ended else ""), flush=True)

    def end(self, trials: list[Trial]) -> None:
        """Tune's last event: record how every trial ended; an interruption leaves some unfinished.

        A trial Tune had already concluded when a previous driver was killed (before, or while, its end was
        written to MLflow) is never reported again on resume: its run is finished here from Tune's saved state,
        with the epochs Ray stored. Any other trial that did not conclude in this driver was cut by Ctrl-C or
        SIGTERM: Tune marks a running one TERMINATED as it stops its actor (having saved it as running, so
        --resume continues it); it is 'interrupted', never 'stopped', and one never started is 'pending'.
        """
        self.first_step(trials)  # interrupted before Tune's first step: nothing has changed since the restore
        snapshot = []
        for trial in trials:
            status = self.concluded.get(trial.trial_id)
            if status is None and trial.trial_id in self.ended_before:
                self.recorder.later(self._reconcile, trial)
                status = str(_final(trial).get(R.STATUS, R.STATUS_STOPPED)) if trial.status == Trial.TERMINATED \
                    else R.STATUS_ERROR
            elif status is None:
                # (Tune marks TERMINATED every trial it had asked an actor for, even one still waiting for resources)
                started = trial.trial_id in self.ran or trial.checkpoint is not None
                status = R.STATUS_INTERRUPTED if started else R.STATUS_PENDING
                self.interrupted = True
                if trial.trial_id in self.ran:
                    self.recorder.later(self.recorder.interrupt_trial, trial.trial_id)
            snapshot.append({"trial_id": trial.trial_id, "config": dict(trial.config), "status": status,
                             "last_result": dict(trial.last_result or {}), "error": _error_text(trial)
                             if trial.status == Trial.ERROR else "",
                             "best_val_acc": trial.metric_analysis.get(R.VAL_ACC, {}).get("max")})
        self.trials = snapshot

    def _reconcile(self, trial: Trial) -> None:
        # Its run may be RUNNING (a driver killed mid-finish), or missing altogether (the writes queued for it
        # were lost with a driver stopped while the tracking server was away): either way, write it from Ray.
        self.recorder.trial_run(trial.trial_id, {**self.static_params, **trial.config}, self.run_name(trial.config))
        if self.recorder.is_done(trial.trial_id):
            return
        self._backfill(trial.trial_id, _stored_epochs(trial))
        if trial.status == Trial.TERMINATED:
            final = _final(trial)
            final.setdefault(R.STATUS, R.STATUS_STOPPED)
            self._finish(trial.trial_id, final, trial.checkpoint if final[R.STATUS] == R.STATUS_OK else None)
        else:
            self.recorder.finish_trial(trial.trial_id, {**_final(trial), R.STATUS: R.STATUS_ERROR,
                                                        R.ERROR: error_summary(_error_text(trial))})


_LIVE: LiveSweep | None = None  # the sweep this driver process runs


def begin(sweep: LiveSweep) -> LiveSweep:
    """Make `sweep` the one `TrialEvents` forwards to (a driver runs one sweep at a time)."""
    global _LIVE
    _LIVE = sweep
    return sweep


class TrialEvents(tune.Callback):
    """Forwards Tune's trial events to this process's `LiveSweep` (pickled with the experiment: holds nothing)."""

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        if _LIVE is not None and total_num_samples:
            _LIVE.total = int(total_num_samples)

    def on_trial_start(self, iteration, trials, trial, **info):
        _LIVE.start(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        _LIVE.result(trial, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        _LIVE.complete(trial, trials)

    def on_trial_error(self, iteration, trials, trial, **info):
        _LIVE.error(trial, trials)

    def on_step_begin(self, iteration, trials, **info):
        _LIVE.first_step(trials)

    def on_step_end(self, iteration, trials, **info):
        _LIVE.step(trials)

    def on_experiment_end(self, trials, **info):
        _LIVE.end(trials)


def _final(trial: Trial) -> dict[str, Any]:
    return {k: v for k, v in record_only(trial.last_result or {}, trial.config).items()
            if k not in ("started_at", "ended_at")}


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _error_text(trial) -> str:
    """Tune writes the traceback to the trial's local error file before calling back (storage syncs later)."""
    path = trial.error_file
    if path and os.path.exists(path):
        return Path(path).read_text()
    return str(trial.get_error() or "")


def error_summary(error: Any) -> str:
    """The last meaningful line of a trial's traceback, e.g. 'RuntimeError: boom'."""
    lines = [ln.strip() for ln in str(error or "unknown error").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if not ln.startswith(("File ", "^", "~")):
            return ln
    return lines[-1] if lines else "unknown error"


def result_rows(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per trial of `LiveSweep.trials`: its config and final record, failed ones with their reason
    (never dropped), trials a scheduler stopped with their best epoch, unfinished ones (an interrupted sweep)
    with their own configuration and status 'interrupted' or 'pending'."""
    rows = []
    for trial in trials:
        config, last, status = trial["config"], trial["last_result"], trial["status"]
        row: dict[str, Any] = {"trial_id": trial["trial_id"], **config}
        if status in (R.STATUS_INTERRUPTED, R.STATUS_PENDING):
            row.update({R.STATUS: status, R.ERROR: "", R.EPOCHS_RUN: last.get(R.EPOCH)})
        elif trial["error"]:
            row.update({R.STATUS: R.STATUS_ERROR, R.ERROR: error_summary(trial["error"])})
        elif R.STATUS in last:
            row.update(record_only(last, config))
        else:  # stopped by the scheduler: its best epoch so far counts
            row.update({R.STATUS: R.STATUS_STOPPED, R.ERROR: "", R.EPOCHS_RUN: last.get(R.EPOCH),
                        R.VAL_ACC: last.get(R.VAL_ACC), R.BEST_VAL_ACC: trial["best_val_acc"]})
        rows.append(row)
    return rows


def record_only(result: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """A reported result without Ray's bookkeeping or the config (those are params, not metrics)."""
    skip = set(AUTO_RESULT_KEYS) | RAY_EXTRA_KEYS | set(config) | {R.EPOCH}
    return {k: v for k, v in result.items() if k not in skip}
