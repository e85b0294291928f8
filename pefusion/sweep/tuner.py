"""Ray Tune plumbing: the shared sweep options, the cluster and its resource check, the Tuner (new or restored),
the driver's view of a running sweep (MLflow forwarding, progress lines, how each trial ended), result rows.

`pefusion.sweep.driver.run_sweep` is the only caller of `run_tune`; it states *what* to search (a param space, a
trainable, a scheduler) and this module does it the same way for every sweep. Current Ray API only:
`ray.tune.report`, `ray.tune.get_checkpoint`, `tune.Tuner`, `tune.TuneConfig`, `tune.RunConfig`,
`tune.FailureConfig`, `tune.with_resources`, `tune.with_parameters`, `tune.Callback`.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import shlex
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import ray
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.result import AUTO_RESULT_KEYS, EXPR_RESULT_FILE

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
    progress: bool = True  # a line as each trial ends and every 30 s (-q: none)
    max_failures: int = 2  # restarts of a trial whose process or node was lost, from its last checkpoint
    autoscaling: bool = False  # the cluster adds nodes: a request no node holds now may wait
    command: str = ""  # the command as typed (its --resume form ends an interrupted sweep's line)
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cpus_per_trial <= 0:
            raise ConfigError(f"--cpus-per-trial={self.cpus_per_trial} must be > 0")
        if self.gpus_per_trial < 0 or (self.gpus_per_trial > 1 and self.gpus_per_trial != int(self.gpus_per_trial)):
            raise ConfigError(f"--gpus-per-trial={self.gpus_per_trial} must be a fraction in [0, 1] or a whole number")
        if self.max_concurrent < 0:
            raise ConfigError(f"--max-concurrent={self.max_concurrent} must be >= 0")
        if self.max_failures < 0:
            raise ConfigError(f"--max-failures={self.max_failures} must be >= 0")

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

    def resume_command(self, name: str) -> str:
        """The command as typed, naming the experiment and asking to resume it."""
        parts = shlex.split(self.command)
        extra = ([] if "--name" in parts or any(p.startswith("--name=") for p in parts) else ["--name", name]) + \
            ([] if "--resume" in parts else ["--resume"])
        return shlex.join([*parts, *extra])


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


def unfit_request(cpus: float, gpus: float, nodes: list[Mapping[str, float]], *, local: bool) -> str | None:
    """Why no node of `nodes` (their Ray resources) can ever hold one trial's request, or None if one can.

    A pure function of what Ray reports, so the message is testable without a cluster of that shape.
    """
    most_cpus = max((n.get("CPU", 0.0) for n in nodes), default=0.0)
    most_gpus = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    declare = "--num-gpus N" if local else "`ray start --num-gpus N` on a node"
    if gpus > 0 and most_gpus == 0:
        return (f"--gpus-per-trial {gpus:g} but the cluster has no GPU; declare logical GPUs with {declare} "
                f"or leave the flag out")
    if gpus > most_gpus:
        return f"--gpus-per-trial {gpus:g} but the largest node has {most_gpus:g} GPUs; lower --gpus-per-trial"
    if cpus > most_cpus:
        more = "--num-cpus N" if local else "a node with more CPUs"
        return (f"--cpus-per-trial {cpus:g} but the largest node has {most_cpus:g} CPUs; lower --cpus-per-trial "
                f"or declare more with {more}")
    if not any(n.get("CPU", 0.0) >= cpus and n.get("GPU", 0.0) >= gpus for n in nodes):
        return (f"--cpus-per-trial {cpus:g} with --gpus-per-trial {gpus:g}: no node has both (nodes: "
                + ", ".join(f"{n.get('CPU', 0):g} CPU/{n.get('GPU', 0):g} GPU" for n in nodes) + ")")
    return None


def check_resources(opts: SweepOptions, *, started_here: bool) -> None:
    """Refuse, before any trial starts, a per-trial request that no node of the cluster can ever hold (Ray would
    wait for it forever); with `--autoscaling` the wait is the cluster's to end."""
    if opts.autoscaling:
        return
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    why = unfit_request(opts.cpus_per_trial, opts.gpus_per_trial, nodes, local=not opts.address)
    if why:
        if started_here:
            ray.shutdown()  # only what this command started
        raise ConfigError(why + ("" if not opts.address else " (pass --autoscaling if the cluster adds nodes)"))


