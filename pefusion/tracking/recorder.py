"""One sweep in MLflow: one MLflow experiment per study (the study names it), one parent run per sweep, one child
run per trial. Every number a trial reports per epoch becomes a series (step = epoch), whatever its name.

Only the sweep driver writes (`pefusion.tracking.callbacks` hands Tune's trial events to the recorder), so a
sqlite store never sees concurrent writers and trials on cluster nodes need no route to the tracking server.
Every lookup is by tag, never by in-memory state, so a driver restarted with `--resume` finds the runs it made
before and never duplicates a child run.

During a sweep the writes go through one background thread (`later`, `flush`; `pefusion.tracking.writer`):
Ray Tune's loop never waits on the tracking server, and a server that goes away is waited for (the sweep goes on,
the writes queue up in order and are made when it returns) instead of costing a metric.

With the analysis reports (`pefusion.tracking.store.log_artifacts_to_run`), the project's one writer of MLflow.
One writer besides it, on purpose: MLflow's own monitor of this machine (`SystemMetrics`: CPU and RAM, and GPUs
with nvidia-ml-py) logs to the parent run from a thread and client of its own, since NVML sees a whole device, not
a trial.
"""
from __future__ import annotations

import functools
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pefusion import record as R
from pefusion.storage import canonical, has_credentials, redact
from pefusion.tracking.provenance import command_line, git_commit
from pefusion.tracking.store import TrackingError, ensure_experiment, log_artifacts_to_run, mlflow_client, ui_link
from pefusion.tracking.writer import WRITE, SystemMetrics, Writer, is_unreachable

MLFLOW_PARAM_MAX = 6000  # MLflow's param value limit; longer values are cut, never rejected


def _finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out[k] = float(v)
    return out


