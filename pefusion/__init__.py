"""pefusion: positional-encoding fusion and positional-vs-semantic attention studies on Ray Tune.

Importing the package stays light (torch and the configs only); Ray and MLflow are imported by the modules that
need them.
"""
from pefusion.config import PRESETS, ConfigError, DataConfig, ModelConfig, TrainConfig
from pefusion.encoder import PEFusionClassifier, build_model, build_model_from_config

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
