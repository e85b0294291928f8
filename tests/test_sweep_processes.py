"""Sweeps driven as a user drives them, in separate processes: a driver killed with SIGKILL then `--resume`,
`--address auto` against a `ray start --head` cluster (of the test's own, on free ports). Tracking on a real
`mlflow server` (its artifacts served by it) is tests/test_tracking_outage.py's sweep."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from conftest import (REPO, S3_CREDENTIALS, free_port, start_mlflow_server, start_ray_head, stop_process_group,
                      stop_process_tree, subprocess_env)
from pefusion import record as R
from study_names import TIMING_COLUMNS

pytestmark = pytest.mark.subprocess_ray

GRID = ["--preset", "arxiv", "--synthetic", "--smoke", "--epochs", "3", "--pe-types", "sinusoidal",
        "--fusions", "add,concat,gate_scalar", "--seeds", "0,1", "--max-concurrent", "1", "--num-cpus", "2",
        "--no-dashboard"]


def _sweep(cwd: Path, *args: str, tracking: str, cache_dir: Path, wait: bool = True, timeout: float = 600,
           env: dict[str, str] | None = None):
    cmd = [sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), *args, "--tracking-uri", tracking,
           "--cache-dir", str(cache_dir)]
    env = env or subprocess_env()
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _finished_trials(db: Path) -> set[str]:
    """Trial ids whose MLflow child run has its final status tag (read straight from the sqlite file)."""
    if not db.exists():
        return set()
    try:
        with sqlite3.connect(db, timeout=1) as con:
            rows = con.execute("SELECT t2.value FROM tags t1 JOIN tags t2 ON t1.run_uuid = t2.run_uuid "
                               "WHERE t1.key = ? AND t2.key = ?", (R.TAG_STATUS, R.TAG_TRIAL_ID)).fetchall()
    except sqlite3.OperationalError:  # tables not created yet
        return set()
    return {r[0] for r in rows}


def _comparable(csv: Path) -> pd.DataFrame:
    df = pd.read_csv(csv)
    return df.drop(columns=[c for c in TIMING_COLUMNS if c in df]).reset_index(drop=True)


def test_sigkill_then_resume_finishes_without_rerunning_or_duplicating(tmp_path, cache_dir):
    full_db, killed_db = tmp_path / "full.db", tmp_path / "killed.db"
    _sweep(tmp_path, *GRID, "--name", "full", tracking=f"sqlite:///{full_db}", cache_dir=cache_dir)

    driver = _sweep(tmp_path, *GRID, "--name", "killed", tracking=f"sqlite:///{killed_db}", cache_dir=cache_dir,
                    wait=False)
    deadline = time.time() + 300
    while len(_finished_trials(killed_db)) < 2:
        assert driver.poll() is None, "the sweep ended before it could be killed"
        assert time.time() < deadline, "no trial finished in time"
        time.sleep(0.2)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    finished_before_kill = _finished_trials(killed_db)
    assert 2 <= len(finished_before_kill) < 6

    _sweep(tmp_path, *GRID, "--name", "killed", "--resume", tracking=f"sqlite:///{killed_db}", cache_dir=cache_dir)

    # (on CPU) the same results as the uninterrupted sweep, timing columns aside
    pd.testing.assert_frame_equal(_comparable(tmp_path / "results" / "killed_results_by_seed.csv"),
                                  _comparable(tmp_path / "results" / "full_results_by_seed.csv"))
    # no trial that had finished ran again: its reports are its 3 epochs and its final record, once
    # (a restore that races the kill may re-report the saved final record: same record, no training).
    # A trial started after Tune's last state snapshot is re-created on resume under the same trial id in a new
    # directory (Ray's behaviour); the old directory keeps what that attempt reported before the kill, never a
    # final record.
    completed: dict[str, list[int]] = {}
    for trial_dir in (tmp_path / "ray_results" / "killed").glob("pefusion_trainable_*"):
        path = trial_dir / "result.json"
        reports = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if not any(R.STATUS in r for r in reports):  # an attempt cut short by the kill
            assert not any(r["trial_id"] in finished_before_kill for r in reports), trial_dir.name
            continue
        epochs, trial_id = [r.get(R.EPOCH) for r in reports], reports[-1]["trial_id"]
        assert trial_id not in completed, f"{trial_id} completed twice"
        completed[trial_id] = epochs
        if trial_id in finished_before_kill:
            assert epochs[:4] == [1, 2, 3, 3], (trial_id, epochs)
            assert all(r["started_at"] == reports[3]["started_at"] and r[R.TEST_ACC] == reports[3][R.TEST_ACC]
                       for r in reports[4:]), (trial_id, epochs)
        else:  # resumed or started after the kill: every epoch reported at most twice (a replayed epoch)
            assert max(epochs.count(e) for e in set(epochs)) <= 2, (trial_id, epochs)
    assert len(completed) == 6, completed
    # one MLflow child run per trial, each epoch logged once
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{killed_db}")
    exp = client.get_experiment_by_name("pe-fusion")
    parents = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
    assert len(parents) == 1
    children = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parents[0].info.run_id}'")
    assert len(children) == 6 and len({c.data.tags[R.TAG_TRIAL_ID] for c in children}) == 6
    for child in children:
        assert child.info.status == "FINISHED"
        # each epoch once, and the final (restored best) val_acc once at epochs_run + 1, even when its finish
        # was cut by the kill and redone on resume
        steps = [m.step for m in client.get_metric_history(child.info.run_id, R.VAL_ACC)]
        assert steps == sorted(set(steps)) == list(range(1, int(child.data.metrics[R.EPOCHS_RUN]) + 2))
        assert child.data.metrics[R.VAL_ACC] == child.data.metrics[R.BEST_VAL_ACC]


@pytest.fixture
def head_node():
    """`ray start --head` as docs/operations.md's cluster section has it, kept off anything else on the machine: free
    ports (6379, 10001 and 52365 may be a user's cluster), a temp dir of its own, token authentication set
    explicitly for the head and for the sweep (as on every node of a real cluster; the token is the session's).

    Torn down by stopping exactly what it started, never `ray stop`, which kills every Ray process on the machine,
    a user's cluster included: `ray start --block` shuts its node down on SIGTERM; anything of its process tree
    still alive after that is killed by PID. A stand-in for a user's Ray process (a command line `ray stop` would
    match) must survive the whole test."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "default_worker.py"])
    temp_dir = Path(tempfile.mkdtemp(prefix="pfray-"))  # short: Ray's socket paths must fit in 107 bytes
    port = free_port()
    env = subprocess_env(RAY_AUTH_MODE="token")
    head = start_ray_head(temp_dir, port, env, "--include-dashboard=false")
    try:
        yield SimpleNamespace(env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}, temp_dir=temp_dir)
    finally:
        stop_process_tree(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
        bystander_alive = bystander.poll() is None
        bystander.kill()
        bystander.wait()
        assert bystander_alive, "the teardown killed a Ray process it did not start"


def test_address_auto_joins_a_running_cluster(tmp_path, cache_dir, head_node):
    """`--address auto` on the head node, with RAY_ADDRESS naming this test's head: `auto` alone could find a
    user's cluster. The driver's log in the head's temp dir shows the sweep ran on this cluster."""
    db = tmp_path / "mlflow.db"
    proc = _sweep(tmp_path, "--preset", "arxiv", "--synthetic", "--smoke", "--pe-types", "rope", "--fusions",
                  "gate_scalar", "--seeds", "0", "--address", "auto", "--name", "cluster",
                  tracking=f"sqlite:///{db}", cache_dir=cache_dir, env=head_node.env)
    assert list(head_node.temp_dir.glob("session_*/logs/python-core-driver-*.log")), "the sweep ran elsewhere"
    assert "1 trial, 1 ok, 0 failed" in proc.stdout
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("pe-fusion")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
    assert parent.data.tags[R.TAG_RAY_ADDRESS] == "auto"


# --- object storage: S3 at an endpoint of its own (moto's server on 127.0.0.1) ------------------------------

# 2 trials of 8 epochs one after another (2, not 4: CI runs this in its second stage; every check needs only a
# first trial killed and finished and a second one interrupted): a trial is killed after its 3rd epoch and, with
# the endpoint in the URI, the sweep is interrupted once the first trial has ended.
S3_GRID = ["--preset", "arxiv", "--synthetic", "--smoke", "--epochs", "8", "--pe-types", "sinusoidal",
           "--fusions", "add,concat", "--seeds", "0", "--max-concurrent", "1", "--num-cpus", "2", "--no-dashboard"]
S3_URI = "s3://sweeps/ray?endpoint_override={endpoint}&scheme=http"
# The two sweeps over the bucket, as docs/clusters.md names them ({endpoint}: the server's HOST:PORT, {db}: the
# sqlite file; `env` runs with AWS_ENDPOINT_URL=http://{endpoint}); the test adds --cache-dir (and -q to `env`).
S3_SWEEPS = {"env": [*S3_GRID, "--name", "env", "--storage-path", "s3://sweeps/ray", "--tracking-uri", "sqlite:///{db}"],
             "cut": [*S3_GRID, "--name", "cut", "--storage-path", S3_URI, "--tracking-uri", "sqlite:///{db}"]}


def _kill_a_trial_after_its_third_epoch(ray_tmp: Path, killed: dict, deadline_s: float = 240) -> threading.Thread:
    """A thread that SIGKILLs the process of the first trial to report its 3rd epoch (read from the driver's staging
    copy of its result.json under the sweep's own RAY_TMPDIR), noting its pid, epoch and trial id in `killed`."""
    def watch() -> None:
        deadline = time.time() + deadline_s
        while time.time() < deadline:
            for result_file in ray_tmp.rglob("driver_artifacts/pefusion_trainable_*/result.json"):
                reports = []
                for line in result_file.read_text().splitlines():
                    try:
                        reports.append(json.loads(line))
                    except json.JSONDecodeError:  # a line being written
                        pass
                if len(reports) >= 3 and R.STATUS not in reports[-1]:
                    killed.update(pid=reports[-1]["pid"], epoch=reports[-1][R.EPOCH], trial_id=reports[-1]["trial_id"])
                    os.kill(killed["pid"], signal.SIGKILL)
                    return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _bucket_reports(endpoint: str, experiment: str, trial_id: str) -> list[dict]:
    """The reports of trial `trial_id` as Ray stored them in the bucket (its result.json there)."""
    from pyarrow import fs

    store = fs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1", scheme="http",
                            endpoint_override=endpoint)
    for info in store.get_file_info(fs.FileSelector(f"sweeps/ray/{experiment}")):
        if info.base_name.startswith("pefusion_trainable_") and trial_id in info.base_name:
            with store.open_input_stream(f"{info.path}/result.json") as f:
                return [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]
    raise AssertionError(f"no folder of trial {trial_id} in the bucket")


