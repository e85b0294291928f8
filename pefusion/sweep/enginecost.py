"""What a sweep costs beyond its trials' own work, measured on this machine for `--plan` (`pefusion.sweep.plan`):
Ray's start, a trial slot's first trial (Tune making the trial's process, which imports torch, Ray Tune and the
trainable), the gap between two trials of a slot (the final report, the actor's reset), each report with its
checkpoint, and the end (Tune's last bookkeeping, then Ray's shutdown, which a sweep's command pays as it exits).

Measured by a tiny sweep: a fresh process starts a local Ray cluster of the sweep's CPUs and runs two trials per
slot through Tune as the engine runs them (one CPU each, actors reused, each trial's MLflow run written by the
engine's own callback to a throwaway sqlite store: the driver's work per trial, on the cores the trials share),
each importing the study's trainable module (what a real trial's process imports) and reporting `REPORTS` results
with a checkpoint, and doing no work. The
figures are kept in pefusion's cache folder, one file per machine, CPU count, trainable module and Ray version, and
measured again after `MAX_AGE_S`: `--plan` pays the tiny sweep (about 10 s) once a day on a machine; a sweep itself
never runs it (`measure=False`), it takes the figures `--plan` kept, or leaves Ray's costs out and says so.
"""
from __future__ import annotations

import importlib
import json
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping

REPORTS = 3  # results each measuring trial reports, each with a checkpoint
MAX_AGE_S = 24 * 3600

# What Tune reads while a sweep runs (set for the Tuner's life only, a user's own value first:
# `pefusion.sweep.tuner`), and the tiny sweep runs under it too, so it lies here, below both:
TUNE_ENV = {
    # Persist Tune's experiment state at least every second, so a driver killed with SIGKILL loses (almost) no
    # finished trial; the state file is tiny next to an epoch of training.
    "TUNE_GLOBAL_CHECKPOINT_S": "1",
    # Checkpointing every epoch with num_to_keep=1 forces those snapshots on purpose; don't warn about it.
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    # Keep Ray's own console table quiet; the sweeps print their own summary.
    "RAY_AIR_NEW_OUTPUT": "0",
}


def tune_env() -> dict[str, str]:
    """What the tuner sets while a sweep runs: `TUNE_ENV` where the user set none, and Tune's default loggers off."""
    return {**{k: v for k, v in TUNE_ENV.items() if k not in os.environ}, "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}


@dataclass(frozen=True)
class EngineCost:
    """Seconds, measured on this machine (`measure`)."""

    ray_start_s: float  # ray.init of a local cluster
    first_trial_s: float  # a slot's first trial: from Tune's start to the trial's first line (its process, imports)
    between_s: float  # a slot's next trial: from one trial's end to the next one's start
    report_s: float  # one result reported with its checkpoint, inside the trial
    end_s: float  # from the last trial's end to Ray shut down
    measured_at: float  # Unix seconds
    shutdown_s: float  # of `end_s`, Ray's shutdown (a sweep's command pays it as it exits)

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.measured_at))


def _trial(config: dict) -> None:
    """A measuring trial: what a real trial's process imports (`config["module"]`, the study's trainable module),
    then `REPORTS` reports with a checkpoint."""
    from ray import tune

    importlib.import_module(config["module"])

    started = time.time()
    for epoch in range(1, REPORTS + 1):
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "state.pt").write_bytes(b"\0" * 4096)
            tune.report({"epoch": epoch, "started_at": started, "ended_at": time.time()},
                        checkpoint=tune.Checkpoint.from_directory(folder))


