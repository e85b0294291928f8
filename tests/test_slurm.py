"""deploy/slurm/sweep.sbatch run by a real Slurm: a one-node cluster of Debian's slurm-wlm and munge that
scripts/dev/slurm.sh starts in a temp dir of its own (its own munge key, slurm.conf for this host's name and cores,
free ports) and stops by its own PID files.

The recipe is submitted as a user submits it, `sbatch deploy/slurm/sweep.sbatch`, its sizes overridden on the
sbatch command line (`--nodes=1 --gpus-per-node=0 --cpus-per-task=2`: sbatch's options win over the script's
#SBATCH lines) and its inputs by variables in sbatch's environment (ROOT, VENV, DATA= for the synthetic corpus,
TRACKING, NAME, SWEEP_ARGS: a demo-size CPU sweep, RESUME=1). What one node cannot show (several nodes joining, GPUs
inherited by the srun steps) docs/clusters.md lists.

Marked `system`: it needs Slurm, which .ci/run installs where apt-get can; skipped with its reason elsewhere.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, subprocess_env
from pefusion import record as R
from test_field_conditions import _comparable, _history, _mlflow

pytestmark = [pytest.mark.system, pytest.mark.subprocess_ray]

RECIPE = REPO / "deploy" / "slurm" / "sweep.sbatch"
SIZES = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=2"]
# 4 trials one after another, 8 epochs at most: the job is cancelled after the first ends, with three to go
SWEEP_ARGS = ("--synthetic --smoke --epochs 8 --pe-types sinusoidal,learned --fusions add,concat --seeds 0 "
              "--max-concurrent 1")
JOB_S = 400  # a job's limit here: Ray's start on 2 shared cores and the four trials take about a minute


def _missing() -> str | None:
    for cmd in ("munged", "slurmctld", "slurmd", "sbatch"):
        if shutil.which(cmd) is None:
            return f"no {cmd}: Slurm is not installed (apt-get install slurm-wlm munge; .ci/run does as root)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    return None


@pytest.fixture(scope="module")
def slurm():
    """The one-node Slurm's environment for sbatch/squeue/scancel (SLURM_CONF); stopped after the module."""
    if (why := _missing()) is not None:
        pytest.skip(why)
    # munged wants every folder above its socket searchable by all: not pytest's temp folders (700)
    home = Path(tempfile.mkdtemp(prefix="pfslurm-"))
    script = REPO / "scripts" / "dev" / "slurm.sh"
    up = subprocess.run(["bash", str(script), "up", str(home)], capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == f"export SLURM_CONF={home}/slurm.conf"
        yield subprocess_env(SLURM_CONF=str(home / "slurm.conf"))
    finally:
        down = subprocess.run(["bash", str(script), "down", str(home)], capture_output=True, text=True, timeout=180)
        assert down.returncode == 0, down.stderr
        assert not [p for p in ("munged.pid", "slurmctld.pid", "slurmd.pid") if (home / p).exists()]
        shutil.rmtree(home, ignore_errors=True)


def _submit(env: dict, tmp: Path, name: str, **variables: str) -> int:
    job_env = {**env, "ROOT": str(tmp / "root"), "VENV": sys.prefix, "DATA": "", "NAME": name,
               "RAY_TMP": str(_ray_tmp(env, name)),
               "TRACKING": f"sqlite:///{tmp / name}.db", "SWEEP_ARGS": SWEEP_ARGS, **variables}
    out = subprocess.run(["sbatch", "--parsable", *SIZES, f"--output={tmp}/job-%j.log", str(RECIPE)],
                         cwd=tmp, env=job_env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def _state(env: dict, job: int) -> str:
    out = subprocess.run(["scontrol", "show", "job", str(job)], env=env, capture_output=True, text=True, timeout=30)
    return re.search(r"JobState=(\S+)", out.stdout).group(1)


def _wait_for_end(env: dict, job: int, log: Path, timeout: float = JOB_S) -> str:
    deadline = time.time() + timeout
    while (state := _state(env, job)) in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        if time.time() > deadline:
            subprocess.run(["scancel", str(job)], env=env, timeout=30)
            raise AssertionError(f"job {job} still {state} after {timeout} s:\n" + _tail(log))
        time.sleep(1)
    return state


def _tail(log: Path) -> str:
    return log.read_text()[-5000:] if log.exists() else "(no log)"


def _ray_tmp(env: dict, name: str) -> Path:
    """The Ray session folder of the jobs of sweep `name` (the recipe's RAY_TMP; its default is /tmp/ray-JOBID):
    beside the test's Slurm, short enough for Ray's socket paths, removed with it."""
    return Path(env["SLURM_CONF"]).parent / f"ray-{name}"


def _ray_processes_of(folder: Path) -> list[str]:
    """Processes still running from a job's Ray (its session folder in their command line)."""
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"{folder}/" in text or text.rstrip().endswith(str(folder)):
            left.append(text)
    return left


def test_the_slurm_recipe_runs_a_sweep_and_resumes_it_after_scancel_losing_nothing(slurm, tmp_path):
    started = time.time()
    env = slurm
    # 1. an uninterrupted sweep: the job ends COMPLETED, every trial ok, the dashboard's ssh line printed
    full = _submit(env, tmp_path, "full")
    full_log = tmp_path / f"job-{full}.log"
    assert _wait_for_end(env, full, full_log) == "COMPLETED", _tail(full_log)
    text = full_log.read_text()
    assert "4 trials, 4 ok, 0 failed" in text, _tail(full_log)
    port = 20000 + full % 1276 * 10  # the recipe's ports from the job id
    assert (f"Ray dashboard: on your machine run  ssh -N -L 8265:127.0.0.1:{port + 1} {socket.gethostname()}  "
            "then open http://127.0.0.1:8265") in text, _tail(full_log)
    assert f"Ray dashboard: http://127.0.0.1:{port + 1}" in text  # the sweep joined the head's dashboard
    full_s = time.time() - started

    # 2. the same sweep, cancelled with a plain scancel once its first trial has ended
    cut = _submit(env, tmp_path, "cut")
    cut_log = tmp_path / f"job-{cut}.log"
    deadline = time.time() + JOB_S
    while " 1/4 done " not in (cut_log.read_text() if cut_log.exists() else ""):
        assert _state(env, cut) in ("PENDING", "RUNNING", "CONFIGURING"), "ended before it was cancelled:\n" + \
            _tail(cut_log)
        assert time.time() < deadline, _tail(cut_log)
        time.sleep(0.2)
    subprocess.run(["scancel", str(cut)], env=env, check=True, timeout=30)
    assert _wait_for_end(env, cut, cut_log, timeout=120) == "CANCELLED", _tail(cut_log)
    assert " 4/4 done " not in cut_log.read_text(), "the sweep finished before scancel: nothing was resumed"
    for name in ("full", "cut"):
        assert _ray_tmp(env, name).is_dir()  # the recipe's RAY_TMP was used
        assert _ray_processes_of(_ray_tmp(env, name)) == [], f"the {name} job left Ray processes behind"

    # 3. the recipe's resume: the same NAME with RESUME=1
    resumed = _submit(env, tmp_path, "cut", RESUME="1")
    resumed_log = tmp_path / f"job-{resumed}.log"
    assert _wait_for_end(env, resumed, resumed_log) == "COMPLETED", _tail(resumed_log)
    assert "4 trials, 4 ok, 0 failed" in resumed_log.read_text(), _tail(resumed_log)
    assert _ray_processes_of(_ray_tmp(env, "cut")) == []

    # the resumed sweep equals the uninterrupted one: the CSV (timing aside), and in MLflow one FINISHED parent,
    # one FINISHED ok child per trial with the uninterrupted one's params, final metrics and each epoch once
    out = tmp_path / "root" / "results"
    pd.testing.assert_frame_equal(_comparable(out / "cut_results_by_seed.csv"),
                                  _comparable(out / "full_results_by_seed.csv"))
    from study_names import EPOCH_METRICS, TIMING_METRICS

    want, got = _mlflow(tmp_path / "full.db"), _mlflow(tmp_path / "cut.db")
    assert got["parent"].info.status == "FINISHED" and set(got["children"]) == set(want["children"])
    assert len(got["children"]) == 4
    for key, ref in want["children"].items():
        run = got["children"][key]
        assert run.info.status == "FINISHED" and run.data.tags[R.TAG_STATUS] == R.STATUS_OK, key
        assert run.data.params == ref.data.params, key
        drop = lambda m: {k: v for k, v in m.items() if k not in TIMING_METRICS}  # noqa: E731
        assert drop(run.data.metrics) == drop(ref.data.metrics), key
        for metric in EPOCH_METRICS:
            assert _history(got["client"], run, metric) == _history(want["client"], ref, metric), (key, metric)
    print(f"Slurm: uninterrupted job {full_s:.0f} s; whole test {time.time() - started:.0f} s")
