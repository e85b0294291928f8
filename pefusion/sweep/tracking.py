"""MLflow tracking for sweeps: one MLflow experiment per study (the study names it), one parent run per sweep, one
child run per trial. Every number a trial reports per epoch becomes a series (step = epoch), whatever its name.

Only the sweep driver talks to MLflow (`pefusion.sweep.live` forwards Tune's trial events here), so a sqlite
store never sees concurrent writers and trials on cluster nodes need no route to the tracking server.
Every lookup is by tag, never by in-memory state, so a driver restarted with `--resume` finds the runs it made
before and never duplicates a child run.

During a sweep the writes go through one background thread (`SweepRecorder.later`, `flush`): Ray Tune's loop
never waits on the tracking server, and a server that goes away is waited for (the sweep goes on, the writes
queue up in order and are made when it returns) instead of costing a metric.

This module is the project's one writer of MLflow: the analysis reports, written after a sweep, log their files
to its parent run through `log_artifacts_to_run`; `pefusion.analysis` itself only reads. One writer besides it,
on purpose: MLflow's own monitor of this machine (`SystemMetrics`: CPU and RAM, and GPUs with nvidia-ml-py) logs to
the parent run from a thread and client of its own, since NVML sees a whole device, not a trial.
"""
from __future__ import annotations

import functools
import math
import os
import queue
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from pefusion import record as R
from pefusion.errors import ConfigError

# Against a server, MLflow prints "View run ... / View experiment ..." for every run it ends: two lines per trial
# between the sweep's own progress lines.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
MLFLOW_PARAM_MAX = 6000  # MLflow's param value limit; longer values are cut, never rejected
# Seconds between two samples of the machine on a sweep's parent run (MLflow's
# MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it).
SYSTEM_METRICS_INTERVAL_S = 10.0


class TrackingError(ConfigError):
    """The tracking server or store cannot be used (one line, reported before any trial starts)."""


def resolve_tracking_uri(cli_value: str | None = None) -> str:
    """`--tracking-uri`, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory.

    A relative sqlite path is made absolute, so that processes started elsewhere (Ray trials, the UI) see the
    same database file.
    """
    uri = cli_value or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        uri = prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def check_tracking(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, in one line, when the tracking store is unusable."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as resp:
                if resp.status != 200:
                    raise TrackingError(f"MLflow tracking server {uri} answered HTTP {resp.status} on /health")
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TrackingError(
                f"MLflow tracking server {uri} is unreachable ({reason}); start it with "
                f"`mlflow server --host 127.0.0.1 --port 5000` or pass --tracking-uri sqlite:///mlflow.db"
            ) from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///"):]).parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise TrackingError(f"cannot write the MLflow database in {folder} (tracking URI {uri})")
    elif uri.startswith("file:") or "://" not in uri:
        raise TrackingError(f"tracking URI {uri!r} is a file store, which MLflow >= 3.13 refuses; "
                            f"use sqlite:///mlflow.db or an http:// server")


@functools.cache
def git_commit() -> str:
    """The commit of the code that ran (empty outside a git checkout); asked once per driver (a subprocess)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def command_line(argv: Sequence[str] | None = None, program: str = "", *, absolute: bool = False) -> str:
    """The command that started this process, quoted so that pasted in the same folder it runs again: the
    interpreter as the user would type it (`_interpreter`) and the script's path as given (`absolute`: its
    absolute path, so that it runs from any folder), or an installed command (an entry point) by its name when
    PATH finds it, else by its path; then the arguments.

    `argv` replaces this process's arguments; `program` names the command that takes them when they are not this
    process's own (a main called in-process: this process's command line is then another program's).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if program:
        return shlex.join([program, *args])
    script = os.path.abspath(sys.argv[0]) if absolute else sys.argv[0]
    if not script.endswith(".py") and os.access(script, os.X_OK):  # an entry point, started by its #! line
        name = os.path.basename(script)
        found = shutil.which(name)
        return shlex.join([name if found and os.path.samefile(found, script) else script, *args])
    return shlex.join([_interpreter(), script, *args])


