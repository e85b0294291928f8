"""pefusion: positional-encoding fusion and positional-vs-semantic attention studies on Ray Tune.

Importing the package imports nothing heavy: the public names below are loaded on first use (module
`__getattr__`), so that a command line parses and checks its flags before torch, Ray or MLflow load.
"""
import importlib
import os
from pathlib import Path

# Large CPU tensors on transparent huge pages: PyTorch's own switch, read once, at torch's first allocation, so
# it is set here before torch is imported (a user's own value wins; Ray workers of a local cluster inherit it).
# Fresh token arrays then fault in 2 MB pages instead of 4 KB ones: generating the teacher data at d = 1000,
# n = 2 200 went from 53 to 24 ms, more than half of it page faults (scripts/bench_student.py).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

# public name -> the module that defines it
_EXPORTS = {
    "PRESETS": "pefusion.fusion.config",
    "ModelConfig": "pefusion.fusion.config",
    "TrainConfig": "pefusion.fusion.config",
    "ConfigError": "pefusion.errors",
    "DataConfig": "pefusion.data.config",
    "PEFusionClassifier": "pefusion.fusion.model",
    "build_model": "pefusion.fusion.model",
    "build_model_from_config": "pefusion.fusion.model",
}
__all__ = sorted(_EXPORTS)


def cache_home() -> Path:
    """pefusion's cache folder: $PEFUSION_CACHE, else ~/.cache/pefusion (token ids, MLflow's empty store)."""
    return Path(os.environ.get("PEFUSION_CACHE") or Path.home() / ".cache" / "pefusion").expanduser()


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pefusion' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