class SweepRecorder:
    """Writes one sweep to MLflow. Safe to rebuild after a driver restart: runs are found again by tag.

    Its methods write at once; during a sweep the Tune callback hands them to `later` (one background thread, in
    order) and the driver calls `flush` before it reads or finishes anything.
    """

    def __init__(self, uri: str, experiment: str, sweep: str, sweep_path: str,
                 tags: Mapping[str, Any] | None = None, *, wait: bool = True, announce: bool = False,
                 system_metrics: bool = False) -> None:
        """Open the sweep's parent run (found again by tag when resumed, or created) with `tags`, on the writer
        thread. `wait=False` returns at once: opening a store takes seconds (importing MLflow, creating or
        migrating a sqlite database), which then overlap Ray's start of the first trials; the writes queued
        after it wait for it, and `wait_open` is where the driver waits. `announce` prints where it writes.
        `system_metrics`: MLflow's samples of this machine on the parent run while it is open (`SystemMetrics`)."""
        # The experiment's path as it may be shown (its credentials `***`: it is never kept whole here).
        self.uri, self.experiment, self.sweep, self.sweep_path = uri, experiment, sweep, redact(sweep_path)
        self._legacy_key = "" if has_credentials(sweep_path) else sweep_path
        self.system_metrics = system_metrics
        self.system: SystemMetrics | None = None
        # The writer thread retries an unreachable server itself (with no end), so MLflow's own retries (7 with
        # a doubling back-off, minutes per call) would only delay noticing the outage. Against a server, MLflow
        # prints "View run ... / View experiment ..." for every run it ends: two lines per trial between the
        # sweep's own progress lines. MLflow reads all three at each request.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.experiment_id = self.parent_run_id = ""
        self.open_error: str | None = None  # why the store could not be used (the writes after it are dropped)
        self._opened = threading.Event()
        self._runs: dict[str, str] = {}  # trial id -> run id
        self._last_step: dict[str, int] = {}  # run id -> last epoch logged (skip replays after resume)
        self._series: dict[str, set[str]] = {}  # run id -> names of the metrics it has per epoch
        self._params: dict[str, set[str]] = {}  # run id -> names of its params (those of `log_trial_info` too)
        self._done: set[str] = set()  # run ids whose trial already finished (a resume re-reports them)
        self._writer: Writer | None = None
        self.later(self._open, dict(tags or {}), announce)
        if wait:
            self.wait_open()

    def _open(self, tags: Mapping[str, Any], announce: bool) -> None:
        try:
            self.experiment_id = ensure_experiment(self.uri, self.experiment)
            self.parent_run_id = self._find_or_create_parent()
            self.tag_parent(tags)
            if self.system_metrics and self.system is None:
                self.system = SystemMetrics.start(self.uri, self.parent_run_id)
        except Exception as exc:  # noqa: BLE001
            if is_unreachable(exc):
                raise  # the writer waits for the store, then opens it
            line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            self.open_error = redact(f"cannot use the MLflow tracking store {self.uri}: {line}")
        self._opened.set()
        if announce and self.open_error is None:
            print(f"MLflow: {redact(self.uri)}  experiment '{self.experiment}', parent run {self.parent_run_id}", flush=True)
            served = "" if self.uri.startswith(("http://", "https://")) else \
                f"  (after `mlflow ui --backend-store-uri {self.uri}`)"
            print(f"MLflow UI: {ui_link(self.uri, self.experiment_id, self.parent_run_id)}{served}", flush=True)
            if self.system is not None and self.system.gpus:  # (without nvidia-ml-py, nothing is said)
                print(f"MLflow system metrics: {self.system.gpus} GPU(s) on the parent run every "
                      f"{self.system.interval_s:g} s; {R.GPU_BUSY_LABEL}", flush=True)

    def wait_open(self) -> None:
        """Wait until the parent run is open; a store that cannot be used ends here in one line (TrackingError)."""
        self._opened.wait()
        self.check_open()

    def check_open(self) -> None:
        """TrackingError if opening the store failed (it may still be under way: this never waits)."""
        if self.open_error is not None:
            raise TrackingError(self.open_error)

    def __getstate__(self) -> dict:  # Tune pickles callbacks with the experiment; MLflow state is rebuilt
        return {k: self.__dict__[k] for k in ("uri", "experiment", "sweep", "sweep_path", "_legacy_key",
                                              "experiment_id", "parent_run_id", "open_error")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _runs={}, _last_step={}, _series={}, _params={}, _done=set(), _writer=None,
                             _opened=threading.Event(), system_metrics=False, system=None)
        self._opened.set()

    @property
    def client(self):
        return mlflow_client(self.uri)

    def later(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Make `fn(*args, **kwargs)` (a write of this recorder) on the writer thread, after those queued before;
        dropped if the store could not be opened."""
        if self._writer is None:
            self._writer = Writer(self.uri, on_back=self._store_back)
        self._writer.put(functools.partial(self._if_open, fn, *args, **kwargs))

    def _store_back(self) -> None:
        """The store answers again after an outage: the system monitor's thread may have ended in it."""
        if self.system is not None:
            try:
                self.system.restart()
            except Exception:  # noqa: BLE001  (away again: the next time it is back restarts it)
                pass

    def _if_open(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if self.open_error is None:
            fn(*args, **kwargs)

    def flush(self) -> None:
        """Wait for every write handed to `later` (through an outage, however long)."""
        if self._writer is not None:
            self._writer.drain()

    def _search(self, filter_string: str) -> list:
        return self.client.search_runs([self.experiment_id], filter_string=filter_string, max_results=5000)

    def _find_or_create_parent(self) -> str:
        """The sweep's parent run, keyed by its storage's canonical form (`pefusion.storage.canonical`: the same
        experiment reached through another endpoint spelling, or with other credentials, is the same sweep); a
        parent made before that key, tagged with the path as typed, is found by it too."""
        key = canonical(self.sweep_path)
        found = self._search(f"tags.`{R.TAG_ROLE}` = 'sweep' and tags.`{R.TAG_STORAGE}` = '{key}'")
        if not found and self._legacy_key and self._legacy_key != key:
            found = self._search(f"tags.`{R.TAG_ROLE}` = 'sweep' and tags.`{R.TAG_STORAGE}` = '{self._legacy_key}'")
        if found:
            if found[0].info.status != "RUNNING":  # an interrupted sweep, resumed
                self.client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id
        run = self.client.create_run(self.experiment_id, run_name=key.rsplit("/", 1)[-1], tags={
            R.TAG_ROLE: "sweep", R.TAG_SWEEP: self.sweep, R.TAG_STORAGE: key,
            R.TAG_COMMAND: command_line(), R.TAG_GIT_COMMIT: git_commit(),
        })
        return run.info.run_id

    def tag_parent(self, tags: Mapping[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.parent_run_id, k, str(v))

    # --- child runs ---------------------------------------------------------------------------------------
    def trial_run(self, trial_id: str, params: Mapping[str, Any], run_name: str | None = None,
                  tags: Mapping[str, str] | None = None) -> str:
        """The child run of a trial (or of one run of a stacked trial: `trial_id` is then the run's key, and
        `tags` name the trial that carried it), created once (found again by tag on resume)."""
        if trial_id in self._runs:
            return self._runs[trial_id]
        found = self._search(f"tags.`{R.TAG_PARENT}` = '{self.parent_run_id}' and "
                             f"tags.`{R.TAG_TRIAL_ID}` = '{trial_id}'")
        if found:
            run_id = found[0].info.run_id
            # A retry of this write after `create_run` reached the server (its params, or only its answer, did
            # not: the server went away in between) finds the run here; without this it kept no params.
            missing = {k: v for k, v in params.items() if k not in found[0].data.params}
            if missing:
                self._log_params(run_id, missing)
            self._params[run_id] = set(found[0].data.params) | set(missing)
            # Its series so far (epochs a previous driver logged): what to skip, and what the final record repeats.
            steps = {key: [m.step for m in self.client.get_metric_history(run_id, key)]
                     for key in found[0].data.metrics}
            self._series[run_id] = {key for key, s in steps.items() if max(s, default=0) >= 1}
            self._last_step[run_id] = max((max(s, default=0) for s in steps.values()), default=0)
            # Finished before a driver restart: leave it as it is. The status tag alone is not enough: a driver
            # killed inside `finish_trial` leaves the tag on a run still RUNNING, whose finish must be redone; an
            # interrupted trial's run is KILLED with the tag 'interrupted', and runs again now.
            closed = found[0].info.status != "RUNNING"
            if closed and found[0].data.tags.get(R.TAG_STATUS) in R.FINAL_STATUSES:
                self._done.add(run_id)
            elif closed:
                self.client.update_run(run_id, status="RUNNING")
                self.client.set_tag(run_id, R.TAG_STATUS, R.STATUS_RUNNING)
        else:
            run = self.client.create_run(self.experiment_id, run_name=run_name, tags={
                R.TAG_PARENT: self.parent_run_id, R.TAG_ROLE: "trial", R.TAG_TRIAL_ID: trial_id,
                R.TAG_SWEEP: self.sweep, R.TAG_GIT_COMMIT: git_commit(), **(tags or {})})
            run_id = run.info.run_id
            self._log_params(run_id, params)
            self._params[run_id] = set(params)
            self._last_step[run_id] = 0
        self._runs[trial_id] = run_id
        return run_id

    def log_trial_info(self, trial_id: str, info: Mapping[str, Any]) -> None:
        """What a trial reported about itself (`record.TRIAL_INFO`) as params of its run: the ones it does not have
        yet (a param is written once; a retry on another node reports the same names)."""
        run_id = self._runs[trial_id]
        have = self._params[run_id]
        new = {k: v for k, v in info.items() if k not in have}
        if new:
            self._log_params(run_id, new)
            have.update(new)

    def is_done(self, trial_id: str) -> bool:
        """Whether the trial's run was closed with its final status (before this driver, or by it)."""
        return self._runs.get(trial_id) in self._done

    def tag_trial(self, trial_id: str, tags: Mapping[str, Any]) -> None:
        run_id = self._runs[trial_id]
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v))

    def interrupt_trial(self, trial_id: str) -> None:
        """A trial cut by an interruption: KILLED with the status tag 'interrupted' (never FINISHED); --resume
        reopens the same run and continues its epochs."""
        run_id = self._runs[trial_id]
        if run_id in self._done:
            return
        self.client.set_tag(run_id, R.TAG_STATUS, R.STATUS_INTERRUPTED)
        self.client.set_terminated(run_id, status="KILLED")

    def _log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        items = [Param(k, str(v)[:MLFLOW_PARAM_MAX]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(run_id, params=items[i:i + 100])

    def log_epoch(self, trial_id: str, step: int, metrics: Mapping[str, Any]) -> None:
        """Per-epoch metrics at step = epoch; an epoch replayed after a resume is not logged twice."""
        run_id = self._runs[trial_id]
        self._series.setdefault(run_id, set()).update(_finite_metrics(metrics))
        if step <= self._last_step.get(run_id, 0):
            return
        self._log_metrics(run_id, metrics, step)
        self._last_step[run_id] = step

    def _log_metrics(self, run_id: str, metrics: Mapping[str, Any], step: int = 0) -> None:
        from mlflow.entities import Metric
        # On the writer thread, the time the write was queued, the same on each retry: a batch the server made
        # but whose answer was lost is then sent again identical, and the store keeps it once (it drops an exact
        # duplicate of key, step, timestamp and value). With the time of each attempt, the epoch was logged twice.
        now = getattr(WRITE, "queued_ms", None) or int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in _finite_metrics(metrics).items()]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i:i + 500])

    def finish_trial(self, trial_id: str, record: Mapping[str, Any], artifact_dir: str | None = None,
                     step: int = 0) -> None:
        """Final metrics, status tags, artifacts; MLflow status FINISHED only for status 'ok'."""
        run_id = self._runs[trial_id]
        if run_id in self._done:
            return
        status = str(record.get(R.STATUS, R.STATUS_OK))
        series = self._series.get(run_id, set())
        self._log_metrics(run_id, {k: v for k, v in record.items() if k not in series}, step)
        self._log_final_series(run_id, {k: v for k, v in record.items() if k in series}, record)
        self.client.set_tag(run_id, R.TAG_STATUS, status)
        if record.get(R.ERROR):
            self.client.set_tag(run_id, R.TAG_ERROR, str(record[R.ERROR])[:5000])
        if artifact_dir:
            self.client.log_artifacts(run_id, artifact_dir)
        self.client.set_terminated(run_id, status="FINISHED" if status in R.SUCCESS_STATUSES else "FAILED")
        # Only now: the writer redoes a finish cut by an outage, and marked done before its writes the redo
        # returned at once (no final metrics, no checkpoint, the run left RUNNING). Redone, each write is kept
        # once: the metrics are identical (`_log_metrics`), the final values of series are guarded by their step.
        self._done.add(run_id)

    def _log_final_series(self, run_id: str, final: Mapping[str, Any], record: Mapping[str, Any]) -> None:
        """The final record's values of metrics the run has per epoch, once more at step = epochs_run + 1.

        Why: a run's value of a metric in MLflow (`get_run`, `search_runs`, the UI's run table) is the one logged
        at the largest step, ties broken by the latest timestamp (SqlAlchemyStore._update_latest_metrics_if_
        necessary compares (step, timestamp, value)). A final value of a per-epoch metric (e.g. the validation
        score of a restored best checkpoint) at step 0 would lose to the epochs, so MLflow showed the last
        epoch's value while the record and the CSV hold the final one. One step past the last epoch it is the
        run's value, and the series at steps 1..epochs_run stays as it was. Only for 'ok' records: a
        scheduler-stopped trial restores nothing (its values are its last epoch's), a failed one has none.
        """
        if record.get(R.STATUS) != R.STATUS_OK or not final or R.EPOCHS_RUN not in record:
            return
        step = int(record[R.EPOCHS_RUN]) + 1
        if self._last_step.get(run_id, 0) >= step:  # logged by a driver killed inside this finish: don't repeat
            return
        self._log_metrics(run_id, final, step)
        self._last_step[run_id] = step

    def log_parent_artifacts(self, paths: Iterable[Path], artifact_path: str = R.ARTIFACT_RESULTS_DIR) -> None:
        log_artifacts_to_run(self.uri, self.parent_run_id, paths, artifact_path)

    def log_card_time(self, wall_s: float, gpus: float) -> None:
        """Add this invocation's wall seconds, and the card time of the cluster's `gpus` over them, to what the
        parent run holds (an earlier, interrupted invocation's): SWEEP_WALL_S, CARD_HOURS, CLUSTER_GPUS."""
        before = self.client.get_run(self.parent_run_id).data.metrics
        self._log_metrics(self.parent_run_id, {R.SWEEP_WALL_S: before.get(R.SWEEP_WALL_S, 0.0) + wall_s,
                                               R.CARD_HOURS: before.get(R.CARD_HOURS, 0.0) + wall_s * gpus / 3600,
                                               R.CLUSTER_GPUS: gpus})

    def log_plan(self, metrics: Mapping[str, float], tags: Mapping[str, str]) -> None:
        """The sweep's estimate made before it started (`pefusion.sweep.plan.SweepPlan`) on its parent run."""
        self._log_metrics(self.parent_run_id, metrics)
        self.tag_parent(tags)

    def finish_sweep(self, metrics: Mapping[str, Any]) -> None:
        """The parent run FINISHED with the sweep's counts (only once every trial has finished)."""
        self._stop_system_metrics()
        self._log_metrics(self.parent_run_id, metrics)
        self.client.set_tag(self.parent_run_id, R.TAG_STATUS, "finished")
        self.client.set_terminated(self.parent_run_id, status="FINISHED")

    def interrupt_sweep(self) -> None:
        """The parent run of an interrupted sweep: KILLED, never FINISHED; --resume reopens it."""
        self._stop_system_metrics()
        self.client.set_tag(self.parent_run_id, R.TAG_STATUS, R.STATUS_INTERRUPTED)
        self.client.set_terminated(self.parent_run_id, status="KILLED")

    def _stop_system_metrics(self) -> None:
        if self.system is not None:
            self.system.stop()
            self.system = None
