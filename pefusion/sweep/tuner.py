"""Ray Tune plumbing: the shared sweep options, the cluster and its resource check, the trainable's error guard,
the Tuner (new or restored) under a SIGTERM that acts as Ctrl-C. What the driver sees of the running sweep
(MLflow forwarding, progress, how each trial ended) is `pefusion.sweep.live`.

`pefusion.sweep.driver.run_sweep` is the only caller of `run_tune`; the study states *what* to search (a param
space, a trainable, a scheduler: `pefusion.sweep.study.StudySweep`) and this module does it the same way for every
sweep. Current Ray API only:
`ray.tune.report`, `ray.tune.get_checkpoint`, `tune.Tuner`, `tune.TuneConfig`, `tune.RunConfig`,
`tune.FailureConfig`, `tune.with_resources`, `tune.with_parameters`, `tune.Callback`.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import ray
from ray import tune
from ray.tune.logger import JsonLoggerCallback

from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.sweep import live
from pefusion.sweep import console
from pefusion.sweep.gpus import AUTO
from pefusion.sweep.live import LiveSweep, TrialEvents, error_summary
from pefusion.sweep.options import SweepOptions
from pefusion.sweep.space import to_tune
from pefusion.sweep.study import StudySweep, varying_keys
from pefusion.sweep.search import checkpoints_to_keep
from pefusion.sweep.tracking import (SweepRecorder, TrackingError, check_tracking, import_in_background,
                                     resolve_tracking_uri)

# Persist Tune's experiment state at least every second, so a driver killed with SIGKILL loses (almost) no
# finished trial; the state file is tiny next to an epoch of training.
os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
# Checkpointing every epoch with num_to_keep=1 forces those snapshots on purpose; don't warn about it.
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
# Keep Ray's own console table quiet; the sweeps print their own summary.
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

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


def local_node(opts: SweepOptions) -> dict[str, float]:
    """What the local cluster this command would start declares: --num-cpus/--num-gpus, else this machine's."""
    gpus = opts.num_gpus
    if gpus is None:
        import torch  # Ray counts the GPUs CUDA shows; torch asks the same driver without starting a cluster

        gpus = torch.cuda.device_count()
    return {"CPU": float(opts.num_cpus or os.cpu_count() or 1), "GPU": float(gpus)}


def check_local_request(opts: SweepOptions) -> None:
    """The resource check of a local cluster this command is about to start, before the data loads and Ray
    starts (a joined cluster is checked once joined: only then are its nodes known)."""
    if not opts.address and not ray.is_initialized():
        check_resources(opts, [local_node(opts)])


def check_resources(opts: SweepOptions, nodes: list[Mapping[str, float]]) -> None:
    """Refuse, before any trial starts, a per-trial request that no node of `nodes` can ever hold (Ray would
    wait for it forever); with `--autoscaling` the wait is the cluster's to end."""
    if opts.autoscaling:
        return
    why = unfit_request(opts.cpus_per_trial, opts.gpus_per_trial, nodes, local=not opts.address)
    if why:
        raise ConfigError(why + ("" if not opts.address else " (pass --autoscaling if the cluster adds nodes)"))


