"""Ray Tune plumbing: the trainable's error guard, the callbacks of the driver that runs a sweep, and the Tuner (new
or restored) under a SIGTERM that acts as Ctrl-C, on the cluster `pefusion.sweep.cluster.start_cluster` made.

`pefusion.sweep.driver.run_settled` is the only caller of `run_tune`; the study states *what*
to search (a param space, a trainable, a scheduler: `pefusion.sweep.study.StudySweep`), `pefusion.sweep.settle`
settles how, and this module does it the same way for every sweep. Current Ray API only:
`ray.tune.report`, `ray.tune.get_checkpoint`, `tune.Tuner`, `tune.TuneConfig`, `tune.RunConfig`,
`tune.FailureConfig`, `tune.with_resources`, `tune.with_parameters`, `tune.Callback`.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import signal
import threading
import traceback
from typing import Any, Callable, Iterator, Mapping, Sequence

import ray
from ray import tune
from ray.tune.callback import CallbackList
from ray.tune.logger import JsonLoggerCallback

from pefusion import record as R
from pefusion.sweep.enginecost import tune_env
from pefusion.sweep.search import checkpoints_to_keep
from pefusion.sweep.settle import SettledSweep, storage_root
from pefusion.sweep.space import to_tune
from pefusion.tracking.trials import error_summary


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


# The callbacks of the driver restoring an experiment, while Tune unpickles the experiment's (`DriverCallbacks`).
_RESTORING: contextvars.ContextVar[Sequence[tune.Callback]] = contextvars.ContextVar("pefusion_restoring")


class DriverCallbacks(CallbackList):
    """The sweep's callbacks, as Tune's one callback of the driver's own: MLflow runs, progress lines, outcomes.

    Tune pickles a run's callbacks with the experiment (its tuner.pkl) and unpickles them when --resume restores
    it. These hold the driver's state (a tracking client and its writer thread, the options the driver was given),
    which must not come back from a file: they pickle to nothing, and unpickle as the callbacks of the driver
    that restores the experiment (`restored_with`), so that a resumed sweep acts on the resuming driver's options.
    """

    def __reduce__(self) -> tuple:
        return _restoring_driver_callbacks, ()


def _restoring_driver_callbacks() -> DriverCallbacks:
    return DriverCallbacks(list(_RESTORING.get(())))


@contextlib.contextmanager
def restored_with(callbacks: Sequence[tune.Callback]) -> Iterator[None]:
    """`DriverCallbacks` unpickled within are `callbacks` (outside, none)."""
    token = _RESTORING.set(tuple(callbacks))
    try:
        yield
    finally:
        _RESTORING.reset(token)


def run_tune(settled: SettledSweep, shipped: Mapping[str, Any], callbacks: Sequence[tune.Callback]) -> None:
    """Run (or resume) the settled sweep on the cluster `start_cluster` made, its trainable given `shipped`, Tune's
    events going to `callbacks` (in order) in this driver. Returns when Tune does: every trial ended, or the sweep
    was interrupted (Ctrl-C, SIGTERM).

    The study's `metric`/`mode` are given here once and reach the scheduler and the search algorithm through
    TuneConfig.
    """
    study, opts = settled.study, settled.opts
    trainable = tune.with_parameters(catching_errors(study.trainable, study.metric), **shipped)
    wrapped = tune.with_resources(trainable, {"cpu": opts.cpus_per_trial, "gpu": opts.gpus_per_trial})
    param_space = to_tune(study.space)
    with _tune_env(), _sigterm_as_ctrl_c():
        if opts.resume:
            with restored_with(callbacks):
                tuner = tune.Tuner.restore(settled.path, wrapped, resume_unfinished=True, resume_errored=False,
                                           param_space=param_space)
        else:
            tuner = tune.Tuner(
                wrapped, param_space=param_space,
                tune_config=tune.TuneConfig(metric=study.metric, mode=study.mode, scheduler=study.scheduler,
                                            search_alg=study.search_alg, num_samples=study.num_samples,
                                            max_concurrent_trials=opts.max_concurrent or None,
                                            reuse_actors=True),  # a fresh process costs ~5 s of imports
                run_config=tune.RunConfig(
                    name=settled.name, storage_path=storage_root(opts), verbose=0 if opts.verbose < 2 else 1,
                    # The JSON logger's result.json is what --resume backfills MLflow from.
                    callbacks=[JsonLoggerCallback(), DriverCallbacks(list(callbacks))],
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=checkpoints_to_keep(study.scheduler)),
                    failure_config=tune.FailureConfig(max_failures=opts.max_failures, fail_fast=False),
                ),
            )
        tuner.fit()


@contextlib.contextmanager
def _tune_env() -> Iterator[None]:
    """`tune_env()` (its `TUNE_ENV` where the user set none), and Tune without its default TensorBoard and CSV
    loggers, while the Tuner is made and runs.

    Why no default loggers: they write every result on the driver's loop (an event file and a writer thread per
    trial, progress.csv), and nothing here reads them; the JSON logger stays (`run_tune` passes it). Scoped to the
    sweep: other Tune runs of the process keep Tune's defaults.
    """
    wanted = tune_env()
    before = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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