@functools.lru_cache(maxsize=1)
def _interpreter() -> str:
    """This interpreter as the user would type it: the name typed, `python` or `python3` when that name on PATH
    runs this interpreter, else its full path. A name on PATH may be a launcher (pyenv's shims are shell
    scripts that exec the real one), so it is asked which interpreter it runs."""
    typed = sys.orig_argv[0] if sys.orig_argv else ""
    if typed and os.sep not in typed and _is_this_interpreter(shutil.which(typed) or ""):
        return typed
    for name in ("python", "python3"):
        if shutil.which(name) is None:
            continue
        try:
            out = subprocess.run([name, "-S", "-c", "import sys; print(sys.executable)"], capture_output=True,
                                 text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if _is_this_interpreter(out.stdout.strip()):
            return name
    return sys.executable


def _is_this_interpreter(path: str) -> bool:
    """Same binary in the same folder: a virtual environment's python links to the system's, but runs with its
    own packages (found from its folder)."""
    if not path:
        return False
    here, there = os.path.abspath(sys.executable), os.path.abspath(path)
    return os.path.dirname(here) == os.path.dirname(there) and os.path.realpath(here) == os.path.realpath(there)


def import_in_background() -> None:
    """Import MLflow's client and its SQL store on a daemon thread, now.

    Why: they take about 1.5 s of CPU, which the recorder's writer thread would otherwise spend while Tune starts
    the trial processes (on a 2-core machine, delaying the first trials by about a second). Started before
    `ray.init`, the import overlaps the cluster's start instead. A later import of the same modules waits for
    this one; a failure is the recorder's to report (`SweepRecorder.open_error`), in one line.
    Call after `console.quiet`: MLflow sets up its loggers as it is imported.
    """
    import importlib

    # The packages with import cycles that both this import and `ray.init` import (Ray 2.60, MLflow 3.17; ~30 ms),
    # imported here first: two threads entering one cycle from both ends would get a partly initialised module
    # (Python's way out of the deadlock). The other modules they share have no cycle.
    for shared in ("click", "opentelemetry.trace", "opentelemetry.metrics", "opentelemetry.sdk.resources"):
        try:
            importlib.import_module(shared)
        except ImportError:
            pass

    def load() -> None:
        for module in ("mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store"):
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001
                return

    threading.Thread(target=load, name="pefusion-mlflow-import", daemon=True).start()


def mlflow_client(uri: str):
    """The MLflow client of the tracking store at `uri`, for reading and writing runs."""
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def new_sqlite_store(uri: str) -> None:
    """Create the sqlite store of `uri`, if it does not exist, as a copy of an empty store that MLflow created and
    migrated once per MLflow version (kept in the pefusion cache).

    Why: MLflow creates a store by running its whole schema migration history, seconds of CPU (13 s on a loaded
    2-core machine) taken from the first trials as they start, in every new folder. The copy is what MLflow would
    have made there: its Default experiment's artifact location is set to ./mlruns/0 of this folder, as MLflow
    sets it. Never replaces a store another driver created meanwhile (`os.link` fails on an existing file).
    """
    path = Path(uri[len("sqlite:///"):])
    if not uri.startswith("sqlite:///") or path.exists():
        return
    import sqlite3

    import mlflow
    from pefusion.data.cache import cache_root
    from pefusion.data.config import DataConfig

    template = cache_root(DataConfig()) / "mlflow" / f"empty-{mlflow.__version__}.db"
    if not template.exists():
        template.parent.mkdir(parents=True, exist_ok=True)
        made = template.with_name(f"{template.name}.{os.getpid()}.{threading.get_ident()}")
        mlflow_client(f"sqlite:///{made}").search_experiments()  # creates and migrates it
        os.replace(made, template)
    staged = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    shutil.copyfile(template, staged)
    with sqlite3.connect(staged) as db:
        now = int(time.time() * 1000)
        db.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                   "WHERE experiment_id = 0", (str(Path.cwd().resolve() / "mlruns" / "0"), now, now))
    try:
        os.link(staged, path)
    except FileExistsError:
        pass
    finally:
        staged.unlink()


def ensure_experiment(uri: str, name: str) -> str:
    """The experiment's id; created on first use with artifacts in an absolute ./mlartifacts for local stores."""
    new_sqlite_store(uri)
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    artifact_location = None
    if uri.startswith("sqlite:///"):
        artifact_location = (Path.cwd() / "mlartifacts").resolve().as_uri()
    return client.create_experiment(name, artifact_location=artifact_location)


def log_artifacts_to_run(uri: str, run_id: str, paths: Iterable[Path], artifact_path: str) -> None:
    """Log files to an existing run, under `artifact_path` in its artifacts."""
    client = mlflow_client(uri)
    for p in paths:
        client.log_artifact(run_id, str(p), artifact_path)


