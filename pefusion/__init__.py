"""pefusion: positional-encoding fusion and positional-vs-semantic attention studies on Ray Tune.

Importing the package stays light (torch and the configs only); Ray and MLflow are imported by the modules that
need them.
"""
import os

# Large CPU tensors on transparent huge pages: PyTorch's own switch, read once, at torch's first allocation, so
# it is set here before torch is imported (a user's own value wins; Ray workers of a local cluster inherit it).
# Fresh token arrays then fault in 2 MB pages instead of 4 KB ones: generating the teacher data at d = 1000,
# n = 2 200 went from 53 to 24 ms, more than half of it page faults (scripts/bench_student.py).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from pefusion.fusion.config import PRESETS, ModelConfig, TrainConfig
from pefusion.errors import ConfigError
from pefusion.data.config import DataConfig
from pefusion.fusion.model import PEFusionClassifier, build_model, build_model_from_config

__all__ = [
    "PRESETS",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "PEFusionClassifier",
    "TrainConfig",
    "build_model",
    "build_model_from_config",
]
