"""The cluster recipes in deploy/ parse (the KubeRay manifest as YAML, the Slurm batch script with `bash -n`), and
docs/clusters.md names the commands the suite's object-storage tests run, word for word. Neither recipe is run
here: no Kubernetes or Slurm; docs/clusters.md says which parts the suite ran."""
from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest
import yaml

from conftest import REPO
from test_sweep_processes import S3_SWEEPS


def test_the_kuberay_manifest_is_a_rayjob_of_a_cpu_head_and_gpu_workers_running_the_sweep():
    (job,) = list(yaml.safe_load_all((REPO / "deploy" / "kuberay" / "rayjob.yaml").read_text()))
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    cluster = job["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # the driver's node runs no trial
    assert all("nvidia.com/gpu" not in c["resources"]["limits"] for c in head["template"]["spec"]["containers"])
    (gpus,) = cluster["workerGroupSpecs"]
    assert all(c["resources"]["limits"]["nvidia.com/gpu"] >= 1 for c in gpus["template"]["spec"]["containers"])
    command = shlex.split(job["spec"]["entrypoint"])
    assert command[:2] == ["python", "sweeps/arxiv_grid.py"] and command[command.index("--address") + 1] == "auto"
    assert command[command.index("--storage-path") + 1].startswith("s3://")


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_slurm_script_parses_and_starts_ray_on_every_node():
    script = REPO / "deploy" / "slurm" / "sweep.sbatch"
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    text = script.read_text()
    assert "ray start --head" in text and "ray start --address" in text and "sweeps/arxiv_grid.py" in text


def test_the_clusters_page_names_the_tested_object_storage_commands_word_for_word():
    page = (REPO / "docs" / "clusters.md").read_text()
    for name, prefix in (("env", "AWS_ENDPOINT_URL=http://127.0.0.1:PORT "), ("cut", "")):
        words = [a.format(endpoint="127.0.0.1:PORT", db="DB") for a in S3_SWEEPS[name]]
        line = f"{prefix}python sweeps/arxiv_grid.py {shlex.join(words)}"
        assert line in page, line