def _finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out[k] = float(v)
    return out


# The write the writer thread is making (`_Writer`): `queued_ms`, when it was handed to `later`.
_WRITE = threading.local()


# Substrings of the errors of a store that is away for a while (server down or restarting, network, a locked
# sqlite file): such a write is retried until it succeeds. Any other error is a bug and is reported, not retried.
_UNREACHABLE = ("Max retries exceeded", "Connection refused", "Connection aborted", "Failed to establish",
                "Remote end closed", "timed out", "Temporary failure in name resolution", "database is locked")


def is_unreachable(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) says the tracking store cannot be reached right now."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ConnectionError, TimeoutError)) or any(s in str(seen) for s in _UNREACHABLE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Writer:
    """One daemon thread that makes queued MLflow writes in order, waiting out an unreachable store.

    Why a thread: MLflow's client retries a dead server for minutes inside the call, and the Tune callbacks run in
    the driver's loop, so every trial would stall behind it. Here the loop only enqueues; an outage costs time
    on this thread, never a write (each is retried, with a back-off up to 30 s, until the store answers).

    A retried write is the whole op again, so every op must leave the same records when redone after any of its
    requests failed: one refused (never reached the server) or one whose answer was lost (the server made it).
    The recorder's writes are made so (`trial_run`, `finish_trial`, `_log_metrics`).
    """

    RETRY_MAX_S = 30.0

    def __init__(self, uri: str, on_back: Callable[[], None] = lambda: None) -> None:
        self.uri = uri
        self.on_back = on_back  # called on this thread when the store answers again after an outage
        self.down_since: float | None = None
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="pefusion-mlflow-writer", daemon=True).start()

    def put(self, op: Callable[[], None]) -> None:
        self._queue.put((op, int(time.time() * 1000)))

    @property
    def pending(self) -> int:
        return self._queue.unfinished_tasks

    def _loop(self) -> None:
        while True:
            op, _WRITE.queued_ms = self._queue.get()
            delay = 1.0
            while True:
                try:
                    op()
                    break
                except Exception as exc:  # noqa: BLE001 (the thread must outlive any one write)
                    if not is_unreachable(exc):
                        print(f"MLflow write skipped: {str(exc).strip().splitlines()[0][:300]}", file=sys.stderr,
                              flush=True)
                        break
                    if self.down_since is None:
                        self.down_since = time.time()
                        print(f"MLflow tracking store {self.uri} is unreachable; the sweep goes on and its records "
                              f"wait here until it answers ({self.pending} queued)", file=sys.stderr, flush=True)
                    time.sleep(delay)
                    delay = min(2 * delay, self.RETRY_MAX_S)
            if self.down_since is not None and delay > 1.0:
                print(f"MLflow tracking store is back after {time.time() - self.down_since:.0f} s; writing the "
                      f"{self.pending - 1} queued records", file=sys.stderr, flush=True)
                self.down_since = None
                self.on_back()
            self._queue.task_done()

    def drain(self, every_s: float = 30.0) -> None:
        """Wait until every queued write is made; while the store is away, say so every `every_s` seconds."""
        said = time.time()
        while self.pending:
            time.sleep(0.05)
            if self.down_since is not None and time.time() - said >= every_s:
                said = time.time()
                print(f"waiting for the MLflow tracking store {self.uri}: {self.pending} records to write "
                      f"(Ctrl-C stops; --resume writes them from what Ray stored)", file=sys.stderr, flush=True)


