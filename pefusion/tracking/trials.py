"""What a Tune trial is in the records: the runs it carries (one, or one per value of a stacked key), each run's
part of its results without Ray's bookkeeping, how it ended, and the epochs Ray stored for it.

Shared by the callbacks that record a sweep (`pefusion.tracking.callbacks`) and the engine's view of how its trials
ended (`pefusion.sweep.outcomes`). A result with an epoch and no status is an epoch: every number in it is a series
of that name, listed nowhere.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ray.tune.result import AUTO_RESULT_KEYS, EXPR_RESULT_FILE

from pefusion import record as R

# Keys Ray adds to every result besides AUTO_RESULT_KEYS.
RAY_EXTRA_KEYS = {"trial_id", "done", "should_checkpoint", "experiment_tag", "checkpoint_dir_name"}


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


def record_only(result: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """A reported result without Ray's bookkeeping or the config (those are params, not metrics)."""
    skip = set(AUTO_RESULT_KEYS) | RAY_EXTRA_KEYS | set(config) | {R.EPOCH, R.TRIAL_INFO, R.RUNS}
    return {k: v for k, v in result.items() if k not in skip}


def final_record(trial, run: Run) -> dict[str, Any]:
    """`run`'s part of the trial's last result, as the metrics of its run."""
    return record_only(run_part(trial.last_result or {}, run) or {}, run.config)


def finals(trial, runs: Sequence[Run], *, failed: bool = False) -> list[dict[str, Any]]:
    """The final record of each run of a trial Tune concluded: its last result's, with status 'stopped' where a
    scheduler stopped it before its final report; `failed` (Ray gave up on its process): 'error' and the reason."""
    out = []
    for run in runs:
        final = final_record(trial, run)
        if failed:
            final.update({R.STATUS: R.STATUS_ERROR, R.ERROR: error_summary(error_text(trial))})
        elif R.STATUS not in final:
            final.update({R.STATUS: R.STATUS_STOPPED, R.EPOCHS_RUN: (trial.last_result or {}).get(R.EPOCH, 0)})
        out.append(final)
    return out


def trial_status(trial_finals: Sequence[Mapping[str, Any]]) -> str:
    """A trial's end, as its runs ended: it failed if any run did (the first failure names it)."""
    failed = [f for f in trial_finals if f[R.STATUS] not in R.SUCCESS_STATUSES]
    return str((failed or trial_finals)[0][R.STATUS])


def stored_epochs(trial) -> list[dict[str, Any]]:
    """The per-epoch results Ray stored for `trial` (its result.json, on any storage), oldest first."""
    try:
        fs, path = trial.storage.storage_filesystem, f"{trial.storage.trial_fs_path}/{EXPR_RESULT_FILE}"
        with fs.open_input_stream(path) as f:
            lines = f.read().decode().splitlines()
    except (OSError, AttributeError):
        return []
    results = [json.loads(ln) for ln in lines if ln.strip()]
    return [r for r in results if R.STATUS not in r and R.EPOCH in r]


def error_text(trial) -> str:
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
