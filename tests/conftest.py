"""Shared fixtures: a tiny synthetic corpus, a smoke-sized preset, a real local Ray, a real sqlite MLflow."""
from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Sequence

import pytest

REPO = Path(__file__).resolve().parent.parent
# Everything the session writes outside a test's tmp_path: caches, the Ray token, a fallback MLflow store.
SESSION_DIR = Path(tempfile.mkdtemp(prefix="pefusion-tests-"))
atexit.register(shutil.rmtree, SESSION_DIR, True)


# Credentials for the test's own S3 server (moto accepts any); no instance metadata lookup when one is missing.
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                  "AWS_EC2_METADATA_DISABLED": "true"}


def _isolate_from_the_users_machine() -> None:
    """Set (not setdefault) what keeps the suite off the network and out of the user's caches and clusters.

    A user's own settings (HF_HUB_OFFLINE=0, a warm ~/.cache/huggingface, MLFLOW_TRACKING_URI of their server, an
    existing or missing ~/.ray/auth_token) must change nothing: tests run offline, on empty temporary caches, with
    a token of their own. Set at import, before any test imports datasets/huggingface_hub (which read these once),
    and inherited by every process a test starts (Ray's workers included).
    """
    env = os.environ
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env[var] = "1"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    hf = SESSION_DIR / "huggingface"
    env["HF_HOME"] = str(hf)
    for var, sub in (("HF_HUB_CACHE", "hub"), ("HUGGINGFACE_HUB_CACHE", "hub"), ("HF_DATASETS_CACHE", "datasets"),
                     ("HF_MODULES_CACHE", "modules"), ("HF_ASSETS_CACHE", "assets"), ("HF_XET_CACHE", "xet")):
        env[var] = str(hf / sub)
    env["PEFUSION_CACHE"] = str(SESSION_DIR / "pefusion_cache")
    # A test that forgets its own store writes here, never to the user's tracking server.
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{SESSION_DIR / 'mlflow.db'}"
    # S3 only at a server a test starts, with its own credentials: never a user's account, profile or endpoint
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL"):
        env.pop(var, None)
    env.update(S3_CREDENTIALS)
    # Ray >= 2.59 turns token authentication on for local clusters and, with no token found, writes one to
    # ~/.ray/auth_token. A token file of the session's own means Ray never writes into the user's home.
    token = SESSION_DIR / "ray_auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env.pop("RAY_AUTH_TOKEN", None)  # it would win over RAY_AUTH_TOKEN_PATH
    env["RAY_AUTH_TOKEN_PATH"] = str(token)
    # Processes the tests start (sweep drivers, `ray start`, Ray's workers) import the repository under test, not
    # another installed copy of pefusion.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])


_isolate_from_the_users_machine()


def subprocess_env(**overrides: str | None) -> dict[str, str]:
    """The session's environment for a process a test starts; an override of None removes the variable."""
    env = dict(os.environ)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def load_script(relpath: str):
    """Import a command-line script (sweeps/*.py, scripts/*.py) as a module, to call its main() in-process."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def start_mlflow_server(port: int, root: Path, store: str | None = None, artifacts: str | None = None,
                        args: Sequence[str] = (), **env: str) -> subprocess.Popen:
    """`mlflow server` on 127.0.0.1:port over `store` (default: sqlite root/srv.db) and `artifacts` (default:
    root/artifacts; an s3:// one reached with `env`'s credentials and MLFLOW_S3_ENDPOINT_URL), with `args` added
    (`--app-name basic-auth`, `--allowed-hosts ...`), in a process group of its own (it starts workers); returns
    once /health answers (it does whatever the Host header and the login)."""
    log = open(root / "server.log", "ab")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", store or f"sqlite:///{root / 'srv.db'}",
         "--artifacts-destination", artifacts or str(root / "artifacts"), "--workers", "1", *args],
        stdout=log, stderr=log, start_new_session=True,
        # its job runner (GenAI scorers: 8 more processes, nothing of tracking) would double its start on 2 CPUs
        env=subprocess_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", **env))
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return server
        except OSError:
            assert server.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.time() < deadline, "mlflow server did not start"
            time.sleep(0.3)


def start_s3_server(port: int, root: Path, bucket: str = "sweeps") -> subprocess.Popen:
    """moto's standalone S3-compatible server on 127.0.0.1:port (its objects in its memory), in a process group of
    its own, with `bucket` created; returns once the bucket exists. Stop it with `stop_process_group`."""
    from pyarrow import fs

    log = open(root / "s3.log", "ab")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=log, start_new_session=True, env=subprocess_env(**S3_CREDENTIALS))
    store = fs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1", scheme="http",
                            endpoint_override=f"127.0.0.1:{port}", allow_bucket_creation=True)
    deadline = time.time() + 60
    while True:
        try:
            store.create_dir(bucket)
            return server
        except OSError:
            assert server.poll() is None, (root / "s3.log").read_text()[-3000:]
            assert time.time() < deadline, "the S3 server did not start"
            time.sleep(0.3)


def stop_process_group(proc: subprocess.Popen, port: int) -> None:
    """SIGTERM to the process group a test started (`start_new_session=True`: a server and its workers); returns
    once every process of it is gone and the port is free."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    proc.wait(timeout=60)
    deadline = time.time() + 60
    while True:
        try:
            os.killpg(proc.pid, 0)  # a worker left behind
        except ProcessLookupError:
            break
        if time.time() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.2)
    with socket.socket() as s:  # nothing answers any more (a refused connection, as for a server that is down)
        assert s.connect_ex(("127.0.0.1", port)) != 0


