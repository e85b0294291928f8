"""A sweep on a real multi-node Ray cluster on this machine: a head that runs no trial and three one-CPU worker
nodes, each its own raylet and object store (Ray's `ray.cluster_utils.Cluster`, on free ports, in a temp dir of
its own).

The driver is the command a user types (`sweeps/arxiv_grid.py --address <head>`), in its own process; the test
kills the worker node a trial is running on once that trial has reported its first epoch, as a cluster losing a
machine would. The sweep must end complete: every trial ok, one MLflow child run per trial with each epoch once,
the lost trial finished from its checkpoint on another node and tagged with that node, and every trial's numbers
those of an uninterrupted training of the same configuration in this process; with the storage on a shared disk,
and (slow) in a bucket of an S3 server the test starts.

And `--gpus-per-trial auto` from a driver without a GPU: measured by a Ray task on the cluster's GPU node.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import REPO, free_port, subprocess_env
from pefusion import record as R

pytestmark = pytest.mark.subprocess_ray

# 8 epochs (early stopping can end a trial at epoch 5 at the earliest, patience 4): a trial reports its first epoch
# seconds before its last, so the node under it is removed mid-trial.
EPOCHS = 8
GRID = ["--preset", "arxiv", "--synthetic", "--smoke", "--epochs", str(EPOCHS), "--pe-types", "sinusoidal",
        "--fusions", "add,concat", "--seeds", "0,1", "--no-dashboard", "-q"]


@pytest.fixture
def cluster(monkeypatch):
    """A head node with no CPU (the driver and Tune run there, never a trial: every trial gets the corpus from
    another node's object store) and three one-CPU worker nodes. Three, not two: after one is lost, two nodes still
    hold trials that never moved (a node that joins later is not enough: Tune gives the pending trials to the actors
    it already has, which start them seconds before a fresh node's first worker has imported torch)."""
    with _own_cluster(monkeypatch, {"num_cpus": 0}, *[{"num_cpus": 1}] * 3) as (cluster, nodes):
        yield cluster, nodes[1:]


@contextlib.contextmanager
def _own_cluster(monkeypatch, *nodes: dict):
    """A Ray cluster of `nodes` (the first the head; each `Cluster.add_node`'s arguments) on this machine.

    Kept off anything else on the machine: the head's GCS and dashboard agent on free ports (never 6379/52365),
    RAY_TMPDIR a short temp dir of its own (the nodes' session dirs, and the `ray_current_cluster` file Ray writes
    for `address="auto"`, which must not point a user's `ray.init()` at this cluster). Torn down through the
    Cluster's own handles: only the processes of the nodes it started are killed.
    """
    import ray
    from ray.cluster_utils import Cluster

    temp = Path(tempfile.mkdtemp(prefix="pfn-"))  # short: Ray's socket paths must fit in 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    cluster = Cluster()
    try:
        head, *workers = nodes
        made = [cluster.add_node(**head, gcs_server_port=free_port(), dashboard_agent_listen_port=free_port(),
                                 include_dashboard=False)]
        made += [cluster.add_node(**worker) for worker in workers]
        cluster.wait_for_nodes()
        yield cluster, made
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def _reports(trial_dir: Path) -> list[dict]:
    """What Tune stored of a trial's reports so far (result.json; a line being written is skipped)."""
    path = trial_dir / "result.json"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def _training_on(exp_dir: Path, node_id: str) -> Path | None:
    """The trial directory of a trial that has reported an epoch from `node_id` and has not finished."""
    for trial_dir in exp_dir.glob("pefusion_trainable_*"):
        reports = _reports(trial_dir)
        if any(r.get(R.NODE) == node_id and R.EPOCH in r for r in reports) and not any(R.STATUS in r for r in reports):
            return trial_dir
    return None


def _stored(kind: str, exp_dir: Path, endpoint: str | None):
    """The experiment's folder as Ray stored it, as a pyarrow filesystem and its path there: on the disk, or in the
    bucket (the endpoint of the test's S3 server)."""
    from pyarrow import fs

    if kind == "disk":
        return fs.LocalFileSystem(), str(exp_dir)
    return fs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1", scheme="http",
                           endpoint_override=endpoint), f"sweeps/ray/{exp_dir.name}"


def _listed(store, path: str, prefix: str) -> list[str]:
    from pyarrow import fs

    return sorted(i.path for i in store.get_file_info(fs.FileSelector(path)) if i.base_name.startswith(prefix))


def _stored_reports(store, trial_path: str) -> list[dict]:
    with store.open_input_stream(f"{trial_path}/result.json") as f:
        return [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]


# "s3": checkpoints in a bucket of the test's own S3 server, the endpoint in the storage URI (slow: ~2 min more).
@pytest.mark.parametrize("kind", ["disk", pytest.param("s3", marks=pytest.mark.slow)])
def test_a_sweep_across_nodes_survives_losing_one(tmp_path, cache_dir, smoke_preset, cluster, kind, request):
    """`disk`: the storage a folder every node shares; `s3`: a bucket (`--storage-path
    's3://sweeps/ray?endpoint_override=HOST:PORT&scheme=http'`), from which the lost trial restarts elsewhere."""
    import os

    import ray
    from mlflow.tracking import MlflowClient

    from pefusion.data.corpus import load_corpus
    from pefusion.fusion.config import split_trial_config
    from pefusion.fusion.training import train_and_evaluate

    cluster, (_, victim, _) = cluster
    storage, db = tmp_path / "shared_storage", tmp_path / "mlflow.db"
    exp_dir = storage / "nodes"
    endpoint = request.getfixturevalue("s3_server") if kind == "s3" else None
    storage_path = str(storage) if kind == "disk" else f"s3://sweeps/ray?endpoint_override={endpoint}&scheme=http"
    # where the driver writes the trials' reports as they come: the shared folder, or with a bucket its staging
    # folder in the Ray session (under the cluster's RAY_TMPDIR), synced to the bucket
    staging = Path(os.environ["RAY_TMPDIR"])
    log_path = tmp_path / "driver.log"
    started = time.time()
    with log_path.open("w") as log:
        driver = subprocess.Popen(
            [sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), *GRID, "--address", cluster.address,
             "--name", "nodes", "--storage-path", storage_path, "--tracking-uri", f"sqlite:///{db}",
             "--cache-dir", str(cache_dir)],
            cwd=tmp_path, env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        # Lose the node under a running trial, once that trial has a checkpoint (its first epoch).
        deadline = time.time() + 180
        while (lost_dir := _training_on(exp_dir if kind == "disk" else
                                        next(staging.rglob("nodes/driver_artifacts"), exp_dir),
                                        victim.node_id)) is None:
            assert driver.poll() is None, "the sweep ended before a trial ran on the node:\n" + log_path.read_text()
            assert time.time() < deadline, "no trial reported from the node:\n" + log_path.read_text()[-3000:]
            time.sleep(0.05)
        cluster.remove_node(victim, allow_graceful=False)  # SIGKILL: a machine lost, not a drained node
        driver.wait(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    out = log_path.read_text()
    assert driver.returncode == 0, out[-5000:]
    assert "4 trials, 4 ok, 0 failed" in out, out[-5000:]
    duration = time.time() - started

    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    deadline = time.time() + 60  # Ray marks a lost node dead after missed health checks (~15 s)
    while (nodes := {n["NodeID"]: n["Alive"] for n in ray.nodes()})[victim.node_id] and time.time() < deadline:
        time.sleep(0.5)
    assert nodes[victim.node_id] is False and sum(nodes.values()) == 3  # the head and two workers

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("pe-fusion")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
    assert parent.info.status == "FINISHED" and parent.data.tags[R.TAG_RAY_ADDRESS] == cluster.address
    children = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent.info.run_id}'")
    by_trial = {c.data.tags[R.TAG_TRIAL_ID]: c for c in children}
    assert len(children) == len(by_trial) == 4, "one child run per trial, no duplicate after the node loss"
    rows = pd.read_csv(tmp_path / "results" / "nodes_results_by_seed.csv")
    assert sorted(rows["trial_id"]) == sorted(by_trial) and set(rows[R.STATUS]) == {R.STATUS_OK}

    # 1. trials ran on more than one node, each tag a node of this cluster, the CSV agreeing with the tags
    tags = {t: c.data.tags[R.TAG_NODE] for t, c in by_trial.items()}
    assert len(set(tags.values())) >= 2, tags
    assert set(tags.values()) <= set(nodes), (tags, nodes)
    assert dict(zip(rows["trial_id"], rows[R.NODE])) == tags

    # 4. the node really went mid-trial: the lost trial reported epochs from it, then went on from its checkpoint
    # (not from epoch 1) on another node, where it finished; its tag names that node
    store, stored_dir = _stored(kind, exp_dir, endpoint)
    trial_paths = _listed(store, stored_dir, "pefusion_trainable_")
    lost = _stored_reports(store, f"{stored_dir}/{lost_dir.name}")
    lost_id = lost[-1]["trial_id"]
    n_before = sum(r.get(R.NODE) == victim.node_id for r in lost)
    before, after = lost[:n_before], lost[n_before:]
    assert before and all(r.get(R.NODE) == victim.node_id and R.STATUS not in r for r in before), lost
    assert after and all(r[R.NODE] == after[0][R.NODE] != victim.node_id for r in after), lost
    assert 2 <= after[0][R.EPOCH] <= before[-1][R.EPOCH] + 1, [(r.get(R.EPOCH), r[R.NODE][:8]) for r in lost]
    assert after[-1][R.STATUS] == R.STATUS_OK and tags[lost_id] == after[-1][R.NODE] and nodes[tags[lost_id]]

    # 3. results in the storage every node wrote to: each trial's directory holds its reports and its last
    # checkpoint (the final record, the node that wrote it)
    for trial_id, run in by_trial.items():
        (trial_path,) = [d for d in trial_paths if _stored_reports(store, d)[-1]["trial_id"] == trial_id]
        (checkpoint,) = _listed(store, trial_path, "checkpoint_")
        with store.open_input_stream(f"{checkpoint}/record.json") as f:
            record = json.loads(f.read())
        assert record[R.NODE] == tags[trial_id] and record[R.TEST_ACC] == pytest.approx(run.data.metrics[R.TEST_ACC])
        assert store.get_file_info(f"{checkpoint}/{R.ARTIFACT_CHECKPOINT_DIR}/model.pt").is_file

    # 2. every node had the same corpus (object store), and the resumed trial lost nothing: each trial's epochs
    # and test accuracy are those of the same configuration trained here without interruption (one thread, as in
    # the trial); each child FINISHED with every epoch's train_loss logged once, at steps 1..epochs_run
    preset = dataclasses.replace(smoke_preset, train=dataclasses.replace(smoke_preset.train, max_epochs=EPOCHS))
    corpus = load_corpus(preset.data)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for row in rows.itertuples():
            run = by_trial[row.trial_id]
            assert run.info.status == "FINISHED"
            losses: list[float] = []
            config = {R.PE_TYPE: row.pe_type, R.FUSION: row.fusion, R.SEED: int(row.seed)}
            record = train_and_evaluate(*split_trial_config(config, preset), corpus,
                                        length_edges=preset.data.length_edges,
                                        on_epoch=lambda m, _: losses.append(m[R.TRAIN_LOSS]))
            history = client.get_metric_history(run.info.run_id, R.TRAIN_LOSS)
            assert sorted(m.step for m in history) == list(range(1, int(run.data.metrics[R.EPOCHS_RUN]) + 1)), row
            assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(losses, rel=1e-6)
            assert row.test_acc_pct == pytest.approx(record[R.TEST_ACC] * 100, abs=0.005 + 1e-9)  # CSV: %, 2 dp
            assert row.epochs_run == record[R.EPOCHS_RUN]
    finally:
        torch.set_num_threads(threads)
    print(f"sweep with a node lost: {duration:.0f} s")


# --- `--gpus-per-trial auto` measured on the cluster's GPU node, from a driver without a GPU ------------------

CARD_KIND = "PEFUSION_TEST_CARD"  # the kind of card the worker declares, as Ray labels a node's GPUs
CARD_BYTES = 16 * 1024 ** 3
PEAK_BYTES = 3 * 1024 ** 3


def _fixed_peak(points):
    """The test study's probe: the worker's GPUs are logical (no CUDA), so it says what a card would have measured."""
    return PEAK_BYTES, f"the largest of {len(points)} trials"


def _fixed_card():
    """The test study's card: 16 GiB, all of it free but the probe's own CUDA context."""
    from pefusion.sweep.gpus import CONTEXT_BYTES

    return CARD_BYTES - CONTEXT_BYTES, CARD_BYTES, f"{CARD_KIND} card"


@pytest.mark.slow
@pytest.mark.system  # CI runs it in its second stage (.ci/run); the default suite has the faster probe tests below
def test_auto_measures_on_the_clusters_gpu_node_from_a_driver_without_one(monkeypatch, in_tmp, smoke_preset,
                                                                         smoke_corpus):
    """A head without GPUs and a worker with 2 logical GPUs labelled as a kind of card; the driver (this process,
    no CUDA) joins with `--gpus-per-trial` left out. The probe runs as a Ray task on the worker (the node id in the
    line and the parent's tag is the worker's), and the trials get its fraction: (3 + 0.5) GiB per trial in 90 % of
    16 GiB is 4 per card, 0.25 GPU each: both trials on the worker's GPU 0 at once."""
    import ray.cloudpickle

    from pefusion.fusion.study import pefusion_study
    from pefusion.fusion.trainable import pefusion_trainable
    from pefusion.sweep.driver import run_sweep
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.space import parse_search_space
    from pefusion.fusion.config import RULES
    from mlflow.tracking import MlflowClient
    from pefusion.tracking.store import resolve_tracking_uri

    with _own_cluster(monkeypatch, {"num_cpus": 1},
                      {"num_cpus": 2, "num_gpus": 2, "resources": {f"accelerator_type:{CARD_KIND}": 1}}) as (c, nodes):
        worker = nodes[1]
        space = parse_search_space({R.FUSION: {"grid": ["add", "concat"]}, R.SEED: {"grid": [0]}}, RULES)
        study = dataclasses.replace(
            pefusion_study("arxiv_grid", "smoke", smoke_preset, space, 1.0, corpus=smoke_corpus,
                           trainable=pefusion_trainable),
            gpu_probe=_fixed_peak, gpu_card=_fixed_card)
        opts = SweepOptions(sweep="arxiv_grid", experiment="pe-fusion", storage_path=str(in_tmp / "ray_results"),
                            address=c.address, dashboard=False, verbose=0, progress=False, name="gpus")
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the probe's functions travel to the node
        try:
            result = run_sweep(study, opts, in_tmp / "results")
        finally:
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])

    assert list(result.rows[R.STATUS]) == [R.STATUS_OK] * 2
    # Ray gave both trials the worker's GPU 0 at once: a quarter each (a trial on CPU records no GPU share, and a
    # trial of a logical GPU trains on the CPU, so CUDA_VISIBLE_DEVICES, which Ray sets, is what shows it)
    rows = result.rows
    assert set(rows[R.NODE]) == {worker.node_id} and list(rows[R.VISIBLE_DEVICES].astype(str)) == ["0", "0"]
    assert rows[R.STARTED_AT].max() < rows[R.ENDED_AT].min(), "the two trials did not share the card"
    client = MlflowClient(resolve_tracking_uri())
    tags = client.get_run(result.parent_run_id).data.tags
    assert tags[R.TAG_GPUS_PER_TRIAL] == "0.25"
    assert tags[R.TAG_GPUS_AUTO].startswith("0.25 GPU per trial, 4 trials per card: the largest of 2 trials peaks ")
    assert tags[R.TAG_GPUS_AUTO].endswith(f"on {CARD_KIND} card); measured on {CARD_KIND} card on node {worker.node_id}")


