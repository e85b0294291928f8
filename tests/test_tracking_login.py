"""The tracking server as a lab deploys it: `mlflow server --app-name basic-auth` (its admin password from the
environment, never a default) with `--allowed-hosts` for the name its clients use, on 127.0.0.1. The clients
address it by that name (`mlflow.lab`, resolved to 127.0.0.1 inside this process only: no /etc/hosts, the Host
header is the name's), and log in through MLflow's own MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD. A sweep
and its report go through it; a wrong or missing login, and a name the server does not allow, end the command in
one line before Ray starts."""
from __future__ import annotations

import dataclasses
import secrets
import socket

import pytest

from conftest import free_port, start_mlflow_server, stop_process_group
from pefusion import record as R

# Each test starts a server of its own (seconds on 2 cores): CI runs them in its second stage (.ci/run).
pytestmark = pytest.mark.system

ADMIN, PASSWORD = "admin", "a-s3cret-from-the-lab"
NAMES = ("mlflow.lab", "other.lab")  # what the clients call 127.0.0.1 here
# The flags of the server, as a recipe starts it (the name its clients use, with any port).
ALLOWED = ["--allowed-hosts", "mlflow.lab,mlflow.lab:*"]


@pytest.fixture
def lab_names(monkeypatch):
    """`mlflow.lab` and `other.lab` resolve to 127.0.0.1 in this process (what a lab's DNS does for its clients)."""
    resolve = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        return resolve("127.0.0.1" if host in NAMES else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def login_server(tmp_path, lab_names):
    """`mlflow server --app-name basic-auth --allowed-hosts mlflow.lab,mlflow.lab:*` on a free port; yields its
    port."""
    port = free_port()
    config = tmp_path / "basic_auth.ini"
    config.write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{tmp_path / 'auth.db'}\n"
                      f"admin_username = {ADMIN}\nauthorization_function = "
                      f"mlflow.server.auth:authenticate_request_basic_auth\n")
    server = start_mlflow_server(port, tmp_path, args=["--app-name", "basic-auth", *ALLOWED],
                                 MLFLOW_AUTH_CONFIG_PATH=str(config), MLFLOW_AUTH_ADMIN_PASSWORD=PASSWORD,
                                 # the auth app's CSRF key (it refuses to start without one): a secret too
                                 MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(16))
    try:
        yield port
    finally:
        stop_process_group(server, port)


def _refused(monkeypatch, capsys, argv: list[str]) -> str:
    """Run the grid command in-process; it must exit 2 with one line on stderr, Ray never started."""
    import pefusion.sweep.driver
    from pefusion.cli.commands import grid_main
    from pefusion.cli.flags import run_main

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(pefusion.sweep.driver, "start_cluster", no_ray)
    with pytest.raises(SystemExit) as exit_:
        run_main(grid_main, argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _grid_args(in_tmp, cache_dir, uri: str) -> list[str]:
    return ["--preset", "arxiv", "--synthetic", "--smoke", "--epochs", "1", "--pe-types", "sinusoidal",
            "--fusions", "add", "--seeds", "0", "--no-dashboard", "--tracking-uri", uri, "--cache-dir",
            str(cache_dir), "-q"]


def test_a_wrong_or_missing_login_ends_the_sweep_in_one_line_before_ray_starts(login_server, in_tmp, cache_dir,
                                                                              monkeypatch, capsys):
    uri = f"http://mlflow.lab:{login_server}"
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    line = _refused(monkeypatch, capsys, _grid_args(in_tmp, cache_dir, uri))
    assert line == (f"error: MLflow tracking server {uri} refused user 'admin' with the password in "
                    f"MLFLOW_TRACKING_PASSWORD (HTTP 401): set MLFLOW_TRACKING_USERNAME and "
                    f"MLFLOW_TRACKING_PASSWORD to an account of that server"), line
    print(line)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    line = _refused(monkeypatch, capsys, _grid_args(in_tmp, cache_dir, uri))
    assert "refused no login (MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD are not both set)" in line
    # the right login, but a name the server's --allowed-hosts leaves out
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    line = _refused(monkeypatch, capsys, _grid_args(in_tmp, cache_dir, f"http://other.lab:{login_server}"))
    assert "refuses requests addressed to 'other.lab' (HTTP 403: Invalid Host header)" in line
    assert "--allowed-hosts 'other.lab,other.lab:*'" in line


def test_a_server_started_without_allowed_hosts_is_refused_by_name_in_one_line(tmp_path, lab_names, in_tmp,
                                                                               cache_dir, monkeypatch, capsys):
    """`mlflow server --host 127.0.0.1` as the docs once started it (no --allowed-hosts): `/health` answers by any
    name, the API only by the loopback names; a client using the lab's name is refused before Ray starts, the line
    naming the flag to add."""
    port = free_port()
    server = start_mlflow_server(port, tmp_path)
    try:
        uri = f"http://mlflow.lab:{port}"
        line = _refused(monkeypatch, capsys, _grid_args(in_tmp, cache_dir, uri))
        assert line == (f"error: MLflow tracking server {uri} refuses requests addressed to 'mlflow.lab' (HTTP 403: "
                        f"Invalid Host header): start it with --allowed-hosts 'mlflow.lab,mlflow.lab:*' (the names "
                        f"its clients use), or address it by a name it allows"), line
        print(line)
    finally:
        stop_process_group(server, port)


def test_a_sweep_and_its_report_go_through_the_login_by_the_servers_name(login_server, local_ray, in_tmp,
                                                                          smoke_preset, smoke_corpus, monkeypatch):
    """The tiniest sweep (one trial, one epoch) recorded through the authenticated server addressed as
    `mlflow.lab`, its parent FINISHED; the report reads it and logs to it through the same login."""
    from mlflow.tracking import MlflowClient

    from pefusion.cli.commands import report_main
    from pefusion.fusion.trainable import pefusion_trainable
    from test_field_conditions import _grid, _options, _sweep

    uri = f"http://mlflow.lab:{login_server}"
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    preset = dataclasses.replace(smoke_preset, train=dataclasses.replace(smoke_preset.train, max_epochs=1))
    result = _sweep(smoke_corpus, preset, _grid(seed=[0]), _options(in_tmp, tracking_uri=uri), pefusion_trainable)
    assert list(result.rows[R.STATUS]) == [R.STATUS_OK]

    client = MlflowClient(uri)
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    children = client.search_runs([parent.info.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent.info.run_id}'")
    assert [c.info.status for c in children] == ["FINISHED"]
    assert client.list_artifacts(children[0].info.run_id)  # the best checkpoint, through the server

    assert report_main(["--tracking-uri", uri, "--out", str(in_tmp / "report")]) == 0
    assert client.list_artifacts(result.parent_run_id)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    with pytest.raises(Exception, match="HTTP 401"):  # the report's pre-flight too
        report_main(["--tracking-uri", uri, "--out", str(in_tmp / "report2")])
