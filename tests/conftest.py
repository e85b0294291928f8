"""Shared fixtures: a tiny synthetic corpus, a smoke-sized preset, a real local Ray, a real sqlite MLflow."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import socket
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Tests never touch the network: the Hugging Face hub is offline, Ray doesn't phone home.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


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


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("token_cache")


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


@pytest.fixture(scope="module")
def local_ray():
    """A real local Ray cluster with 2 CPUs and 1 *logical* GPU (fractional-GPU scheduling on a CPU machine)."""
    import ray

    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run in a temp working directory with a fresh sqlite MLflow store there (the default URI's place)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    return tmp_path


def pytest_collection_modifyitems(items):
    # Modules that start their own Ray processes (subprocess drivers, `ray start --head`) run last, after every
    # in-process cluster is shut down.
    items.sort(key=lambda item: "subprocess_ray" in item.keywords)


def pytest_configure(config):
    config.addinivalue_line("markers", "subprocess_ray: test drives Ray through separate processes")
    sys.path.insert(0, str(REPO))
