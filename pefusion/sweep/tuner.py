"""Ray Tune plumbing: the shared sweep options, the cluster, the Tuner (new or restored), MLflow forwarding, result rows.

`pefusion.sweep.driver.run_sweep` is the only caller of `run_tune`; it states *what* to search (a param space, a
trainable, a scheduler) and this module does it the same way for every sweep. Current Ray API only: `ray.tune.report`, `ray.tune.get_checkpoint`, `tune.Tuner`,
`tune.TuneConfig`, `tune.RunConfig`, `tune.with_resources`, `tune.with_parameters`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import ray
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.result import AUTO_RESULT_KEYS

from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.sweep.tracking import SweepRecorder, check_tracking, resolve_tracking_uri

# Persist Tune's experiment state at least every second, so a driver killed with SIGKILL loses (almost) no
# finished trial; the state file is tiny next to an epoch of training.
os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
# Checkpointing every epoch with num_to_keep=1 forces those snapshots on purpose; don't warn about it.
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
# Keep Ray's own console table quiet; the sweeps print their own summary.
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

DEFAULT_STORAGE = "ray_results"
# Keys Ray adds to every result besides AUTO_RESULT_KEYS.
RAY_EXTRA_KEYS = {"trial_id", "done", "should_checkpoint", "experiment_tag", "checkpoint_dir_name"}


@dataclass
class SweepOptions:
    """The flags every sweep script shares (see `pefusion.cli.flags.add_sweep_flags`)."""

    sweep: str  # arxiv_grid | lr_batch_asha | lambda_cv | phase_diagram
    experiment: str
    name: str | None = None
    storage_path: str = DEFAULT_STORAGE
    address: str | None = None  # None: a new local cluster; "auto": a running `ray start --head`
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    num_cpus: int | None = None  # CPUs a *local* cluster declares (default: all)
    num_gpus: float | None = None  # GPUs a *local* cluster declares; logical ones schedule on a CPU machine
    max_concurrent: int = 0  # 0: as many as resources allow
    resume: bool = False
    tracking_uri: str | None = None
    dashboard: bool = True
    verbose: int = 1
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cpus_per_trial <= 0:
            raise ConfigError(f"--cpus-per-trial={self.cpus_per_trial} must be > 0")
        if self.gpus_per_trial < 0 or (self.gpus_per_trial > 1 and self.gpus_per_trial != int(self.gpus_per_trial)):
            raise ConfigError(f"--gpus-per-trial={self.gpus_per_trial} must be a fraction in [0, 1] or a whole number")
        if self.max_concurrent < 0:
            raise ConfigError(f"--max-concurrent={self.max_concurrent} must be >= 0")

    @property
    def is_remote_storage(self) -> bool:
        return "://" in self.storage_path

    def storage_root(self) -> str:
        return self.storage_path if self.is_remote_storage else str(Path(self.storage_path).resolve())

    def experiment_name(self, preset: str) -> str:
        """--name, else on --resume the newest local experiment of this sweep and preset, else a fresh name."""
        if self.name:
            return self.name
        prefix = f"{self.sweep}-{preset}-"
        if self.resume:
            if self.is_remote_storage:
                raise ConfigError("--resume with remote storage needs --name (the experiment to resume)")
            root = Path(self.storage_root())
            found = sorted((p for p in root.glob(prefix + "*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
            if not found:
                raise ConfigError(f"--resume: no experiment {prefix}* in {root}; pass --name of the one to resume")
            return found[-1].name
        return prefix + time.strftime("%Y%m%d-%H%M%S")


def start_ray(opts: SweepOptions) -> str:
    """Join `--address` or start a local cluster with the dashboard on 127.0.0.1; returns the dashboard URL."""
    if ray.is_initialized():
        return ""
    kwargs: dict[str, Any] = {"log_to_driver": opts.verbose > 1, "configure_logging": True,
                              "logging_level": "WARNING"}
    if opts.address:
        try:
            ctx = ray.init(address=opts.address, **kwargs)
        except (ConnectionError, RuntimeError) as exc:
            raise ConfigError(f"cannot join the Ray cluster at --address {opts.address}: "
                              f"{str(exc).splitlines()[0]} (start one with `ray start --head`)") from None
    else:
        ctx = ray.init(num_cpus=opts.num_cpus, num_gpus=opts.num_gpus, include_dashboard=opts.dashboard,
                       dashboard_host="127.0.0.1", **kwargs)
    url = ctx.dashboard_url or ""
    if url and not url.startswith("http"):
        url = "http://" + url
    return url


class MlflowTrialCallback(tune.Callback):
    """Forwards Tune trial events to a `SweepRecorder` (runs in the driver; pickled with the experiment)."""

    def __init__(self, recorder: SweepRecorder, static_params: Mapping[str, Any],
                 run_name: Callable[[dict], str]) -> None:
        self.recorder, self.static_params, self.run_name = recorder, dict(static_params), run_name

    def _run(self, trial) -> str:
        return self.recorder.trial_run(trial.trial_id, {**self.static_params, **trial.config},
                                       self.run_name(trial.config))

    def on_trial_start(self, iteration, trials, trial, **info):
        self._run(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._run(trial)
        if R.STATUS not in result and R.EPOCH in result:
            self.recorder.log_epoch(trial.trial_id, int(result[R.EPOCH]),
                                    {k: result[k] for k in R.EPOCH_METRICS if k in result})

    def _final(self, trial) -> dict[str, Any]:
        return {k: v for k, v in record_only(trial.last_result or {}, trial.config).items()
                if k not in ("started_at", "ended_at")}

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._run(trial)
        result = self._final(trial)
        if R.STATUS not in result:  # stopped by the scheduler before its final report
            result.update({R.STATUS: R.STATUS_STOPPED, R.EPOCHS_RUN: (trial.last_result or {}).get(R.EPOCH, 0)})
        checkpoint = trial.checkpoint if result[R.STATUS] == R.STATUS_OK else None
        if checkpoint is not None:
            with checkpoint.as_directory() as local_dir:
                self.recorder.finish_trial(trial.trial_id, result, artifact_dir=local_dir)
        else:
            self.recorder.finish_trial(trial.trial_id, result)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._run(trial)
        self.recorder.finish_trial(trial.trial_id, {**self._final(trial), R.STATUS: R.STATUS_ERROR,
                                                    R.ERROR: error_summary(_error_text(trial))})

    def on_experiment_end(self, trials, **info):
        # A trial Tune had already concluded when a previous driver was killed, before (or while) this callback
        # wrote its end to MLflow, is never reported again on resume: finish its run from Tune's saved state.
        unfinished = self.recorder.unfinished_trials()
        for trial in trials:
            if trial.trial_id not in unfinished:
                continue
            if trial.status == Trial.TERMINATED:
                self.on_trial_complete(0, trials, trial)
            elif trial.status == Trial.ERROR:
                self.on_trial_error(0, trials, trial)


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


def run_tune(trainable: Callable, param_space: Mapping[str, Any], opts: SweepOptions, *, preset: str,
             resources: Mapping[str, float] | None = None, static_params: Mapping[str, Any] | None = None,
             run_name: Callable[[dict], str] = lambda cfg: "", metric: str | None = None, mode: str | None = None,
             scheduler: Any = None, search_alg: Any = None, num_samples: int = 1,
             recorder: SweepRecorder | None = None):
    """Run (or resume) one sweep and return `(ResultGrid, SweepRecorder, experiment path, dashboard URL)`.

    `metric`/`mode` are given here once and reach the scheduler and the search algorithm through TuneConfig.
    Must be called after every user input has been validated: from here on, problems are Ray's.
    """
    uri = resolve_tracking_uri(opts.tracking_uri)
    check_tracking(uri)
    name = opts.experiment_name(preset)
    exp_path = f"{opts.storage_root().rstrip('/')}/{name}"
    if opts.resume and not opts.is_remote_storage and not Path(exp_path).is_dir():
        raise ConfigError(f"--resume: no experiment at {exp_path}")
    if not opts.resume and not opts.is_remote_storage and Path(exp_path).exists():
        raise ConfigError(f"experiment {exp_path} exists: pass --resume to continue it, or another --name")
    recorder = recorder or SweepRecorder(uri, opts.experiment, opts.sweep, exp_path)
    dashboard = start_ray(opts)
    recorder.tag_parent({R.TAG_RAY_ADDRESS: opts.address or "local", **opts.tags})
    if dashboard and opts.verbose:
        print(f"Ray dashboard: {dashboard}  (token: `ray get-auth-token`)", flush=True)
    print(f"MLflow: {uri}  experiment '{opts.experiment}', parent run {recorder.parent_run_id}", flush=True)

    res = dict(resources or {"cpu": opts.cpus_per_trial, "gpu": opts.gpus_per_trial})
    wrapped = tune.with_resources(trainable, res)
    if opts.resume:
        tuner = tune.Tuner.restore(exp_path, wrapped, resume_unfinished=True, resume_errored=False,
                                   param_space=dict(param_space))
    else:
        tuner = tune.Tuner(
            wrapped, param_space=dict(param_space),
            tune_config=tune.TuneConfig(metric=metric, mode=mode, scheduler=scheduler, search_alg=search_alg,
                                        num_samples=num_samples, max_concurrent_trials=opts.max_concurrent or None,
                                        reuse_actors=True),  # a fresh process costs ~5 s of imports
            run_config=tune.RunConfig(
                name=name, storage_path=opts.storage_root(), verbose=0 if opts.verbose < 2 else 1,
                callbacks=[MlflowTrialCallback(recorder, static_params or {}, run_name)],
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
            ),
        )
    return tuner.fit(), recorder, exp_path, dashboard


def result_rows(results) -> list[dict[str, Any]]:
    """One flat row per trial: its config and final record; failed ones included with their reason (never
    silently dropped); trials a scheduler stopped early with their best epoch."""
    rows = []
    for res in results:
        config, metrics = dict(res.config or {}), dict(res.metrics or {})
        row: dict[str, Any] = {"trial_id": metrics.get("trial_id", ""), **config}
        if res.error is not None:
            row.update({R.STATUS: R.STATUS_ERROR, R.ERROR: error_summary(res.error)})
        elif R.STATUS in metrics:
            row.update(record_only(metrics, config))
        else:
            history = res.metrics_dataframe  # stopped by the scheduler: its best epoch so far counts
            best = history[R.VAL_ACC].max() if history is not None and R.VAL_ACC in history else None
            row.update({R.STATUS: R.STATUS_STOPPED, R.ERROR: "", R.EPOCHS_RUN: metrics.get(R.EPOCH),
                        R.VAL_ACC: metrics.get(R.VAL_ACC), R.BEST_VAL_ACC: best})
        rows.append(row)
    return rows


def record_only(result: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """A reported result without Ray's bookkeeping or the config (those are params, not metrics)."""
    skip = set(AUTO_RESULT_KEYS) | RAY_EXTRA_KEYS | set(config) | {R.EPOCH}
    return {k: v for k, v in result.items() if k not in skip}