def stop_process_tree(proc: subprocess.Popen) -> None:
    """SIGTERM to a process the test started (a `ray start --block`, which shuts its node down on it), then SIGKILL to
    whatever of its process tree is still alive after 90 s, each by PID: never `ray stop`, which would end every Ray
    process on the machine."""
    import ray  # noqa: F401  (Ray ships psutil and puts it on the path)
    import psutil

    try:
        started = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        started = []
    proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(started, timeout=90)
    for left in alive:
        left.kill()
    psutil.wait_procs(alive, timeout=30)
    proc.wait(timeout=30)


def start_ray_head(temp_dir: Path, port: int, env: dict[str, str], *flags: str) -> subprocess.Popen:
    """`ray start --head --block` of the Python running the tests (not whichever `ray` is first on PATH) on `port`,
    in `temp_dir` (its log `ray_start.log` there), on free ports for the rest, with `flags` added; returned once it
    says it started. Stop it with `stop_process_tree`, never `ray stop`."""
    beside = Path(sys.executable).with_name("ray")
    log_path = temp_dir / "ray_start.log"
    with log_path.open("w") as log:
        head = subprocess.Popen(
            [str(beside) if beside.exists() else shutil.which("ray"), "start", "--head", "--block", "--port",
             str(port), "--num-cpus", "2", "--disable-usage-stats", "--temp-dir", str(temp_dir),
             "--ray-client-server-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
             "--min-worker-port", "0", "--max-worker-port", "0", *flags],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while "Ray runtime started" not in log_path.read_text():
        if head.poll() is not None or time.time() > deadline:
            stop_process_tree(head)
            pytest.fail("ray start --head did not come up: " + log_path.read_text()[-3000:])
        time.sleep(0.5)
    return head


def help_text(main) -> str:
    """What `main(["--help"])` prints; it must exit 0."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    return out.getvalue()


# --- helpers only tests use ------------------------------------------------------------------------------


def allowed_pairs() -> list[tuple[str, str]]:
    """Every (pe_type, fusion) pair that `check_pe_fusion` accepts."""
    from pefusion.errors import ConfigError
    from pefusion.fusion.config import FUSIONS, PE_TYPES, check_pe_fusion

    pairs = []
    for pe in PE_TYPES:
        for fu in FUSIONS:
            try:
                check_pe_fusion(pe, fu)
            except ConfigError:
                continue
            pairs.append((pe, fu))
    return pairs


def pe_fusion_pairs(space, base=None) -> list[tuple[str, str]]:
    """Every (pe_type, fusion) pair a search space (`pefusion.sweep.space.SearchSpace`) can produce, in order; a
    key it does not set takes `base`'s value (default: ModelConfig(), which every preset shares)."""
    from pefusion import record as R
    from pefusion.fusion.config import ModelConfig

    base = base or ModelConfig()
    pairs = [(p.get(R.PE_TYPE, base.pe_type), p.get(R.FUSION, base.fusion)) for p in space.points()]
    return list(dict.fromkeys(pairs))


def has_grid(space) -> bool:
    """Whether a search space has a grid dimension."""
    from pefusion.sweep.space import Grid

    return any(isinstance(d, Grid) for d in space.values())


def count_tokenisations(monkeypatch) -> list:
    """A list that grows by one each time load_corpus tokenises a corpus (not read from the cache)."""
    import pefusion.data.corpus

    calls, encode_splits = [], pefusion.data.corpus._encode_splits
    monkeypatch.setattr(pefusion.data.corpus, "_encode_splits",
                        lambda *a, **kw: calls.append(1) or encode_splits(*a, **kw))
    return calls


def write_synthetic_corpus(directory: str | Path, n_train: int = 2000, n_val: int = 500, n_test: int = 500,
                           seed: int = 0, num_classes: int = 4) -> dict[str, Path]:  # 4: the corpus default
    """Write train.jsonl, validation.jsonl and test.jsonl of the synthetic corpus into `directory` (the layout
    `--data-dir` reads)."""
    from pefusion.data.synthetic import generate_synthetic_corpus

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, docs in generate_synthetic_corpus(n_train, n_val, n_test, seed, num_classes).items():
        paths[split] = directory / f"{split}.jsonl"
        with open(paths[split], "w", encoding="utf-8") as f:
            f.writelines(json.dumps(d) + "\n" for d in docs)
    return paths


def write_contradicting_corpus(directory: str | Path, n_train: int = 64, n_test: int = 100,
                               seed: int = 0) -> Path:
    """Write train, validation and test JSONL files (the layout `--data-dir` reads) of a two-class corpus on which
    every epoch that learns scores *lower* on validation, by construction.

    The class is one word (`good` or `bad`, among the first 16 words; a third of the documents are longer than
    512 words), so a model learns the rule within a few
    optimiser steps; the validation split is the test split with every label flipped, so a model's validation
    accuracy is exactly 1 − its test accuracy. With `min_delta: 1` no epoch after the first can count as an
    improvement (accuracies lie in [0, 1]): the first epoch is the best and early stopping ends a trial after
    `patience` more, whatever the floating-point path. Those epochs learn the rule (a trial of the smoke model at
    lr 1e-2, one step per epoch, goes from 50-87 % test accuracy at epoch 1 to 95-100 % at epoch 7 for every seed
    tried), so the last epoch's weights score higher on test and lower on validation than the best epoch's: a
    record or checkpoint taken from the last epoch shows. `n_train` of 64 is one batch of the smoke preset.
    """
    import numpy as np

    rng = np.random.default_rng(seed)

    def docs(n: int) -> list[dict]:
        out = []
        for i in range(n):
            words = [f"w{k}" for k in rng.integers(0, 20, 15)] + ["good" if i % 2 else "bad"]
            rng.shuffle(words)
            # every third document runs on past 512 words (a second length bucket; truncation keeps the rule word)
            tail = [f"w{k}" for k in rng.integers(0, 20, 600 if i % 3 == 2 else 0)]
            out.append({"text": " ".join(words + tail), "label": i % 2})
        return out

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    train, test = docs(n_train), docs(n_test)
    flipped = [{**doc, "label": 1 - doc["label"]} for doc in test]
    for split, rows in (("train", train), ("validation", flipped), ("test", test)):
        (directory / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return directory


@pytest.fixture
def s3_server(tmp_path):
    """An S3-compatible server of the test's own with a bucket `sweeps`, stopped by its handle."""
    port = free_port()
    server = start_s3_server(port, tmp_path)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process_group(server, port)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("token_cache")


@pytest.fixture(scope="session")
def contradicting_dir(tmp_path_factory) -> Path:
    """The folder of `write_contradicting_corpus` (what `--data-dir` takes)."""
    return write_contradicting_corpus(tmp_path_factory.mktemp("contradicting"))


@pytest.fixture(scope="session")
def contradicting_corpus(smoke_preset, contradicting_dir):
    """`write_contradicting_corpus` loaded as the smoke preset's data (`--smoke --data-dir DIR`)."""
    from pefusion.data.corpus import load_corpus

    return load_corpus(dataclasses.replace(smoke_preset.data, data_dir=str(contradicting_dir), synthetic=False))


@pytest.fixture(scope="session")
def smoke_preset(cache_dir):
    """The arxiv preset shrunk to seconds per trial, on the synthetic corpus (what `--smoke --synthetic` gives)."""
    from pefusion.fusion.config import smoke_budget
    from pefusion.fusion.config import PRESETS

    base = PRESETS["arxiv"]
    data = dataclasses.replace(base.data, synthetic=True, cache_dir=str(cache_dir))
    return smoke_budget(dataclasses.replace(base, data=data))


@pytest.fixture(scope="session")
def smoke_corpus(smoke_preset):
    from pefusion.data.corpus import load_corpus

    return load_corpus(smoke_preset.data)


# The one local cluster the in-process tests share: started by the first test that asks for `local_ray`, kept for
# the next one (the tests that ask for it run one after another: `pytest_collection_modifyitems`), shut down before
# any test that did not ask for it, so that such a test finds Ray as a user's process does: not running.
_SHARED_RAY = {"up": False}


def _start_shared_ray() -> None:
    import ray

    if not _SHARED_RAY["up"]:
        ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        _SHARED_RAY["up"] = True


def _stop_shared_ray() -> None:
    if _SHARED_RAY["up"]:
        import ray

        ray.shutdown()
        _SHARED_RAY["up"] = False


@pytest.fixture(scope="session")
def local_ray():
    """A real local Ray cluster with 2 CPUs and 1 *logical* GPU (fractional-GPU scheduling on a CPU machine), shared
    by the tests that ask for it (each starts in a new ray.init costing seconds on 2 cores)."""
    import ray

    _start_shared_ray()
    yield ray
    _stop_shared_ray()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before the test's fixtures: the shared cluster up for a test that asks for it (again, if a test between
    # stopped it), down for one that does not.
    if "local_ray" in item.fixturenames:
        _start_shared_ray()
    else:
        _stop_shared_ray()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run in a temp working directory with a fresh sqlite MLflow store there (the default URI's place)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    return tmp_path


def pytest_collection_modifyitems(items):
    # The tests on the shared in-process cluster (`local_ray`) run one after another, each module's in its order,
    # so that the cluster starts once; modules that start their own Ray processes (subprocess drivers,
    # `ray start --head`) run last, after it is shut down. (No module-scoped fixture serves both a test on the shared
    # cluster and one off it, so none is set up twice.)
    items.sort(key=lambda item: ("subprocess_ray" in item.keywords, "local_ray" in item.fixturenames))


def pytest_configure(config):
    config.addinivalue_line("markers", "subprocess_ray: test drives Ray through separate processes")
    sys.path.insert(0, str(REPO))
