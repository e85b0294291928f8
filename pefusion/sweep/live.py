"""The driver's view of a running sweep: Tune's trial events forwarded to MLflow, progress lines, how every trial
ended (finished, failed, interrupted, pending), and the result rows built from that.

Runs in the driver process only. MLflow writes go to the recorder's writer thread (`SweepRecorder.later`), so
Tune's loop never waits on the tracking server; statuses follow SPEC §9 (`pefusion.record`). A result with an
epoch and no status is an epoch: every number in it goes to MLflow's series of that name, listed nowhere.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

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


@dataclass(frozen=True)
class Run:
    """One run a trial carries: its key (the MLflow child run's `pefusion.trial_id` tag and the results row's
    trial_id), the value of the stacked key it stands for (None for a trial that is one run) and its config."""

    key: str
    member: str | None
    config: dict[str, Any]


def runs_of(trial_id: str, config: Mapping[str, Any], stack_key: str | None) -> list[Run]:
    """The runs of a trial: one per value of the stacked key where the trial's config holds their list (a
    `stack` in the search space), else the trial itself."""
    values = config.get(stack_key) if stack_key else None
    if not isinstance(values, list):
        return [Run(trial_id, None, dict(config))]
    return [Run(f"{trial_id}/{stack_key}={v}", str(v), {**config, stack_key: v}) for v in values]


def run_part(result: Mapping[str, Any], run: Run) -> dict[str, Any] | None:
    """The part of a trial's result that is `run`'s: what all its runs share, with the run's own entry of
    `record.RUNS` over it. None when the result has runs but not this one (a stacked seed that has stopped
    reports no more epochs); a result without runs (a trial's error) is every run's."""
    shared = {k: v for k, v in result.items() if k != R.RUNS}
    if run.member is None or R.RUNS not in result:
        return shared
    own = result[R.RUNS].get(run.member)
    return None if own is None else {**shared, **own}


@dataclass
class LiveSweep:
    """What the driver knows of the sweep it is running: MLflow forwarding, progress lines, how trials ended.

    Lives in the driver only. Tune pickles its callbacks with the experiment, so `TrialEvents` holds nothing and
    finds the sweep of this process in `_LIVE`: a resumed sweep gets this driver's options, not the first one's.
    """

    recorder: SweepRecorder
    static_params: Mapping[str, Any]
    run_name: Callable[[dict], str]
    shown: Mapping[str, Callable[[float], str]] = field(default_factory=dict)  # `StudySweep.shown`
    varying: Sequence[str] = ()  # the searched keys, which name a trial in the progress lines
    labels: Mapping[str, str] = field(default_factory=dict)  # their short names
    metric: str | None = None  # the optimised metric and mode, and where a stopped trial's best goes
    mode: str | None = None
    best_metric: str | None = None
    progress: bool = True
    resolved_keys: Sequence[str] = ()  # `StudySweep.resolved_keys`
    stack_key: str | None = None  # the search space's stacked key: its trials carry one run per value
    every_s: float = 30.0
    # `StudySweep.planned_epochs` and `.may_end_early`: a trial's epoch budget from its config (None: the study's
    # trials report no epochs), and whether it may end sooner
    planned_epochs: Callable[[Mapping[str, Any]], int] | None = None
    may_end_early: Callable[[Mapping[str, Any]], bool] = lambda config: False
    clock: Callable[[], float] = time.time  # what now is (a test holds its own)
    # A trial's end is said this long after it, or as the next trial starts: Tune starts the trial that takes its
    # place just after, and a line printed at once counted one running trial fewer than there are.
    settle_s: float = 1.0
    total: int = 0
    started_at: float = math.nan  # (nan: the clock's now, when made)
    said_at: float = math.nan
    ran: set[str] = field(default_factory=set)  # trials that ran in this driver
    ended_before: set[str] | None = None  # trials already ended when this driver began (a resumed sweep)
    nodes: dict[str, str] = field(default_factory=dict)  # run key -> the node its last result came from
    concluded: dict[str, str] = field(default_factory=dict)  # trial id -> final status, as Tune concluded them
    finished_here: int = 0  # trials that ended in this driver (the rate behind the time-left estimate)
    epochs: dict[str, int] = field(default_factory=dict)  # trial id -> its last epoch (a resumed one's restored)
    epochs_here: int = 0  # epoch reports this driver received, all trials together (the rate of a study with epochs)
    first_start: float | None = None  # when this driver saw its first trial start
    unsaid: list[tuple[float, str]] = field(default_factory=list)  # (when, what) of trial ends not yet printed
    trials: list[dict[str, Any]] = field(default_factory=list)  # the end state: one dict per trial
    interrupted: bool = False

    def __post_init__(self) -> None:
        now = self.clock()
        self.started_at = now if math.isnan(self.started_at) else self.started_at
        self.said_at = now if math.isnan(self.said_at) else self.said_at

    # --- Tune events (driver thread; MLflow writes go to the recorder's writer thread) ---------------------------
    def start(self, trial: Trial, trials: list[Trial] | None = None) -> None:
        """A trial starts (Tune's event, with `trials`), or an event of a trial this driver had not seen start."""
        self.recorder.check_open()  # a store that cannot be used ends the sweep at the first event after it failed
        self.ran.add(trial.trial_id)
        if self.first_start is None:
            self.first_start = self.clock()
        for run in self.runs(trial):
            self.recorder.later(self.recorder.trial_run, run.key, self.params(run), self.run_name(run.config),
                                {R.TAG_STACKED: trial.trial_id} if run.member is not None else {})
        if trial.checkpoint is not None:  # resumed: epochs a lost write or a killed driver left out of MLflow
            self.recorder.later(self._backfill, trial)  # reads Ray's stored results: off the driver thread
            last = (trial.last_result or {}).get(R.EPOCH)
            if last is not None:  # the epochs it has done count in its progress, not in this driver's rate
                self.epochs.setdefault(trial.trial_id, int(last))
        if trials is not None:
            self._say_ended(trials)  # the trial taking an ended one's place is counted running

    def runs(self, trial: Trial) -> list[Run]:
        return runs_of(trial.trial_id, trial.config, self.stack_key)

    def params(self, run: Run) -> dict[str, Any]:
        """The params a run gets when it starts: the study's and the run's config, but for the keys the trial
        resolves itself (those come with its report, `record.TRIAL_INFO`)."""
        return {k: v for k, v in {**self.static_params, **run.config}.items() if k not in self.resolved_keys}

    def _backfill(self, trial: Trial) -> None:
        for result in _stored_epochs(trial):
            for run in self.runs(trial):
                part = run_part(result, run)
                if part is None:
                    continue
                if part.get(R.TRIAL_INFO):
                    self.recorder.log_trial_info(run.key, part[R.TRIAL_INFO])
                self.recorder.log_epoch(run.key, int(part[R.EPOCH]), record_only(part, run.config))

    def result(self, trial: Trial, result: Mapping[str, Any]) -> None:
        self.recorder.check_open()
        if trial.trial_id not in self.ran:
            self.start(trial)
        epoch = R.STATUS not in result and R.EPOCH in result
        if epoch:
            self.epochs[trial.trial_id] = int(result[R.EPOCH])
            self.epochs_here += 1
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

    def complete(self, trial: Trial, trials: list[Trial]) -> None:
        if trial.trial_id not in self.ran:
            self.start(trial)
        finals = []
        for run in self.runs(trial):
            final = _final(trial, run)
            if R.STATUS not in final:  # stopped by the scheduler before its final report
                final.update({R.STATUS: R.STATUS_STOPPED, R.EPOCHS_RUN: (trial.last_result or {}).get(R.EPOCH, 0)})
            checkpoint = trial.checkpoint if final[R.STATUS] == R.STATUS_OK else None
            self.recorder.later(self._finish, run, final, checkpoint)
            finals.append(final)
        self._concluded(trial, finals, trials)

    def _finish(self, run: Run, final: dict[str, Any], checkpoint: Any) -> None:
        """A run's end; with a checkpoint (an ok run), its files: the trial's final checkpoint, or for a run of a
        stacked trial the folder named by its value in it."""
        if checkpoint is None:
            self.recorder.finish_trial(run.key, final)
            return
        with checkpoint.as_directory() as local_dir:
            folder = local_dir if run.member is None else os.path.join(local_dir, run.member)
            self.recorder.finish_trial(run.key, final, artifact_dir=folder)

    def error(self, trial: Trial, trials: list[Trial]) -> None:
        """A trial Ray failed for good: its process or node was lost more than --max-failures times."""
        if trial.trial_id not in self.ran:
            self.start(trial)
        finals = []
        for run in self.runs(trial):
            final = {**_final(trial, run), R.STATUS: R.STATUS_ERROR, R.ERROR: error_summary(_error_text(trial))}
            self.recorder.later(self.recorder.finish_trial, run.key, final)
            finals.append(final)
        self._concluded(trial, finals, trials)

    def _concluded(self, trial: Trial, finals: Sequence[Mapping[str, Any]], trials: list[Trial]) -> None:
        """A trial's end, as its runs ended: it failed if any run did (the first failure names it)."""
        failed = [f for f in finals if f[R.STATUS] not in R.SUCCESS_STATUSES]
        self.concluded[trial.trial_id] = str((failed or finals)[0][R.STATUS])
        self.finished_here += 1
        if self.progress:  # said as the next trial starts, or `settle_s` later (`step`)
            self.unsaid.append((self.clock(), f"{self.trial_name(trial)}: {self.outcomes(finals)}"))

    def trial_name(self, trial: Trial) -> str:
        """The trial by what varies in the search, e.g. `lr 6.3e-3 batch 16` or `rope gate_scalar seed 0` (a
        searched text value reads alone; a stacked trial's seeds `seed 0,1,2`); the run name where nothing
        varies."""
        def shown(value: Any) -> str:  # a stacked key's values: `seed 0,1,2`
            return ",".join(map(_short, value)) if isinstance(value, list) else _short(value)

        parts = [shown(trial.config[k]) if isinstance(trial.config[k], str)
                 else f"{self.labels.get(k, k)} {shown(trial.config[k])}" for k in self.varying if k in trial.config]
        return " ".join(parts) or self.run_name(trial.config) or trial.trial_id

    def outcomes(self, finals: Sequence[Mapping[str, Any]]) -> str:
        """How a trial's runs ended: one run's `outcome`; a stacked trial's, each run's in turn, e.g.
        `ok, test 61.2 % | ok, test 58.4 % | diverged: ...`."""
        return " | ".join(self.outcome(final) for final in finals)

    def outcome(self, final: Mapping[str, Any]) -> str:
        """How a trial ended, e.g. `stopped at epoch 3, val 61.2 %`, `ok, test 63.1 %`, `error: ValueError: ...`."""
        status = str(final[R.STATUS])
        text = status
        if status == R.STATUS_STOPPED and final.get(R.EPOCHS_RUN) is not None:
            text += f" at epoch {final[R.EPOCHS_RUN]}"
        if final.get(R.ERROR):
            return f"{text}: {str(final[R.ERROR])[:120]}"
        for key, show in self.shown.items():
            value = final.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                return f"{text}, {show(value)}"
        return text

    def first_step(self, trials: list[Trial]) -> None:
        if self.ended_before is None:
            self.ended_before = {t.trial_id for t in trials if t.status in (Trial.TERMINATED, Trial.ERROR)}

    def step(self, trials: list[Trial]) -> None:
        if not self.progress:
            return
        if self.unsaid and self.clock() - self.unsaid[0][0] >= self.settle_s:
            self._say_ended(trials)
        elif self.clock() - self.said_at >= self.every_s:
            self.say(trials)

    def _say_ended(self, trials: list[Trial]) -> None:
        """The line of each trial end not said yet."""
        unsaid, self.unsaid = self.unsaid, []
        for _, ended in unsaid:
            self.say(trials, ended)

    def say(self, trials: list[Trial], ended: str = "") -> None:
        """One progress line: done (failed) / running (their epochs done of planned) / pending of n, elapsed, time
        left, the trial that ended."""
        self.said_at = self.clock()
        n = max(self.total, len(trials))
        # Tune calls back before it marks the trial ended: count ends from what this driver saw
        over = set(self.concluded) | (self.ended_before or set())
        done = len(over)
        # Started in this driver and not over: Tune calls `on_trial_start` before it marks the trial RUNNING
        running = [t for t in trials if t.trial_id in self.ran and t.trial_id not in over
                   and t.status in (Trial.RUNNING, Trial.PENDING)]
        failed = sum(s not in R.SUCCESS_STATUSES for s in self.concluded.values())
        elapsed = self.said_at - self.started_at
        epochs = ""
        if self.planned_epochs is not None and running:
            epochs = (f" ({sum(self.epochs.get(t.trial_id, 0) for t in running)}/"
                      f"{sum(self.planned_epochs(t.config) for t in running)} epochs)")
        print(f"[{time.strftime('%H:%M:%S', time.localtime(self.said_at))}] {done}/{n} done ({failed} failed), "
              f"{len(running)} running{epochs}, {n - done - len(running)} pending; {_duration(elapsed)} elapsed, "
              f"{self.time_left(trials, n, over, running)}" + (f"; {ended}" if ended else ""), flush=True)

    def time_left(self, trials: Sequence[Trial], n: int, over: set[str], running: Sequence[Trial]) -> str:
        """The work left at the rate this driver has done work since its first trial started: in epochs when the
        study plans them (`_epochs_left`), else in trials."""
        if n <= len(over):
            return "0s left"
        if self.planned_epochs is not None:
            return self._epochs_left(trials, n, over)
        # Trials, counting the epochs the running ones have done (a fraction of a trial each: their epochs over
        # the mean of the trials that ended here). Counting ended trials alone overestimated it by about the
        # concurrency.
        ended = [self.epochs[t] for t in self.concluded if t in self.epochs]
        per_trial = sum(ended) / len(ended) if ended else 0.0
        partial = sum(min(self.epochs.get(t.trial_id, 0) / per_trial, 0.9) for t in running) if per_trial else 0.0
        work = self.finished_here + partial
        if not work or self.first_start is None:
            return "time left known after the first trial"
        rate = work / max(self.said_at - self.first_start, 1e-9)  # trials per second
        return f"~{_duration((n - len(over) - partial) / rate)} left"

    def _epochs_left(self, trials: Sequence[Trial], n: int, over: set[str]) -> str:
        """The epochs left over the epochs per second this driver's trials have trained, all together.

        A trial's length is its planned epochs until trials have ended here, then the mean of what those ran (a
        trial that failed says nothing of the others), never more than its plan and at least one epoch past what
        it has done. While it is the plan and a trial may end sooner (early stopping, a scheduler), the estimate
        is an upper bound and says so. Trials a search has not made yet are as long as the longest known one.
        """
        if not self.epochs_here or self.first_start is None:
            return "time left known after the first epoch"
        rate = self.epochs_here / max(self.said_at - self.first_start, 1e-9)
        ran = [self.epochs[t] for t, status in self.concluded.items()
               if status in R.SUCCESS_STATUSES and t in self.epochs]
        typical = sum(ran) / len(ran) if ran else math.inf
        lengths = {t.trial_id: min(typical, self.planned_epochs(t.config)) for t in trials}
        left = sum(max(lengths[t.trial_id] - self.epochs.get(t.trial_id, 0), 1) for t in trials
                   if t.trial_id not in over)
        left += max(n - len(trials), 0) * max(lengths.values(), default=0)
        text = f"~{_duration(left / rate)} left"
        if not ran and any(self.may_end_early(t.config) for t in trials):
            text += " at most (trials may stop early)"
        return text

    def end(self, trials: list[Trial]) -> None:
        """Tune's last event: record how every trial ended; an interruption leaves some unfinished.

        A trial Tune had already concluded when a previous driver was killed (before, or while, its end was
        written to MLflow) is never reported again on resume: its run is finished here from Tune's saved state,
        with the epochs Ray stored. Any other trial that did not conclude in this driver was cut by Ctrl-C or
        SIGTERM: Tune marks a running one TERMINATED as it stops its actor (having saved it as running, so
        --resume continues it); it is 'interrupted', never 'stopped', and one never started is 'pending'.
        """
        self.first_step(trials)  # interrupted before Tune's first step: nothing has changed since the restore
        self._say_ended(trials)
        snapshot = []
        for trial in trials:
            status = self.concluded.get(trial.trial_id)
            if status is None and trial.trial_id in self.ended_before:
                self.recorder.later(self._reconcile, trial)
                status = str((trial.last_result or {}).get(R.STATUS, R.STATUS_STOPPED)) \
                    if trial.status == Trial.TERMINATED else R.STATUS_ERROR
            elif status is None:
                # (Tune marks TERMINATED every trial it had asked an actor for, even one still waiting for resources)
                started = trial.trial_id in self.ran or trial.checkpoint is not None
                status = R.STATUS_INTERRUPTED if started else R.STATUS_PENDING
                self.interrupted = True
                if trial.trial_id in self.ran:
                    for run in self.runs(trial):
                        self.recorder.later(self.recorder.interrupt_trial, run.key)
            snapshot.append({"trial_id": trial.trial_id, "runs": self.runs(trial), "status": status,
                             "last_result": dict(trial.last_result or {}), "error": _error_text(trial)
                             if trial.status == Trial.ERROR else "", "best": self._best(trial)})
        self.trials = snapshot

    def _best(self, trial: Trial) -> dict[str, Any]:
        """A trial's best value of the optimised metric over its results, under the study's name for it."""
        if not (self.metric and self.mode and self.best_metric):
            return {}
        return {self.metric: (trial.last_result or {}).get(self.metric),
                self.best_metric: trial.metric_analysis.get(self.metric, {}).get(self.mode)}

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
                final = _final(trial, run)
                final.setdefault(R.STATUS, R.STATUS_STOPPED)
                self._finish(run, final, trial.checkpoint if final[R.STATUS] == R.STATUS_OK else None)
            else:
                self.recorder.finish_trial(run.key, {**_final(trial, run), R.STATUS: R.STATUS_ERROR,
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
        _LIVE.start(trial, trials)

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


def _final(trial: Trial, run: Run) -> dict[str, Any]:
    """`run`'s part of the trial's last result, as the metrics of its run."""
    return record_only(run_part(trial.last_result or {}, run) or {}, run.config)


def _short(value: Any) -> str:
    """A searched value as a person reads it: 6.3e-3, 0.25, 16, rope."""
    if isinstance(value, float) and value != 0 and not 1e-2 <= abs(value) < 1e4:
        mantissa, exponent = f"{value:.1e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


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
    """One flat row per run of `LiveSweep.trials` (a trial is one run, a stacked trial one per stacked value): its
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


def record_only(result: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """A reported result without Ray's bookkeeping or the config (those are params, not metrics)."""
    skip = set(AUTO_RESULT_KEYS) | RAY_EXTRA_KEYS | set(config) | {R.EPOCH, R.TRIAL_INFO, R.RUNS}
    return {k: v for k, v in result.items() if k not in skip}