def catching_errors(trainable: Callable[..., None]) -> Callable[..., None]:
    """The trainable with its own exceptions recorded as the trial's result (status 'error', the error's line).

    Why: an exception of the trial's code is a bug that a retry would only repeat, so it is reported once and
    the trial ends; Ray's retries (`--max-failures`) are left for processes and nodes that were lost. Ray's own
    errors pass through, and so does the SystemExit with which Ray ends a trial it stops.
    """
    @functools.wraps(trainable)
    def run(config: dict[str, Any], **shipped: Any) -> None:
        try:
            trainable(config, **shipped)
        except ray.exceptions.RayError:
            raise
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()  # the whole traceback in the trial's log; the record keeps its last line
            tune.report({R.STATUS: R.STATUS_ERROR, R.ERROR: error_summary(f"{type(exc).__name__}: {exc}")})
    return run


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
        if trial.trial_id not in self.recorder.unfinished_trials():
            return
        self.recorder.trial_run(trial.trial_id, {**self.static_params, **trial.config}, self.run_name(trial.config))
        self._backfill(trial.trial_id, _stored_epochs(trial))
        if trial.status == Trial.TERMINATED:
            final = _final(trial)
            final.setdefault(R.STATUS, R.STATUS_STOPPED)
            self._finish(trial.trial_id, final, trial.checkpoint if final[R.STATUS] == R.STATUS_OK else None)
        else:
            self.recorder.finish_trial(trial.trial_id, {**_final(trial), R.STATUS: R.STATUS_ERROR,
                                                        R.ERROR: error_summary(_error_text(trial))})


_LIVE: LiveSweep | None = None  # the sweep this driver process runs (set by run_tune)


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


def run_tune(trainable: Callable, param_space: Mapping[str, Any], opts: SweepOptions, *, preset: str,
             static_params: Mapping[str, Any] | None = None, run_name: Callable[[dict], str] = lambda cfg: "",
             progress_metric: str | None = None, metric: str | None = None, mode: str | None = None,
             scheduler: Any = None, search_alg: Any = None, num_samples: int = 1) -> tuple[LiveSweep, str]:
    """Run (or resume) one sweep and return `(LiveSweep, experiment path)`: how every trial ended, the recorder
    (its writes flushed), whether it was interrupted.

    `metric`/`mode` are given here once and reach the scheduler and the search algorithm through TuneConfig.
    Must be called after every user input has been validated: from here on, problems are Ray's (the resource
    check below needs the cluster's nodes, and ends in one line like a bad flag).
    """
    global _LIVE
    uri = resolve_tracking_uri(opts.tracking_uri)
    check_tracking(uri)
    name = opts.experiment_name(preset)
    exp_path = f"{opts.storage_root().rstrip('/')}/{name}"
    if opts.resume and not opts.is_remote_storage and not Path(exp_path).is_dir():
        raise ConfigError(f"--resume: no experiment at {exp_path}")
    if not opts.resume and not opts.is_remote_storage and Path(exp_path).exists():
        raise ConfigError(f"experiment {exp_path} exists: pass --resume to continue it, or another --name")
    started_here = not ray.is_initialized()
    dashboard = start_ray(opts)
    check_resources(opts, started_here=started_here)
    recorder = SweepRecorder(uri, opts.experiment, opts.sweep, exp_path)
    recorder.tag_parent({R.TAG_RAY_ADDRESS: opts.address or "local", R.TAG_COMMAND: opts.command, **opts.tags})
    if dashboard and opts.verbose:
        print(f"Ray dashboard: {dashboard}  (token: `ray get-auth-token`)", flush=True)
    print(f"MLflow: {uri}  experiment '{opts.experiment}', parent run {recorder.parent_run_id}", flush=True)

    _LIVE = LiveSweep(recorder, dict(static_params or {}), run_name, progress_metric, progress=opts.progress)
    wrapped = tune.with_resources(trainable, {"cpu": opts.cpus_per_trial, "gpu": opts.gpus_per_trial})
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
                callbacks=[TrialEvents()],
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                failure_config=tune.FailureConfig(max_failures=opts.max_failures, fail_fast=False),
            ),
        )
    if opts.verbose < 2:  # Tune's own interruption warnings name Tuner.restore; the driver prints the command
        for name in ("ray.tune.tune", "ray.tune.analysis.experiment_analysis"):
            logging.getLogger(name).setLevel(logging.ERROR)
    with _sigterm_as_ctrl_c():
        tuner.fit()
    recorder.flush()
    return _LIVE, exp_path


class _sigterm_as_ctrl_c:
    """SIGTERM (a scheduler's or `kill`'s stop) does what Ctrl-C does: whatever SIGINT's handler is when it
    arrives (Ray Tune's during `fit`: save the state, stop the trials; Python's afterwards: stop at once)."""

    def __enter__(self) -> None:
        self._main = threading.current_thread() is threading.main_thread()
        if self._main:
            self._old = signal.signal(signal.SIGTERM, self._forward)

    @staticmethod
    def _forward(signum: int, frame: Any) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)

    def __exit__(self, *exc: Any) -> None:
        if self._main:
            signal.signal(signal.SIGTERM, self._old)


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
