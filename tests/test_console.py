"""A sweep's console holds only the sweep's own lines; Ray's and MLflow's messages go to `driver.log` in the
experiment's folder (`pefusion.sweep.console`). The sweeps run as a user runs them: a separate process on a
terminal (a pty, where Ray's colour codes show), started in a folder of their own."""
from __future__ import annotations

import logging
import os
import pty
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, subprocess_env
from pefusion import record as R

DEMO = ["--preset", "demo", "--pe-types", "sinusoidal", "--fusions", "add,gate_scalar"]

# A row of the final table (its header is the line before the first).
TABLE_ROW = re.compile(r"sinusoidal\s+(add|gate_scalar|concat)\s")
# The sweep's own lines: what the driver and the command print (a sweep's one-line error included).
OURS = [TABLE_ROW, *(re.compile(p) for p in (
    r"--gpus-per-trial auto \(the default\): ",  # where the trials run (a machine without a GPU: the CPU)
    r"\d+ trials? on ",  # what the sweep runs on
    r"plan: ",  # what it will cost (pefusion.sweep.plan)
    r"Ray and MLflow messages: ",
    r"Ray dashboard: http",
    r"MLflow: ",  # where the runs go
    r"MLflow UI: http",  # and where to see them
    r"\[\d\d:\d\d:\d\d\] \d+/\d+ done",  # progress
    r"interrupted: .*continue with: ",
    r"error: ",
    r"\d+ trials?, \d+ ok, \d+ failed",
    r"results: ",
    r"Ray experiment: ",
))]


def foreign_lines(text: str) -> list[str]:
    """The lines of a sweep's console output that are not the sweep's own (empty lines aside)."""
    lines = [line.rstrip("\r") for line in text.split("\n")]
    lines = [line for line in lines if line.strip()]
    ours = [any(p.match(line) for p in OURS) for line in lines]
    first_row = next((i for i, line in enumerate(lines) if TABLE_ROW.match(line)), None)
    if first_row:  # the table's header
        ours[first_row - 1] = True
    return [line for line, mine in zip(lines, ours) if not mine]


def run_on_a_terminal(command: list[str] | str, cwd: Path, interrupt_when=None,
                      timeout: float = 300) -> tuple[int, str]:
    """Run `command` (a line of text runs in a shell, as pasted) with stdout and stderr on a pty; SIGINT it (as
    Ctrl-C does) once `interrupt_when()` holds. Returns the exit code and everything it printed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(command, shell=isinstance(command, str), cwd=cwd, env=subprocess_env(RAY_AUTH_MODE=None),
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: every writer has closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.time() + timeout
    try:
        while interrupt_when is not None and proc.poll() is None:
            assert time.time() < deadline, "nothing to interrupt in time"
            if interrupt_when():
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.2)
        code = proc.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


def _flags(tmp_path: Path, cache_dir: Path, name: str) -> list[str]:
    return ["--name", name, "--out", "out", "--storage-path", "rr", "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}", "--cache-dir", str(cache_dir)]


@pytest.mark.subprocess_ray
def test_demo_grid_console_has_no_line_of_ray_or_mlflow(tmp_path, cache_dir):
    args = [*DEMO, "--seeds", "0", "--epochs", "2", *_flags(tmp_path, cache_dir, "demo")]
    code, out = run_on_a_terminal([sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), *args], tmp_path)
    assert code == 0, out
    assert foreign_lines(out) == [], out
    assert "2 trials, 2 ok, 0 failed" in out and "Ray and MLflow messages: rr/demo/driver.log" in out
    # what left the console is in the log (Ray's token-auth notice; MLflow's table creation happens once per
    # MLflow version, for the template a new store is copied from, and may have happened in an earlier test)
    log = (tmp_path / "rr" / "demo" / "driver.log").read_text()
    assert "Token authentication is enabled" in log


GRID = ["--preset", "demo", "--smoke", "--epochs", "2", "--pe-types", "sinusoidal", "--fusions", "add,concat",
        "--seeds", "0", "--max-concurrent", "1", "--num-cpus", "2", "--no-dashboard", "--name", "cut"]
CONTINUE = re.compile(r"continue with: (.+)$")


def _finished_trials(db: Path) -> int:
    """Runs with a final status tag (only trials get one while the sweep runs), read straight from the sqlite
    file."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=1) as con:
            return con.execute(f"SELECT COUNT(*) FROM tags WHERE key = ? AND value IN "
                               f"({', '.join('?' * len(R.FINAL_STATUSES))})",
                               (R.TAG_STATUS, *R.FINAL_STATUSES)).fetchone()[0]
    except sqlite3.OperationalError:  # tables not created yet
        return 0


