"""The MLflow tracking store a sweep writes to and the analysis reads: its URI, a reachability check that fails in
one line, a client, a new sqlite store made fast from a template, the experiment, and the MLflow UI's link.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable

import pefusion
from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.storage import redact

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


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
    """Fail fast, in one line, when the tracking store is unusable: for a server, that it answers (/health), and
    that it lets this client in (`check_server_access`: the name it is addressed by, the login)."""
    shown = redact(uri)
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as resp:
                if resp.status != 200:
                    raise TrackingError(f"MLflow tracking server {shown} answered HTTP {resp.status} on /health")
        except urllib.error.HTTPError as exc:
            raise TrackingError(f"MLflow tracking server {shown} answered HTTP {exc.code} on /health") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TrackingError(
                f"MLflow tracking server {shown} is unreachable ({reason}); start it with "
                f"`mlflow server --host 127.0.0.1 --port 5000` or pass --tracking-uri sqlite:///mlflow.db"
            ) from None
        check_server_access(uri, timeout_s)
    elif uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///"):]).parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise TrackingError(f"cannot write the MLflow database in {folder} (tracking URI {uri})")
    elif uri.startswith("file:") or "://" not in uri:
        raise TrackingError(f"tracking URI {uri!r} is a file store, which MLflow >= 3.13 refuses; "
                            f"use sqlite:///mlflow.db or an http:// server")


# MLflow's answer to a request whose Host header is not among the server's --allowed-hosts (its DNS-rebinding guard)
INVALID_HOST = "Invalid Host header"


def check_server_access(uri: str, timeout_s: float = 5.0) -> None:
    """One API call to the server at `uri` as MLflow's client makes it (the Host header its name gives, the login
    of MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN): a TrackingError in one line
    when the server refuses it. `/health` answers whatever the name and the login; the API refuses a Host the
    server does not list in `--allowed-hosts` (403) and, with `--app-name basic-auth`, a missing or wrong login
    (401): a sweep would otherwise start Ray and end on MLflow's text."""
    import base64
    import urllib.parse

    shown = redact(uri)
    request = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if user and password:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    elif token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError as exc:
        body = exc.read(2000).decode("utf-8", "replace")
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        raise TrackingError(f"MLflow tracking server {shown} answered /health but not its API "
                            f"({getattr(exc, 'reason', exc)})") from None
    host = urllib.parse.urlsplit(uri).hostname or ""
    if status == 403 and INVALID_HOST in body:
        raise TrackingError(
            f"MLflow tracking server {shown} refuses requests addressed to {host!r} (HTTP 403: {INVALID_HOST}): "
            f"start it with --allowed-hosts '{host},{host}:*' (the names its clients use), or address it by a "
            f"name it allows")
    if status == 401:
        who = f"user {user!r} with the password in MLFLOW_TRACKING_PASSWORD" if user and password else \
            "no login (MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD are not both set)"
        raise TrackingError(f"MLflow tracking server {shown} refused {who} (HTTP 401): set "
                            f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to an account of that server")
    if status == 403:
        raise TrackingError(f"MLflow tracking server {shown} refused user {user!r} (HTTP 403: "
                            f"{(body.strip().splitlines() or [''])[0][:200]}): ask its admin for access")
    if status >= 400 and status != 404:  # (404: a server without this API path answers the client's own way)
        raise TrackingError(f"MLflow tracking server {shown} answered HTTP {status} "
                            f"({(body.strip().splitlines() or [''])[0][:200]})")


def import_client_in_background() -> None:
    """Import MLflow's client and its SQL store on a daemon thread, now.

    Why: they take about 1.5 s of CPU, which the recorder's writer thread would otherwise spend while Tune starts
    the trial processes (on a 2-core machine, delaying the first trials by about a second). Started before
    `ray.init`, the import overlaps the cluster's start instead. A later import of the same modules waits for
    this one; a failure is the recorder's to report (`SweepRecorder.open_error`), in one line.
    Call after `pefusion.sweep.console.quiet`: MLflow sets up its loggers as it is imported.
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


def new_sqlite_store(uri: str, templates: Path | None = None) -> None:
    """Create the sqlite store of `uri`, if it does not exist, as a copy of an empty store that MLflow created and
    migrated once per MLflow version, kept in the folder `templates` (default: `mlflow` in pefusion's cache).

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

    template = (templates or pefusion.cache_home() / "mlflow") / f"empty-{mlflow.__version__}.db"
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


def ui_link(tracking_uri: str, experiment_id: str, run_id: str, ui_url: str = "http://127.0.0.1:5000") -> str:
    """The MLflow UI's page of a sweep's trial runs: the experiment's "Training runs" list filtered to the children
    of parent run `run_id` (MLflow 3 opens an experiment on its GenAI overview, where these runs do not show).
    A tracking server serves its own UI, so an http(s) tracking URI is the link's base; for a local store
    (sqlite) it is `ui_url`, where `mlflow ui --backend-store-uri <tracking_uri>` serves it."""
    import urllib.parse

    base = tracking_uri if tracking_uri.startswith(("http://", "https://")) else ui_url
    search = urllib.parse.quote(f"tags.`{R.TAG_PARENT}` = '{run_id}'", safe="")
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?searchFilter={search}"