def _restored_from_its_checkpoint(reports: list[dict], killed: dict) -> None:
    """The killed trial went on in a new process from its last epoch checkpoint (not from epoch 1) to its end."""
    after = [r for r in reports if r["pid"] != killed["pid"]]
    assert after, "no report from a new process: the trial was not restarted"
    assert 1 < after[0][R.EPOCH] <= killed["epoch"] + 1, (killed, [(r["pid"], r.get(R.EPOCH)) for r in reports])
    assert after[-1][R.STATUS] == R.STATUS_OK


@pytest.mark.slow
@pytest.mark.system  # CI runs it in its second stage (.ci/run), with the Slurm test
def test_s3_at_its_own_endpoint_survives_a_killed_trial_and_ctrl_c_then_the_printed_resume(tmp_path, cache_dir,
                                                                                             s3_server):
    """Checkpoints in an S3-compatible store, its endpoint given in the environment (AWS_ENDPOINT_URL) or in the
    storage URI's query (`s3://sweeps/ray?endpoint_override=HOST:PORT&scheme=http`, the form pyarrow and Ray read).
    Either way a trial whose process is killed after its 3rd epoch goes on from its checkpoint in the bucket; with
    the endpoint in the URI, Ctrl-C prints a --resume command whose storage URI is the one typed (its query kept),
    and that command, run as printed, ends with the CSV and MLflow of an uninterrupted sweep on local storage (the
    same numbers on CPU, timing aside), every run FINISHED."""
    from test_field_conditions import INTERRUPTED_LINE, _history, _mlflow
    from study_names import EPOCH_METRICS, TIMING_METRICS

    endpoint = s3_server
    uri = S3_URI.format(endpoint=endpoint)
    script = [sys.executable, str(REPO / "sweeps" / "arxiv_grid.py")]

    def args(name: str) -> list[str]:
        return [a.format(endpoint=endpoint, db=tmp_path / f"{name}.db") for a in S3_SWEEPS[name]] + \
            ["--cache-dir", str(cache_dir)]

    ray_tmp = Path(tempfile.mkdtemp(prefix="pfs3-"))  # the drivers' Ray sessions, watched for a trial's epochs
    try:
        reference = subprocess.run([*script, *S3_GRID, "--name", "local", "-q", "--tracking-uri",
                                    f"sqlite:///{tmp_path}/local.db", "--cache-dir", str(cache_dir)],
                                   cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=600)
        assert reference.returncode == 0, reference.stderr[-3000:]

        # the endpoint in the environment: a trial's process killed mid-run
        env_env = subprocess_env(**S3_CREDENTIALS, AWS_ENDPOINT_URL=f"http://{endpoint}", RAY_TMPDIR=str(ray_tmp / "e"))
        killed_env: dict = {}
        killer = _kill_a_trial_after_its_third_epoch(ray_tmp / "e", killed_env)
        by_env = subprocess.run([*script, *args("env"), "-q"], cwd=tmp_path, env=env_env, capture_output=True,
                                text=True, timeout=600)
        killer.join(timeout=5)
        assert by_env.returncode == 0, by_env.stderr[-3000:]
        assert killed_env, "the trial finished before it could be killed"
        _restored_from_its_checkpoint(_bucket_reports(endpoint, "env", killed_env["trial_id"]), killed_env)

        # the endpoint in the URI: a trial's process killed, then Ctrl-C once the first trial has ended
        uri_env = subprocess_env(**S3_CREDENTIALS, AWS_ENDPOINT_URL=None, RAY_TMPDIR=str(ray_tmp / "u"))
        killed: dict = {}
        killer = _kill_a_trial_after_its_third_epoch(ray_tmp / "u", killed)
        driver = subprocess.Popen([*script, *args("cut")], cwd=tmp_path, env=uri_env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        for line in driver.stdout:
            if " 1/2 done " in line:
                break
        else:
            raise AssertionError("the sweep ended before its first trial did:\n" + driver.stderr.read()[-3000:])
        killer.join(timeout=5)
        assert killed, "the first trial finished before it could be killed"
        time.sleep(1.5)  # the next trial is training
        driver.send_signal(signal.SIGINT)
        out, err = driver.communicate(timeout=120)
        assert driver.returncode == 130, err[-3000:]
        match = INTERRUPTED_LINE.match([ln for ln in err.splitlines() if ln.strip()][-1])
        assert match, err[-3000:]
        command = shlex.split(match.group(5))
        assert command[command.index("--storage-path") + 1] == uri  # the query kept, the name not appended to it
        assert _mlflow(tmp_path / "cut.db")["parent"].info.status == "KILLED"

        resumed = subprocess.run(match.group(5), shell=True, cwd=tmp_path, env=uri_env, capture_output=True,
                                 text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"Ray experiment: s3://sweeps/ray/cut?endpoint_override={endpoint}&scheme=http" in resumed.stdout
        _restored_from_its_checkpoint(_bucket_reports(endpoint, "cut", killed["trial_id"]), killed)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

    want_csv = _comparable(tmp_path / "results" / "local_results_by_seed.csv")
    ref = _mlflow(tmp_path / "local.db")
    for name in ("env", "cut"):
        pd.testing.assert_frame_equal(_comparable(tmp_path / "results" / f"{name}_results_by_seed.csv"), want_csv)
        got = _mlflow(tmp_path / f"{name}.db")
        assert got["parent"].info.status == "FINISHED" and set(got["children"]) == set(ref["children"])
        for key, want in ref["children"].items():
            run = got["children"][key]
            assert run.info.status == "FINISHED" and run.data.tags[R.TAG_STATUS] == R.STATUS_OK, (name, key)
            assert run.data.params == want.data.params, (name, key)
            drop = lambda m: {k: v for k, v in m.items() if k not in TIMING_METRICS}  # noqa: E731
            assert drop(run.data.metrics) == drop(want.data.metrics), (name, key)
            for metric in EPOCH_METRICS:  # each epoch once, with the uninterrupted sweep's values
                assert _history(got["client"], run, metric) == _history(ref["client"], want, metric), (name, key)


@pytest.mark.slow
def test_an_mlflow_server_keeping_its_artifacts_in_s3_records_a_sweep_its_report_and_a_model(tmp_path, cache_dir,
                                                                                            s3_server):
    """`mlflow server --artifacts-destination s3://sweeps/mlflow` (the server alone reaches the bucket, its endpoint
    in MLFLOW_S3_ENDPOINT_URL): a sweep with its checkpoints in the same bucket records through it, the report
    reads it and logs its page, and a trial's model is exported; every artifact is an object in the bucket."""
    from mlflow.tracking import MlflowClient
    from pyarrow import fs

    endpoint, port = s3_server, free_port()
    server = start_mlflow_server(port, tmp_path, artifacts="s3://sweeps/mlflow", **S3_CREDENTIALS,
                                 MLFLOW_S3_ENDPOINT_URL=f"http://{endpoint}")
    try:
        uri = f"http://127.0.0.1:{port}"
        env = subprocess_env(**S3_CREDENTIALS, AWS_ENDPOINT_URL=None, MLFLOW_S3_ENDPOINT_URL=None)

        def run(*cmd: str) -> subprocess.CompletedProcess:
            proc = subprocess.run([sys.executable, *cmd], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=600)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            return proc

        run(str(REPO / "sweeps" / "arxiv_grid.py"), "--preset", "arxiv", "--synthetic", "--smoke", "--pe-types",
            "sinusoidal", "--fusions", "add", "--seeds", "0", "--num-cpus", "2", "--no-dashboard", "-q", "--name",
            "served", "--storage-path", f"s3://sweeps/ray?endpoint_override={endpoint}&scheme=http",
            "--tracking-uri", uri, "--cache-dir", str(cache_dir))
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("pe-fusion")
        (parent,) = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
        (child,) = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent.info.run_id}'")
        assert parent.info.status == child.info.status == "FINISHED"
        run(str(REPO / "scripts" / "report.py"), "--tracking-uri", uri, "--out", str(tmp_path / "report"))
        run(str(REPO / "scripts" / "export_model.py"), "--run", child.info.run_id, "--tracking-uri", uri)
    finally:
        stop_process_group(server, port)

    store = fs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1", scheme="http",
                            endpoint_override=endpoint)
    keys = [i.path for i in store.get_file_info(fs.FileSelector("sweeps/mlflow", recursive=True)) if i.is_file]
    run_folder = f"sweeps/mlflow/{exp.experiment_id}/{child.info.run_id}/artifacts/"
    assert f"{run_folder}{R.ARTIFACT_CHECKPOINT_DIR}/model.pt" in keys, keys
    assert any(k.startswith(f"sweeps/mlflow/{exp.experiment_id}/{parent.info.run_id}/") and k.endswith(".html")
               for k in keys), keys
    assert any(k.endswith("/MLmodel") for k in keys), keys  # the exported model
    assert not (tmp_path / "artifacts").exists()  # nothing kept on the server's disk