def catching_errors(trainable: Callable[..., None], metric: str | None = None) -> Callable[..., None]:
    """The trainable with its own exceptions recorded as the trial's result (status 'error', the error's line;
    a search's `metric` as NaN, since Tune refuses a result without the metric it optimises).

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
            record = {R.STATUS: R.STATUS_ERROR, R.ERROR: error_summary(f"{type(exc).__name__}: {exc}")}
            tune.report({**record, metric: float("nan")} if metric else record)
    return run


def run_tune(study: StudySweep, opts: SweepOptions, shipped: Mapping[str, Any]) -> tuple[LiveSweep, str]:
    """Run (or resume) one sweep of `study`, its trainable given `shipped`, and return `(LiveSweep, experiment
    path)`: how every trial ended, the recorder (its writes flushed), whether it was interrupted.

    The study's `metric`/`mode` are given here once and reach the scheduler and the search algorithm through
    TuneConfig.
    Must be called after every user input has been validated: from here on, problems are Ray's (the resource
    check below needs the cluster's nodes, and ends in one line like a bad flag).
    """
    uri = resolve_tracking_uri(opts.tracking_uri)
    check_tracking(uri)
    name = opts.experiment_name(study.preset)
    exp_path = f"{opts.storage_root().rstrip('/')}/{name}"
    if opts.resume and not opts.is_remote_storage and not Path(exp_path).is_dir():
        raise opts.nothing_to_resume(name)
    if not opts.resume and not opts.is_remote_storage and Path(exp_path).exists():
        raise ConfigError(f"experiment {exp_path} exists: pass --resume to continue it, or another --name")
    console.quiet(exp_path, opts.verbose)  # Ray's and MLflow's messages to the experiment's driver.log (-v: here)
    import_in_background()  # while Ray starts
    started_here = not ray.is_initialized()
    dashboard = start_ray(opts)
    try:  # what the cluster really has (a joined one, or a sweep inside a running ray.init)
        check_resources(opts, [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")])
    except ConfigError:
        if started_here:
            ray.shutdown()  # only what this command started
        raise
    if dashboard and opts.verbose:
        print(f"Ray dashboard: {dashboard}  (token: `ray get-auth-token`)", flush=True)
    # Opened while Tune starts the trials' processes (both take seconds); a trial's first event waits for it.
    recorder = SweepRecorder(uri, opts.experiment or study.experiment, opts.sweep, exp_path, wait=False,
                             announce=True, system_metrics=True,
                             tags={R.TAG_RAY_ADDRESS: opts.address or "local", R.TAG_COMMAND: opts.command,
                                   **opts.tags})

    sweep = live.begin(LiveSweep(
        recorder, dict(study.static_params), study.run_name, shown=study.shown, varying=varying_keys(study.space),
        labels=study.labels, metric=study.metric, mode=study.mode, best_metric=study.best_metric,
        progress=opts.progress, planned_epochs=study.planned_epochs, may_end_early=study.may_end_early,
        resolved_keys=tuple(study.resolved_keys),
        # a resumed sweep's trials carry the runs they were made with, whatever this driver's flags say
        stack_key=study.space.stacked_key() or study.stackable))
    trainable = tune.with_parameters(catching_errors(study.trainable, study.metric), **shipped)
    wrapped = tune.with_resources(trainable, {"cpu": opts.cpus_per_trial, "gpu": opts.gpus_per_trial})
    param_space = to_tune(study.space)
    if opts.resume:
        tuner = tune.Tuner.restore(exp_path, wrapped, resume_unfinished=True, resume_errored=False,
                                   param_space=param_space)
    else:
        tuner = tune.Tuner(
            wrapped, param_space=param_space,
            tune_config=tune.TuneConfig(metric=study.metric, mode=study.mode, scheduler=study.scheduler,
                                        search_alg=study.search_alg, num_samples=study.num_samples,
                                        max_concurrent_trials=opts.max_concurrent or None,
                                        reuse_actors=True),  # a fresh process costs ~5 s of imports
            run_config=tune.RunConfig(
                name=name, storage_path=opts.storage_root(), verbose=0 if opts.verbose < 2 else 1,
                callbacks=[JsonLoggerCallback(), TrialEvents()],
                checkpoint_config=tune.CheckpointConfig(num_to_keep=checkpoints_to_keep(study.scheduler)),
                failure_config=tune.FailureConfig(max_failures=opts.max_failures, fail_fast=False),
            ),
        )
    with _sigterm_as_ctrl_c(), _json_logger_only():
        try:
            tuner.fit()
        except Exception:
            if recorder.open_error is not None:  # raised by a trial event (`LiveSweep.start`, `.result`)
                raise TrackingError(recorder.open_error) from None
            raise
    recorder.wait_open()  # a resumed sweep with nothing left to run never waited for it
    recorder.flush()
    return sweep, exp_path


@contextlib.contextmanager
def _json_logger_only() -> Iterator[None]:
    """Tune without its default TensorBoard and CSV loggers, during one `fit`.

    Why: they write every result on the driver's loop (an event file and a writer thread per trial, progress.csv),
    and nothing here reads them. The JSON logger stays (`run_tune` passes it): a trial's result.json is what
    --resume backfills MLflow from. Scoped to the fit: other Tune runs of the process keep Tune's defaults.
    """
    key, before = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS")
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


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


