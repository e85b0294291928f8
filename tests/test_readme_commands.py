"""The README's quick start as a user types it, in its own process and an empty folder: no `--no-dashboard`, no
`--tracking-uri`, no MLFLOW_TRACKING_URI (shrunk to one trial by `--smoke` and the narrowing flags). The Ray
dashboard it prints is asked while the sweep runs; the MLflow store is where the README says."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import REPO, subprocess_env
from pefusion import record as R

pytestmark = pytest.mark.subprocess_ray

DEFAULT_DASHBOARD_PORT = 8265
QUICK_START = ["--preset", "demo", "--smoke", "--pe-types", "sinusoidal", "--fusions", "add", "--seeds", "0"]


def _http_get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _ask_dashboard(line: str, driver_pid: int) -> dict:
    """What the dashboard printed on `line` answers, and which sockets listen on its port (and whose they are)."""
    import ray  # noqa: F401  (Ray ships psutil and puts it on the path)
    import psutil

    url = line.split()[2]
    port = urllib.parse.urlsplit(url).port
    ours = {p.pid for p in psutil.Process(driver_pid).children(recursive=True)}
    listeners = [(c.laddr.ip, c.pid in ours) for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    seen = {"url": url, "listeners": listeners, "without_token": None, "with_token": None}
    if any(is_ours for _, is_ours in listeners):  # never ask someone else's server (nor wait on one)
        token = Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
        seen.update(without_token=_http_get(url + "/api/version"), with_token=_http_get(url + "/api/version", token))
    return seen


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory):
    """`python sweeps/arxiv_grid.py --preset demo` (one trial of it) in an empty folder, with Ray's default
    authentication mode. When it prints the dashboard line, the driver is paused (SIGSTOP: the sweep is certainly
    still running) while the dashboard is asked."""
    cwd = tmp_path_factory.mktemp("quick_start")
    stderr = (cwd.parent / "quick_start.stderr").open("w")
    # A user's dashboard on Ray's default port: held here unless someone already holds it.
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", DEFAULT_DASHBOARD_PORT))
        holder.listen()
    except OSError:
        pass
    driver = subprocess.Popen([sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), *QUICK_START], cwd=cwd,
                              env=subprocess_env(MLFLOW_TRACKING_URI=None, RAY_AUTH_MODE=None), stdout=subprocess.PIPE,
                              stderr=stderr, text=True)
    watchdog = threading.Timer(600, driver.kill)
    watchdog.start()
    lines, dashboard = [], None
    try:
        for line in driver.stdout:
            lines.append(line)
            if line.startswith("Ray dashboard:") and dashboard is None:
                os.kill(driver.pid, signal.SIGSTOP)
                try:
                    dashboard = _ask_dashboard(line, driver.pid)
                finally:
                    os.kill(driver.pid, signal.SIGCONT)
        driver.wait()
    finally:
        watchdog.cancel()
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        stderr.close()
        holder.close()
    out = "".join(lines)
    assert driver.returncode == 0, out[-3000:] + (cwd.parent / "quick_start.stderr").read_text()[-3000:]
    assert "1 trial, 1 ok, 0 failed" in out
    return SimpleNamespace(cwd=cwd.resolve(), out=out, dashboard=dashboard)


def test_dashboard_is_served_on_127_0_0_1_and_asks_for_the_token(quick_start):
    """The printed URL is on 127.0.0.1; the port listens there only (not on every interface); the dashboard at it
    is this sweep's own (its process is the driver's descendant, and it accepts the cluster's token, which the
    session keeps outside the user's home); without the token it refuses, as Ray >= 2.59 does on local clusters.
    8265 is held as a user's dashboard would hold it: Ray takes the next free port and the printed URL says which."""
    import ray

    assert quick_start.dashboard is not None, f"no 'Ray dashboard:' line in:\n{quick_start.out}"
    seen = quick_start.dashboard
    url = urllib.parse.urlsplit(seen["url"])
    assert url.hostname == "127.0.0.1" and url.port != DEFAULT_DASHBOARD_PORT, seen["url"]
    ours = [ip for ip, is_ours in seen["listeners"] if is_ours]
    assert ours and set(ours) == {"127.0.0.1"}, seen["listeners"]
    status, body = seen["with_token"]
    assert status == 200 and json.loads(body)["ray_version"] == ray.__version__, (status, body[:300])
    assert seen["without_token"][0] == 401, seen["without_token"]
    assert "ray get-auth-token" in quick_start.out


def test_default_tracking_uri_is_mlflow_db_in_the_working_directory(quick_start):
    """No --tracking-uri and no MLFLOW_TRACKING_URI: sqlite:///mlflow.db in the folder the command ran in, the
    experiment's artifacts in that folder's mlartifacts as an absolute location (trials run in Ray's own working
    directories), the checkpoint and result CSVs there."""
    from mlflow.tracking import MlflowClient

    cwd = quick_start.cwd
    db = cwd / "mlflow.db"
    assert f"MLflow: sqlite:///{db}  experiment 'pe-fusion'" in quick_start.out
    assert db.is_file() and not (cwd / "mlruns").exists() and [p.name for p in cwd.glob("*.db")] == ["mlflow.db"]
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("pe-fusion")
    assert Path(urllib.parse.urlsplit(exp.artifact_location).path) == cwd / "mlartifacts"  # absolute
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
    (child,) = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent.info.run_id}'")
    for run in (parent, child):
        assert Path(urllib.parse.urlsplit(run.info.artifact_uri).path) == cwd / "mlartifacts" / run.info.run_id / \
            "artifacts"
    stored = cwd / "mlartifacts"
    model = stored / child.info.run_id / "artifacts" / R.ARTIFACT_CHECKPOINT_DIR / "model.pt"
    assert "head.weight" in torch.load(model, weights_only=True)
    results = {p.name for p in (stored / parent.info.run_id / "artifacts" / R.ARTIFACT_RESULTS_DIR).iterdir()}
    assert results == {p.name for p in (cwd / "results").iterdir()} and len(results) == 2
