"""The sweep's MLflow writes off Tune's loop: one thread that makes them in order and waits out a store that is away
(`Writer`), and MLflow's own monitor of this machine on a sweep's parent run (`SystemMetrics`).
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from typing import Callable

# Seconds between two samples of the machine on a sweep's parent run (MLflow's
# MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it).
SYSTEM_METRICS_INTERVAL_S = 10.0


# The write the writer thread is making (`Writer`): `queued_ms`, when it was handed to `later`.
WRITE = threading.local()


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


class Writer:
    """One daemon thread that makes queued MLflow writes in order, waiting out an unreachable store.

    Why a thread: MLflow's client retries a dead server for minutes inside the call, and the Tune callbacks run in
    the driver's loop, so every trial would stall behind it. Here the loop only enqueues; an outage costs time
    on this thread, never a write (each is retried, with a back-off up to 30 s, until the store answers).

    A retried write is the whole op again, so every op must leave the same records when redone after any of its
    requests failed: one refused (never reached the server) or one whose answer was lost (the server made it).
    The recorder's writes are made so (`pefusion.tracking.recorder`: `trial_run`, `finish_trial`, `_log_metrics`).
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
            op, WRITE.queued_ms = self._queue.get()
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
