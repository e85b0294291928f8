"""The sweep's progress lines, as a Ray Tune callback (`Progress`): one as each trial ends and one every 30 s, with
what is done, running and pending, the time elapsed and an estimate of the time left.

Runs in the driver process only.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ray import tune
from ray.tune.experiment import Trial

from pefusion import record as R
from pefusion.tracking.trials import finals, runs_of, trial_status


@dataclass(eq=False)  # (a callback is itself, whatever it holds)
class Progress(tune.Callback):
    """What the progress lines need to know of the running sweep, from Tune's trial events."""

    run_name: Callable[[dict], str]
    shown: Mapping[str, Callable[[float], str]] = field(default_factory=dict)  # `StudySweep.shown`
    varying: Sequence[str] = ()  # the searched keys, which name a trial in the lines
    labels: Mapping[str, str] = field(default_factory=dict)  # their short names
    progress: bool = True  # False (-q): no lines
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
    concluded: dict[str, str] = field(default_factory=dict)  # trial id -> final status, as Tune concluded them
    finished_here: int = 0  # trials that ended in this driver (the rate behind the time-left estimate)
    epochs: dict[str, int] = field(default_factory=dict)  # trial id -> its last epoch (a resumed one's restored)
    epochs_here: int = 0  # epoch reports this driver received, all trials together (the rate of a study with epochs)
    first_start: float | None = None  # when this driver saw its first trial start
    # A trial's last phase (its final test and latency passes, after its last epoch: `record.PHASE`): the plan's
    # estimate of its seconds (0: none), the phases running (trial id -> when it began) and those measured here, as
    # (began, ended).
    testing_s_planned: float = 0.0
    testing: dict[str, float] = field(default_factory=dict)
    tested: list[tuple[float, float]] = field(default_factory=list)
    last_epoch_at: float | None = None  # when this driver received its latest epoch report
    most_running: int = 0  # the most trials seen running at once: the slots the sweep's work shares
    unsaid: list[tuple[float, str]] = field(default_factory=list)  # (when, what) of trial ends not yet printed

    def __post_init__(self) -> None:
        now = self.clock()
        self.started_at = now if math.isnan(self.started_at) else self.started_at
        self.said_at = now if math.isnan(self.said_at) else self.said_at

    # --- Tune's events ------------------------------------------------------------------------------------
    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info: Any) -> None:
        if total_num_samples:
            self.total = int(total_num_samples)

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.start(trial, trials)

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any) -> None:
        self.result(trial, result)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.complete(trial, trials)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.error(trial, trials)

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        self.first_step(trials)

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        self.step(trials)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.end(trials)

    # --- what each event changes ----------------------------------------------------------------------------
    def start(self, trial: Trial, trials: list[Trial] | None = None) -> None:
        """A trial starts (Tune's event, with `trials`), or an event of a trial this driver had not seen start."""
        self.ran.add(trial.trial_id)
        if self.first_start is None:
            self.first_start = self.clock()
        if trial.checkpoint is not None:  # resumed: the epochs it has done count in its progress, not in the rate
            last = (trial.last_result or {}).get(R.EPOCH)
            if last is not None:
                self.epochs.setdefault(trial.trial_id, int(last))
        if trials is not None:
            self._say_ended(trials)  # the trial taking an ended one's place is counted running

    def result(self, trial: Trial, result: Mapping[str, Any]) -> None:
        if trial.trial_id not in self.ran:
            self.start(trial)
        if R.STATUS not in result and R.EPOCH in result:
            self.epochs[trial.trial_id] = int(result[R.EPOCH])
            self.epochs_here += 1
            self.last_epoch_at = self.clock()
            if result.get(R.PHASE) == R.PHASE_TESTING:
                self.testing[trial.trial_id] = self.last_epoch_at

    def complete(self, trial: Trial, trials: list[Trial]) -> None:
        self._concluded(trial, failed=False)

    def error(self, trial: Trial, trials: list[Trial]) -> None:
        """A trial Ray failed for good: its process or node was lost more than --max-failures times."""
        self._concluded(trial, failed=True)

    def _concluded(self, trial: Trial, *, failed: bool) -> None:
        if trial.trial_id not in self.ran:
            self.start(trial)
        ended = finals(trial, runs_of(trial.trial_id, trial.config, self.stack_key), failed=failed)
        began = self.testing.pop(trial.trial_id, None)
        if began is not None and not failed:
            self.tested.append((began, self.clock()))
        self.concluded[trial.trial_id] = trial_status(ended)
        self.finished_here += 1
        if self.progress:  # said as the next trial starts, or `settle_s` later (`step`)
            self.unsaid.append((self.clock(), f"{self.trial_name(trial)}: {self.outcomes(ended)}"))

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

    def end(self, trials: list[Trial]) -> None:
        """Tune's last event: the ends not said yet."""
        self.first_step(trials)  # interrupted before Tune's first step: nothing has changed since the restore
        self._say_ended(trials)

    # --- the lines ----------------------------------------------------------------------------------------
    def trial_name(self, trial: Trial) -> str:
        """The trial by what varies in the search, e.g. `lr 6.3e-3 batch 16` or `rope gate_scalar seed 0` (a
        searched text value reads alone; a stacked trial's seeds `seed 0,1,2`); the run name where nothing
        varies."""
        def shown(value: Any) -> str:  # a stacked key's values: `seed 0,1,2`
            return ",".join(map(_short, value)) if isinstance(value, list) else _short(value)

        parts = [shown(trial.config[k]) if isinstance(trial.config[k], str)
                 else f"{self.labels.get(k, k)} {shown(trial.config[k])}" for k in self.varying if k in trial.config]
        return " ".join(parts) or self.run_name(trial.config) or trial.trial_id

    def outcomes(self, trial_finals: Sequence[Mapping[str, Any]]) -> str:
        """How a trial's runs ended: one run's `outcome`; a stacked trial's, each run's in turn, e.g.
        `ok, test 61.2 % | ok, test 58.4 % | diverged: ...`."""
        return " | ".join(self.outcome(final) for final in trial_finals)

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
        self.most_running = max(self.most_running, len(running))
        epochs = ""
        if self.planned_epochs is not None and running:
            testing = sum(t.trial_id in self.testing for t in running)
            epochs = (f" ({sum(self.epochs.get(t.trial_id, 0) for t in running)}/"
                      f"{sum(self.planned_epochs(t.config) for t in running)} epochs"
                      + (f", {testing} testing" if testing else "") + ")")
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
        """The work left, in slot-seconds, over the slots the sweep runs at once (the most trials seen running, at
        most the trials left): each trial's epochs left at the seconds an epoch has taken a slot here, plus its
        last phase (the final test and latency passes) at the mean of those measured here, else the plan's
        estimate, less what a trial in it has spent so far. An epoch's slot-seconds are measured up to the latest
        epoch report, less the last phases in that time: a trial testing neither slows the epochs nor adds one.

        A trial's length is its planned epochs until trials have ended here, then the mean of what those ran (a
        trial that failed says nothing of the others), never more than its plan and at least one epoch past what
        it has done unless it is testing. While it is the plan and a trial may end sooner (early stopping, a
        scheduler), the estimate is an upper bound and says so. Trials a search has not made yet are as long as the
        longest known one.
        """
        if not self.epochs_here or self.first_start is None or self.last_epoch_at is None:
            return "time left known after the first epoch"
        now, slots = self.said_at, max(self.most_running, 1)
        in_testing = sum(min(end, self.last_epoch_at) - start for start, end in self.tested
                         if start < self.last_epoch_at)
        in_testing += sum(max(self.last_epoch_at - start, 0.0) for start in self.testing.values())
        epoch_s = max(slots * (self.last_epoch_at - self.first_start) - in_testing, 1e-9) / self.epochs_here
        measured = [end - start for start, end in self.tested]
        testing_s = sum(measured) / len(measured) if measured else self.testing_s_planned
        ran = [self.epochs[t] for t, status in self.concluded.items()
               if status in R.SUCCESS_STATUSES and t in self.epochs]
        typical = sum(ran) / len(ran) if ran else math.inf
        lengths = {t.trial_id: min(typical, self.planned_epochs(t.config)) for t in trials}
        work, left_trials = 0.0, 0
        for t in trials:
            if t.trial_id in over:
                continue
            left_trials += 1
            if t.trial_id in self.testing:  # past its epochs: what is left of its last phase
                work += max(testing_s - (now - self.testing[t.trial_id]), 0.0)
            else:
                work += max(lengths[t.trial_id] - self.epochs.get(t.trial_id, 0), 1) * epoch_s + testing_s
        unmade = max(n - len(trials), 0)
        work += unmade * (max(lengths.values(), default=0) * epoch_s + testing_s)
        text = f"~{_duration(work / max(min(slots, left_trials + unmade), 1))} left"
        if not ran and any(self.may_end_early(t.config) for t in trials):
            text += " at most (trials may stop early)"
        return text


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
