"""What a sweep's console holds: the sweep's own lines (progress, one-line errors, the final table), not Ray's
and MLflow's. Their messages go to `driver.log` in the experiment's folder instead, named on the console when
the sweep starts; `-v` leaves them on the console, as Ray and MLflow print them.

Why a file and not a lower log level: what Ray and MLflow say (the token-authentication notice, the "Failed to
fetch metrics" list of trials that had not started when a sweep was interrupted, MLflow creating its tables in a
new store) is nothing a user acts on during a sweep, but it is what one reads when a sweep goes wrong. An ERROR
from them still reaches the console, in one line that names the file with the rest.

The redirection lasts until the driver exits (Ray's shutdown at exit writes to the file too) or the next sweep
of the same process redirects to its own file; `restore` puts the console back earlier.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
from pathlib import Path

from pefusion.storage import path_name

LOG_FILE = "driver.log"
# Loggers whose messages leave the console. Ray's and MLflow's roots hold their console handlers (and stop
# propagation); MLflow gives alembic, sqlalchemy.engine and huey handlers of their own; urllib3 speaks for
# MLflow's HTTP client (retries while a tracking server is away); optuna's holds its console handler (Ray's
# Optuna searches: "A new study created in memory"); py.warnings holds every `warnings.warn`.
LOGGERS = ("ray", "mlflow", "alembic", "sqlalchemy.engine", "huey", "urllib3", "optuna", "py.warnings")
_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
# MLflow's switch for the console handlers it puts on its loggers when imported (which would undo a redirection).
MLFLOW_CONFIGURE = "MLFLOW_CONFIGURE_LOGGING"


class _LogFile(logging.FileHandler):
    """The log file, in one format: `ray.init` re-formats every handler of the `ray` logger with its own."""

    def format(self, record: logging.LogRecord) -> str:
        return _FORMAT.format(record)


class _OneLineErrors(logging.Handler):
    """An ERROR of Ray or MLflow, on the console in one line (its first) that names the file with the rest."""

    def __init__(self, log_path: str) -> None:
        super().__init__(logging.ERROR)
        self.log_path = log_path

    def emit(self, record: logging.LogRecord) -> None:
        who = "Ray" if record.name.startswith("ray") else "MLflow"
        first = (record.getMessage().strip().splitlines() or [""])[0]
        print(f"{who}: {first}  (more in {self.log_path})", file=sys.stderr, flush=True)  # stderr as it is now


class _Redirect:
    """One redirection: the loggers' handlers and propagation as they were, to put back."""

    def __init__(self, path: Path, experiment_folder: bool = True) -> None:
        self.path = path
        self.experiment_folder = experiment_folder  # the log lies in the experiment's own folder (local storage)
        self.file = _LogFile(path, mode="a", encoding="utf-8")
        self.errors = _OneLineErrors(_shown(path))
        self.saved: dict[str, tuple[list[logging.Handler], bool, int]] = {}
        self.captured_warnings = logging._warnings_showwarning is not None  # captureWarnings was on already
        self.mlflow_configure = os.environ.get(MLFLOW_CONFIGURE)

    def install(self) -> None:
        # MLflow, when imported, puts console handlers on its loggers (undoing this) and its logger at INFO.
        # Imported already: its handlers are replaced below. Not yet: it is asked to leave them, so that its
        # import (about a second) need not be made here but on a thread while Ray starts
        # (`pefusion.tracking.store.import_client_in_background`).
        if "mlflow" not in sys.modules and self.mlflow_configure is None:
            os.environ[MLFLOW_CONFIGURE] = "false"
        for name in _loggers():
            logger = logging.getLogger(name)
            self.saved[name] = (list(logger.handlers), logger.propagate, logger.level)
            kept = [h for h in logger.handlers if _off_the_console(h)]  # e.g. Ray's own session log of ray.data
            logger.handlers = [*kept, self.file, self.errors]
            logger.propagate = False
        if logging.getLogger("mlflow").level == logging.NOTSET:  # MLflow's own level: its notices are kept
            logging.getLogger("mlflow").setLevel(logging.INFO)
        logging.captureWarnings(True)

    def restore(self) -> None:
        for name, (handlers, propagate, level) in self.saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
            logger.setLevel(level)
        if self.mlflow_configure is None:  # an MLflow imported after this configures its loggers as it would
            os.environ.pop(MLFLOW_CONFIGURE, None)
        if not self.captured_warnings:
            logging.captureWarnings(False)
        self.file.close()
        atexit.unregister(self.drop_unused_folder)
        self.drop_unused_folder()

    def drop_unused_folder(self) -> None:
        """A sweep that ended before Tune wrote its state (a request refused once the cluster was joined,
        Ctrl-C while Ray started) leaves no experiment: remove the folder this log made, so that the same --name
        starts again instead of being taken for an experiment to --resume."""
        folder = self.path.parent
        # (for remote storage the folder holds only the log, always: it is kept, the log being the run's record)
        if self.experiment_folder and folder.is_dir() and [p.name for p in folder.iterdir()] == [LOG_FILE]:
            self.path.unlink()
            folder.rmdir()