class SystemMetrics:
    """MLflow's own monitor of this machine (`SystemMetricsMonitor`) on a sweep's parent run: CPU and RAM where
    psutil is importable (Ray ships it), each GPU's utilisation and memory where nvidia-ml-py is (`pefusion[gpu]`),
    under MLflow's names (`pefusion.record.SYSTEM_CPU`, `system_gpu`), a sample every SYSTEM_METRICS_INTERVAL_S.

    It writes with a client and a thread of its own, outside the recorder's writer: a sample it cannot write ends
    its thread (MLflow's way), so the recorder starts a new one on the same run when the store answers again
    (`restart`), and a resumed sweep on its reopened parent; each goes on from the run's last step. An outage
    costs the samples of its own span, never a record of the sweep.
    """

    def __init__(self, uri: str, run_id: str) -> None:
        from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._make = lambda: SystemMetricsMonitor(run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                                                  resume_logging=True, tracking_uri=uri)
        self._monitor = self._make()
        self.gpus = sum(getattr(m, "num_gpus", 0) for m in self._monitor.monitors if isinstance(m, GPUMonitor))
        self.interval_s = float(self._monitor.sampling_interval)
        self._monitor.start()

    @staticmethod
    def start(uri: str, run_id: str) -> SystemMetrics | None:
        """The monitor of run `run_id`, started; None where psutil is missing, the user turned MLflow's system
        metrics off (MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=false) or the monitor cannot start: the sweep never
        depends on it. A store that is away raises (the writer retries the opening it is part of)."""
        from mlflow.environment_variables import MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING as ENABLED

        if ENABLED.defined and not ENABLED.get():
            return None
        try:
            return SystemMetrics(uri, run_id)
        except ImportError:  # psutil (MLflow's CPU monitor imports it)
            return None
        except Exception as exc:  # noqa: BLE001
            if is_unreachable(exc):
                raise
            return None

    def restart(self) -> None:
        """A new monitor on the same run, from its next step (the old one's thread may have ended on an outage)."""
        self._monitor.finish()
        self._monitor = self._make()
        self._monitor.start()

    def stop(self) -> None:
        """Stop sampling: its thread ends and the samples it holds are written."""
        self._monitor.finish()


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
        self.uri, self.experiment, self.sweep, self.sweep_path = uri, experiment, sweep, sweep_path
        self.system_metrics = system_metrics
        self.system: SystemMetrics | None = None
        # The writer thread retries an unreachable server itself (with no end), so MLflow's own retries (7 with
        # a doubling back-off, minutes per call) would only delay noticing the outage.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        self.experiment_id = self.parent_run_id = ""
        self.open_error: str | None = None  # why the store could not be used (the writes after it are dropped)
        self._opened = threading.Event()
        self._runs: dict[str, str] = {}  # trial id -> run id
        self._last_step: dict[str, int] = {}  # run id -> last epoch logged (skip replays after resume)
        self._series: dict[str, set[str]] = {}  # run id -> names of the metrics it has per epoch
        self._params: dict[str, set[str]] = {}  # run id -> names of its params (those of `log_trial_info` too)
        self._done: set[str] = set()  # run ids whose trial already finished (a resume re-reports them)
        self._writer: _Writer | None = None
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
            self.open_error = f"cannot use the MLflow tracking store {self.uri}: {line}"
        self._opened.set()
        if announce and self.open_error is None:
            print(f"MLflow: {self.uri}  experiment '{self.experiment}', parent run {self.parent_run_id}", flush=True)
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
        return {k: self.__dict__[k] for k in ("uri", "experiment", "sweep", "sweep_path", "experiment_id",
                                              "parent_run_id", "open_error")}

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
            self._writer = _Writer(self.uri, on_back=self._store_back)
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
        found = self._search(f"tags.`{R.TAG_ROLE}` = 'sweep' and tags.`{R.TAG_STORAGE}` = '{self.sweep_path}'")
        if found:
            if found[0].info.status != "RUNNING":  # an interrupted sweep, resumed
                self.client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id
        run = self.client.create_run(self.experiment_id, run_name=Path(self.sweep_path).name, tags={
            R.TAG_ROLE: "sweep", R.TAG_SWEEP: self.sweep, R.TAG_STORAGE: self.sweep_path,
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
        now = getattr(_WRITE, "queued_ms", None) or int(time.time() * 1000)
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


def ui_link(tracking_uri: str, experiment_id: str, run_id: str, ui_url: str = "http://127.0.0.1:5000") -> str:
    """The MLflow UI's page of a sweep's trial runs: the experiment's "Training runs" list filtered to the children
    of parent run `run_id` (MLflow 3 opens an experiment on its GenAI overview, where these runs do not show).
    A tracking server serves its own UI, so an http(s) tracking URI is the link's base; for a local store
    (sqlite) it is `ui_url`, where `mlflow ui --backend-store-uri <tracking_uri>` serves it."""
    import urllib.parse

    base = tracking_uri if tracking_uri.startswith(("http://", "https://")) else ui_url
    search = urllib.parse.quote(f"tags.`{R.TAG_PARENT}` = '{run_id}'", safe="")
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?searchFilter={search}"
