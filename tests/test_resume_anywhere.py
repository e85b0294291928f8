"""The command an interrupted sweep prints is the one the user ran, and works pasted as is in the folder it was run
from, a folder other than the clone, with the script named by a relative path."""
from __future__ import annotations

import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, subprocess_env
from pefusion import record as R

pytestmark = pytest.mark.subprocess_ray

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


def test_the_printed_resume_command_pasted_in_another_folder_completes_the_sweep(tmp_path, cache_dir):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    script = os.path.relpath(REPO / "sweeps" / "arxiv_grid.py", cwd)
    db = cwd / "runs.db"
    args = [*GRID, "--tracking-uri", f"sqlite:///{db}", "--cache-dir", str(cache_dir)]
    with (cwd / "out.txt").open("w") as out, (cwd / "err.txt").open("w") as err:
        driver = subprocess.Popen([sys.executable, script, *args], cwd=cwd, env=subprocess_env(), stdout=out,
                                  stderr=err)
        deadline = time.time() + 300
        while _finished_trials(db) < 1:  # a trial has reported its end: the other one is still to come
            assert driver.poll() is None, (cwd / "err.txt").read_text()[-3000:]
            assert time.time() < deadline, "no trial finished in time"
            time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
        driver.wait(timeout=120)
    stderr = (cwd / "err.txt").read_text()
    assert driver.returncode == 130, stderr[-3000:]
    match = CONTINUE.search([ln for ln in stderr.splitlines() if ln.strip()][-1])
    assert match, stderr[-3000:]
    command = match.group(1)
    interpreter, *typed = shlex.split(command)
    assert typed == [script, *args, "--resume"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("pe-fusion")
    (parent,) = client.search_runs([experiment.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
    assert parent.data.tags[R.TAG_COMMAND] == shlex.join([interpreter, script, *args])

    resumed = subprocess.run(command, shell=True, cwd=cwd, env=subprocess_env(), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = pd.read_csv(cwd / "results" / "cut_results_by_seed.csv")
    assert sorted(rows[R.FUSION]) == ["add", "concat"] and set(rows[R.STATUS]) == {R.STATUS_OK}