_ACTIVE: _Redirect | None = None


def quiet(experiment_path: str, verbose: int) -> Path | None:
    """Send Ray's and MLflow's messages to `driver.log` in `experiment_path` (or, for remote storage, in a local
    folder of the experiment's name under ./ray_results) and say so in one line; returns the file.

    `verbose` >= 2 (`-v`) changes nothing. Call before Ray starts, so its start-up notices go to the file.
    """
    restore()
    if verbose >= 2:
        return None
    if os.environ.get(MLFLOW_CONFIGURE, "").lower() in ("true", "1"):  # MLflow was asked to configure its loggers
        import mlflow  # noqa: F401  (then it does so on import: replace its handlers, not be replaced)
    folder = Path(experiment_path) if "://" not in experiment_path else \
        Path("ray_results") / path_name(experiment_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOG_FILE
    global _ACTIVE
    _ACTIVE = _Redirect(path, experiment_folder="://" not in experiment_path)
    _ACTIVE.install()
    atexit.register(_ACTIVE.drop_unused_folder)  # runs after Ray's own shutdown (registered later, run first)
    _no_colour_reset_at_exit()
    print(f"Ray and MLflow messages: {_shown(path)}  (-v shows them here)", flush=True)
    return path


def restore() -> None:
    """Put the console back as it was before `quiet` (nothing to do if it was not redirected)."""
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.restore()
        _ACTIVE = None


def counted(n: int, noun: str) -> str:
    """`n` and `noun` as a line reads them: '1 trial', '4 trials' (a noun whose plural adds s)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _loggers() -> list[str]:
    """LOGGERS, and any logger below them that has a console handler of its own (Ray's `ray.data`)."""
    below = [name for name, logger in logging.root.manager.loggerDict.items()
             if isinstance(logger, logging.Logger) and name.startswith(tuple(f"{n}." for n in LOGGERS))
             and any(not _off_the_console(h) for h in logger.handlers)]
    return [*LOGGERS, *sorted(below)]


def _off_the_console(handler: logging.Handler) -> bool:
    """A handler that writes a file or nowhere (a console handler is a StreamHandler that is not a file's)."""
    return isinstance(handler, (logging.FileHandler, logging.NullHandler)) or \
        not isinstance(handler, logging.StreamHandler)


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (as a user would type it)."""
    path = path.resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _no_colour_reset_at_exit() -> None:
    """Ray's CLI logger runs `colorama.init()` when a cluster starts; colorama then writes a colour reset
    (ESC[0m) to a terminal at exit, a stray line after the sweep's last. The sweep prints no colour to reset."""
    try:
        import colorama.initialise as colorama_init  # Ray's vendored copy once `ray` is imported
    except ImportError:
        return
    atexit.unregister(colorama_init.reset_all)
    colorama_init.atexit_done = True  # a later colorama.init() registers nothing