def measure(slots: int, env: Mapping[str, str], module: str, start_ray: Callable[[], object]) -> EngineCost:
    """The tiny sweep (see the module docstring) on a local cluster of `slots` CPUs, `slots` trials at once, each
    importing `module`, with Tune's environment `env` as the engine sets it; run it in a fresh process
    (`pefusion.sweep.gpus.in_fresh_process`): it starts its own cluster with `start_ray()` (as the sweep starts
    one: its dashboard or not, MLflow's client imported meanwhile), and stops it."""
    import ray
    from ray import tune

    from pefusion.tracking.callbacks import MLflowRuns
    from pefusion.tracking.recorder import SweepRecorder

    devnull = os.open(os.devnull, os.O_WRONLY)  # Tune's and Ray's lines: this process is the measurement's own
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.environ.update(env)
    start = time.time()
    start_ray()
    started = time.time()
    try:
        with tempfile.TemporaryDirectory() as storage:
            recorder = SweepRecorder(f"sqlite:///{storage}/mlflow.db", "engine-cost", "engine_cost", storage,
                                     wait=False)
            runs = MLflowRuns(recorder, {"module": module}, lambda config: f"trial {config['i']}")
            tune_start = time.time()
            grid = tune.Tuner(
                tune.with_resources(_trial, {"cpu": 1}),
                param_space={"i": tune.grid_search(list(range(2 * slots))), "module": module},
                tune_config=tune.TuneConfig(max_concurrent_trials=slots, reuse_actors=True),
                run_config=tune.RunConfig(storage_path=storage, verbose=0, callbacks=[runs])).fit()
            recorder.flush()
            last = sorted((r.metrics["started_at"], r.metrics["ended_at"]) for r in grid)  # each trial's last report
    finally:
        stopping = time.time()
        ray.shutdown()
    ended = time.time()
    starts, ends = [s for s, _ in last], [e for _, e in last]
    first = [s - tune_start for s in starts[:slots]]
    # the later trials, each in the slot freed first (the slots are alike)
    free = sorted(ends[:slots])
    gaps = []
    for s, e in zip(starts[slots:], ends[slots:]):
        gaps.append(max(s - free.pop(0), 0.0))
        free = sorted(free + [e])
    return EngineCost(ray_start_s=started - start, first_trial_s=sum(first) / len(first),
                      between_s=sum(gaps) / max(len(gaps), 1),
                      report_s=sum(e - s for s, e in last) / len(last) / REPORTS,
                      end_s=ended - max(ends), measured_at=ended, shutdown_s=ended - stopping)


def engine_cost(slots: int, env: Mapping[str, str], module: str, start_ray: Callable[[], object], kind: str = "",
                cache: Path | None = None, measure_now: bool = True) -> EngineCost | None:
    """This machine's figures for a local cluster of `slots` CPUs whose trials import `module`, started by
    `start_ray` (which must pickle), of the `kind` it names (e.g. with its dashboard): the cached ones when younger
    than `MAX_AGE_S`, else (with `measure_now`) measured now, a tiny sweep in a fresh process with Tune's
    environment `env`, and cached; else None."""
    import ray

    from pefusion import cache_home
    from pefusion.sweep.gpus import in_fresh_process

    name = f"{socket.gethostname()}-{slots}cpu{'-' + kind if kind else ''}-{module}-ray{ray.__version__}.json"
    path = (cache or cache_home()) / "engine_cost" / name
    saved = kept(path)
    try:
        if saved is not None:
            return EngineCost(**saved)
    except TypeError:  # kept by a version with other fields
        pass
    if not measure_now:
        return None
    cost = in_fresh_process(measure, slots, dict(env), module, start_ray)
    keep(path, asdict(cost))
    return cost


def kept(path: Path) -> dict | None:
    """A measurement `keep` wrote at `path` (its `measured_at` Unix seconds) younger than `MAX_AGE_S`, or None."""
    try:
        saved = json.loads(path.read_text())
        return saved if time.time() - saved["measured_at"] < MAX_AGE_S else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep(path: Path, measured: Mapping) -> None:
    """`measured` (with its `measured_at`) as JSON at `path`, replaced whole: a sweep reading it meanwhile never
    sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(measured))
    tmp.replace(path)
