"""The suite stays off the user's machine whatever their environment says: no network, no writes to their
Hugging Face, pefusion or Ray files in their home, no runs on their tracking server, and the processes it starts
import the repository under test."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

# What pytest does first (import conftest), then what the libraries make of the environment it leaves.
PROBE = r"""
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import conftest
sys.path.insert(0, str(conftest.REPO))
import datasets, huggingface_hub.constants as hub
from pefusion.data import cache, readers
from pefusion.data.config import DataConfig
from pefusion.tracking.store import resolve_tracking_uri
child = subprocess.run([sys.executable, "-c", "import pefusion; print(pefusion.__file__)"], capture_output=True,
                       text=True, check=True).stdout.strip()
print(json.dumps({
    "session_dir": str(conftest.SESSION_DIR),
    "offline": [datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub.HF_HUB_OFFLINE,
                readers.hub_offline()],
    "paths": {"HF_HOME": hub.HF_HOME, "hub cache": hub.HF_HUB_CACHE,
              "datasets cache": str(datasets.config.HF_DATASETS_CACHE),
              "datasets modules": str(datasets.config.HF_MODULES_CACHE),
              "pefusion cache": str(cache.cache_root(DataConfig())),
              "ray token": os.environ.get("RAY_AUTH_TOKEN_PATH"),
              "mlflow store": resolve_tracking_uri().removeprefix("sqlite:///")},
    "ray_token_env": os.environ.get("RAY_AUTH_TOKEN"),
    "usage_stats": os.environ.get("RAY_USAGE_STATS_ENABLED"),
    "child_pefusion": child,
}))
"""


def test_a_users_environment_cannot_send_the_suite_online_or_into_their_files(tmp_path):
    home = tmp_path / "home"
    cache = home / ".cache"
    users_env = {
        "PATH": "/usr/bin:/bin", "HOME": str(home), "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0",
        "HF_HOME": str(cache / "huggingface"), "HF_HUB_CACHE": str(cache / "huggingface" / "hub"),
        "HF_DATASETS_CACHE": str(cache / "huggingface" / "datasets"), "PEFUSION_CACHE": str(cache / "pefusion"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db", "RAY_AUTH_TOKEN": "the-users-token",
        "RAY_USAGE_STATS_ENABLED": "1",
    }
    proc = subprocess.run([sys.executable, "-c", PROBE, str(Path(__file__).parent)], env=users_env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["offline"] == [True] * 4
    session = Path(seen["session_dir"])
    for what, path in seen["paths"].items():
        assert path is not None and Path(path).is_relative_to(session), (what, path)
    assert seen["ray_token_env"] is None and seen["usage_stats"] == "0"
    assert Path(seen["child_pefusion"]).resolve() == (REPO / "pefusion" / "__init__.py").resolve()
    assert not home.exists()
    assert not session.exists()  # removed when the session ends