def test_the_dashboard_of_a_cluster_the_gpu_probe_joined_first_is_still_printed(monkeypatch, capsys):
    """`--gpus-per-trial auto` joins the cluster (for its probe) before the sweep starts Ray: the sweep still
    prints the joined cluster's dashboard, the URL Ray gave when it joined."""
    import ray
    from ray.cluster_utils import Cluster

    from pefusion.sweep import cluster as joining
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.cluster import start_cluster

    temp = Path(tempfile.mkdtemp(prefix="pfn-"))
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    own = Cluster()
    try:
        own.add_node(num_cpus=1, gcs_server_port=free_port(), dashboard_agent_listen_port=free_port(),
                     include_dashboard=True, dashboard_port=free_port(), dashboard_host="127.0.0.1")
        url = joining.join(own.address, 0)  # as the probe joins
        assert url.startswith("http://127.0.0.1:")
        start_cluster(SweepOptions(sweep="arxiv_grid", experiment="pe-fusion", address=own.address, name="d", gpus_per_trial=0))
        assert f"Ray dashboard: {url}" in capsys.readouterr().out
    finally:
        ray.shutdown()
        own.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


# --- the kinds of card: one label, two memory sizes; no GPU node yet under --autoscaling -----------------------

A100_PEAK = 15 * 1024 ** 3  # the sweep's largest trial: 15 GiB + 0.5 GiB context = 15.5 GiB per trial