@pytest.mark.subprocess_ray
def test_the_printed_resume_command_pasted_in_another_folder_completes_the_sweep_quietly(tmp_path, cache_dir):
    """Run from a folder other than the clone, the script named by a relative path, Ray's storage and the results
    left to their defaults in that folder, and stopped by Ctrl-C once a trial has finished: the command it prints,
    pasted as is in yet another folder (`shell=True`), completes the sweep where it ran, leaves nothing in the
    folder it was pasted in, and neither run prints a line of Ray or MLflow."""
    cwd, another = tmp_path / "elsewhere", tmp_path / "another"
    cwd.mkdir()
    another.mkdir()
    script = os.path.relpath(REPO / "sweeps" / "arxiv_grid.py", cwd)
    db = cwd / "runs.db"
    args = [*GRID, "--tracking-uri", f"sqlite:///{db}", "--cache-dir", str(cache_dir)]
    code, out = run_on_a_terminal([sys.executable, script, *args], cwd, interrupt_when=lambda: _finished_trials(db))
    assert code == 130, out
    assert foreign_lines(out) == [], out
    match = CONTINUE.search([line.rstrip("\r") for line in out.splitlines() if line.strip()][-1])
    assert match, out
    command = match.group(1)
    interpreter, *typed = shlex.split(command)
    # the script and every path absolute; the storage and results folders the working folder gave, named
    portable = [*GRID, "--tracking-uri", f"sqlite:///{db}", "--cache-dir", str(Path(cache_dir).resolve())]
    assert typed == [os.path.normpath(cwd / script), *portable, "--storage-path", str(cwd.resolve() / "ray_results"),
                     "--out", str(cwd.resolve() / "results"), "--resume"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name(R.PEFUSION_EXPERIMENT)
    (parent,) = client.search_runs([experiment.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
    assert parent.data.tags[R.TAG_COMMAND] == shlex.join([interpreter, script, *args])

    code, out = run_on_a_terminal(command, another)
    assert code == 0, out
    assert foreign_lines(out) == [], out
    assert "2 trials, 2 ok, 0 failed" in out
    assert list(another.iterdir()) == []
    rows = pd.read_csv(cwd / "results" / "cut_results_by_seed.csv")
    assert sorted(rows[R.FUSION]) == ["add", "concat"] and set(rows[R.STATUS]) == {R.STATUS_OK}


def test_foreign_lines_are_those_of_ray_mlflow_or_a_terminal_reset():
    """The rule of the tests above, on what main's code printed (a resumed demo grid, on a terminal)."""
    printed = (
        "4 trials on synthetic-spread: 900 train / 1000 validation / 500 test documents, vocabulary 1006\r\n"
        "2026-11-25 01:12:14,003\tWARNING authentication_token_setup.py:85 -- Token authentication is enabled\r\n"
        "MLflow: sqlite:////tmp/m.db  experiment 'pe-fusion', parent run 9b2\r\n"
        "2026/11/25 01:11:47 INFO mlflow.store.db.utils: Creating initial MLflow database tables...\r\n"
        "2026-11-25 01:12:25,601\tWARNING experiment_analysis.py:186 -- Failed to fetch metrics for 1 trial(s):\r\n"
        "- pefusion_trainable_2e504_00003: FileNotFoundError('Could not fetch metrics')\n"
        "[01:12:35] 1/2 done (0 failed), 0 running, 1 pending; 10s elapsed, ~31s left; sinusoidal-add-s0 ok\r\n"
        "        PE      fusion seeds test acc % (ours)\r\n"
        "sinusoidal         add     2      24.80 M-BM-1 1.70\r\n"
        "2 trials, 2 ok, 0 failed\r\n"
        "results: out/x_results_by_seed.csv\r\n"
        "Ray experiment: /tmp/rr/x\r\n"
        "\x1b[0m\r\n")
    assert [line[:25] for line in foreign_lines(printed)] == [
        "2026-11-25 01:12:14,003\tW", "2026/11/25 01:11:47 INFO ", "2026-11-25 01:12:25,601\tW",
        "- pefusion_trainable_2e50", "\x1b[0m"]


def _handlers(name: str) -> list[logging.Handler]:
    """A logger's handlers but pytest's own: pytest >= 9 puts a capture handler on every logger that does not
    propagate, one per test phase, so which of them a logger holds depends on when it stopped propagating."""
    from _pytest.logging import LogCaptureHandler

    return [h for h in logging.getLogger(name).handlers if not isinstance(h, LogCaptureHandler)]


@pytest.fixture
def ray_and_mlflow_loggers(monkeypatch, tmp_path):
    """Ray's and MLflow's loggers as they are once both are imported; put back whatever a test leaves."""
    import mlflow  # noqa: F401
    import ray  # noqa: F401
    from pefusion.sweep import console

    monkeypatch.chdir(tmp_path)
    before = {name: (_handlers(name), logging.getLogger(name).propagate) for name in console.LOGGERS}
    yield console
    console.restore()  # the loggers as they were
    assert before == {name: (_handlers(name), logging.getLogger(name).propagate) for name in console.LOGGERS}


def test_messages_go_to_the_log_and_an_error_shows_in_one_line(ray_and_mlflow_loggers, tmp_path, capfd):
    console = ray_and_mlflow_loggers
    path = console.quiet(str(tmp_path / "rr" / "exp"), verbose=1)
    logging.getLogger("ray.tune.tune").warning("a Ray warning")
    logging.getLogger("mlflow.store.db.utils").info("an MLflow notice")
    logging.getLogger("alembic.runtime.migration").warning("an alembic warning")
    logging.getLogger("optuna.study.study").warning("an Optuna warning")  # Ray's Optuna searches
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a Python warning", UserWarning)
    logging.getLogger("ray.tune").error("Trials did not complete\nTraceback (most recent call last):\n  ...")
    log = path.read_text()
    console.restore()
    out, err = capfd.readouterr()
    assert out == "Ray and MLflow messages: rr/exp/driver.log  (-v shows them here)\n"
    assert err == "Ray: Trials did not complete  (more in rr/exp/driver.log)\n"
    for said in ("a Ray warning", "an MLflow notice", "an alembic warning", "an Optuna warning", "a Python warning",
                 "Trials did not complete\nTraceback (most recent call last):"):
        assert said in log


def test_verbose_leaves_the_console_to_ray_and_mlflow(ray_and_mlflow_loggers, tmp_path, capfd):
    console = ray_and_mlflow_loggers
    before = {name: _handlers(name) for name in console.LOGGERS}
    assert console.quiet(str(tmp_path / "exp"), verbose=2) is None
    assert before == {name: _handlers(name) for name in console.LOGGERS}
    assert capfd.readouterr().out == "" and not (tmp_path / "exp").exists()


QUIET_THEN_MLFLOW = """
import logging, sys
from pefusion.sweep import console
console.quiet("rr/exp", verbose=1)
print("mlflow imported by quiet:", "mlflow" in sys.modules, flush=True)
import mlflow  # as the recorder's writer thread does, once the redirection is in place
logging.getLogger("mlflow.store.db.utils").info("an MLflow notice")
logging.getLogger("mlflow.tracking").warning("an MLflow warning")
print(open("rr/exp/driver.log").read(), end="")  # (read here: a folder Tune never wrote is removed at exit)
"""


def test_mlflow_imported_after_the_redirection_leaves_the_console_alone(tmp_path):
    """`quiet` does not import MLflow (a second of the driver's time before any trial starts): MLflow, imported
    later, must then leave the file in place of its own console handlers."""
    out = subprocess.run([sys.executable, "-c", QUIET_THEN_MLFLOW], cwd=tmp_path, capture_output=True, text=True,
                         env=subprocess_env(MLFLOW_CONFIGURE_LOGGING=None), timeout=120)
    assert out.returncode == 0, out.stderr
    said, log = out.stdout.split("mlflow imported by quiet: ")
    assert said == "Ray and MLflow messages: rr/exp/driver.log  (-v shows them here)\n"
    assert log.startswith("False\n")
    assert "MLflow" not in out.stderr, out.stderr
    assert "INFO mlflow.store.db.utils: an MLflow notice" in log and "an MLflow warning" in log


def test_an_experiment_tune_never_wrote_leaves_no_folder(ray_and_mlflow_loggers, tmp_path):
    console = ray_and_mlflow_loggers
    console.quiet(str(tmp_path / "refused"), verbose=1)
    logging.getLogger("ray").warning("the token-auth notice")
    console.restore()  # the same --name can start again, not taken for an experiment to --resume
    assert not (tmp_path / "refused").exists()
    console.quiet(str(tmp_path / "ran"), verbose=1)
    (tmp_path / "ran" / "experiment_state.json").write_text("{}")
    console.restore()
    assert sorted(p.name for p in (tmp_path / "ran").iterdir()) == ["driver.log", "experiment_state.json"]