def _peak_15_gib(points):
    return A100_PEAK, "the largest trial"


def _card_of_this_node():
    """The node's card as its raylet's environment declares it (logical GPUs have no CUDA to ask)."""
    import os

    from pefusion.sweep.gpus import CONTEXT_BYTES

    total = int(os.environ["PEFUSION_TEST_CARD_GIB"]) * 1024 ** 3
    return total - CONTEXT_BYTES, total, f"A100 {os.environ['PEFUSION_TEST_CARD_GIB']} GB"


def _out_of_memory(points):
    import torch

    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity "
                                      "of 39.38 GiB of which 1.20 GiB is free.")


def test_one_card_label_with_two_memory_sizes_is_probed_per_size_and_packed_for_the_smaller(monkeypatch):
    """Two worker nodes whose GPUs Ray labels alike (`accelerator_type:A100`), one card of 80 GiB and one of 40
    GiB. Measuring the label once (the first node of the label, as pefusion did) gives, when that node is the
    80 GiB one, 4 trials per card (4 x 15.5 GiB in 72 GiB): 62 GiB of trials on the 40 GiB card, out of memory.
    Grouped by label and memory, both are measured and the trials get the smaller card's 2 per card (0.5).

    And a probe out of card memory on a node ends with CUDA's message, not Ray's first line of its wrapper; a GPU
    node whose card cannot be read (its GPU busy past the wait) is refused, not left unmeasured."""
    import ray.cloudpickle

    from pefusion.errors import ConfigError
    from pefusion.sweep.cluster import probe_on_cluster
    from pefusion.sweep.gpus import fit_smallest, pack_trials

    a100 = {"accelerator_type:A100": 1}
    with _own_cluster(monkeypatch, {"num_cpus": 1},
                      {"num_cpus": 1, "num_gpus": 1, "resources": a100, "env_vars": {"PEFUSION_TEST_CARD_GIB": "80"}},
                      {"num_cpus": 1, "num_gpus": 1, "resources": a100, "env_vars": {"PEFUSION_TEST_CARD_GIB": "40"}},
                      ) as (c, nodes):
        big, small = nodes[1].node_id, nodes[2].node_id
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        try:
            readings = probe_on_cluster(c.address, 0)(_peak_15_gib, _card_of_this_node, [{}])
            with pytest.raises(ConfigError) as oom:
                probe_on_cluster(c.address, 0)(_out_of_memory, _card_of_this_node, [{}])
            # the 40 GiB node's GPU held by another job: its card cannot be read, and trials could land there
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            from pefusion.sweep import cluster as joining

            holder = ray.remote(num_gpus=1)(_GpuHolder).options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(small, soft=False)).remote()
            ray.get(holder.ready.remote())
            monkeypatch.setattr(joining, "PROBE_WAIT_S", 2)
            with pytest.raises(ConfigError) as busy:
                probe_on_cluster(c.address, 0)(_peak_15_gib, _card_of_this_node, [{}])
        finally:
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])

    assert sorted((r.node, r.total // 1024 ** 3) for r in readings) == sorted([(big, 80), (small, 40)])
    # what measuring the 80 GiB node alone gives, and why it overcommits the 40 GiB card
    alone = pack_trials(A100_PEAK, 80 * 1024 ** 3)
    assert alone.per_card == 4 and 4 * (A100_PEAK + 1024 ** 3 // 2) > 40 * 1024 ** 3
    packing = fit_smallest(readings)
    assert (packing.per_card, packing.gpus_per_trial) == (2, 0.5)
    assert 2 * (A100_PEAK + 1024 ** 3 // 2) <= 0.9 * 40 * 1024 ** 3
    assert f"A100 40 GB on node {small}" in packing.reason and f"A100 80 GB on node {big}" in packing.reason

    line = str(oom.value)
    assert "\n" not in line and "ray::" not in line and "\x1b" not in line, line
    assert line.startswith("--gpus-per-trial auto: CUDA out of memory. Tried to allocate 20.00 GiB."), line
    assert str(busy.value) == (f"--gpus-per-trial auto: no GPU free within 2 s to read the card of node {small}, "
                               "which could receive trials; pass a fraction such as --gpus-per-trial 0.25")


class _GpuHolder:
    """Another job's actor holding a node's GPU."""

    def ready(self) -> bool:
        return True


def test_autoscaling_with_no_gpu_node_waits_its_stated_time_then_refuses_in_one_line(monkeypatch):
    """--autoscaling, and the cluster has no GPU node yet (a GPU group scaled to zero): the probe asks for a GPU (an
    autoscaler's cue to add one), waits AUTOSCALE_WAIT_S (here 3 s) and refuses, rather than run the trials on
    CPUs; without --autoscaling the same cluster runs them on CPU (no reading)."""
    from pefusion.errors import ConfigError
    from pefusion.sweep import cluster as joining

    monkeypatch.setattr(joining, "AUTOSCALE_WAIT_S", 3)
    with _own_cluster(monkeypatch, {"num_cpus": 1}) as (c, _):
        assert joining.probe_on_cluster(c.address, 0)(_peak_15_gib, _card_of_this_node, [{}]) == []
        started = time.time()
        with pytest.raises(ConfigError) as refused:
            joining.probe_on_cluster(c.address, 0, autoscaling=True)(_peak_15_gib, _card_of_this_node, [{}])
        waited = time.time() - started
    assert 3 <= waited < 30
    assert str(refused.value).startswith("--gpus-per-trial auto with --autoscaling: no GPU node joined within 3 s")
