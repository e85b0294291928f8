"""Nothing leaks and nothing runs that should not: a storage URI's credentials are shown nowhere (printed, logged,
tagged, stored in MLflow), a checkpoint or Tune state planted in the storage runs no code, the same sweep reached
another way keeps one parent run, and the tracking server's refusals (a host name it does not allow, a wrong
login) end the command in one line before Ray starts."""
from __future__ import annotations

import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, free_port, subprocess_env
from pefusion import record as R
from pefusion.errors import ConfigError

KEY, SECRET = "PLANTEDKEY", "pl4nted-S3CRET-value"
ENV_SECRET = "env-S3CRET-of-the-shell"


class _RunsCode:
    """A pickle that runs a shell command when loaded: what a writer of the storage could plant."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


# --- redaction at one place --------------------------------------------------------------------------------


def test_the_user_information_of_a_uri_is_starred_wherever_it_stands():
    from pefusion.storage import canonical, credentials_note, redact, without_credentials

    line = f"python sweeps/arxiv_grid.py --storage-path 's3://{KEY}:{SECRET}@sweeps/ray?scheme=http' -q"
    assert redact(line) == "python sweeps/arxiv_grid.py --storage-path 's3://***@sweeps/ray?scheme=http' -q"
    assert redact(f"--storage-path=s3://{KEY}:{SECRET}@b/p") == "--storage-path=s3://***@b/p"
    assert redact("http://admin:pw@mlflow.lab:5000 and s3://b/p") == "http://***@mlflow.lab:5000 and s3://b/p"
    assert without_credentials("s3://***@b/p?x=1") == "s3://b/p?x=1"
    assert redact("/local/path/with@sign") == "/local/path/with@sign"
    assert credentials_note(f"s3://{KEY}:{SECRET}@b") and not credentials_note("s3://b")
    # one storage, however it is reached: the endpoint's spelling and the credentials are not its name
    for same in (f"s3://{KEY}:{SECRET}@sweeps/ray/x", "s3://sweeps/ray/x?endpoint_override=127.0.0.1:9000&scheme=http",
                 "S3://sweeps//ray/x/", "s3://sweeps/ray/x"):
        assert canonical(same) == "s3://sweeps/ray/x", same
    assert canonical("s3://sweeps/ray/y") != canonical("s3://sweeps/ray/x")
    # the command line as recorded (the parent run's tag) and printed
    from pefusion.tracking.provenance import command_line

    recorded = command_line(["--storage-path", f"s3://{KEY}:{SECRET}@sweeps/ray"], program="pefusion-grid")
    assert recorded == "pefusion-grid --storage-path 's3://***@sweeps/ray'"


def test_the_refusals_of_a_storage_uri_with_credentials_show_none(tmp_path):
    """The refusal of a bad URI and "cannot reach the storage" (pyarrow's own text included) show `***`."""
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.settle import check_object_store, experiment_path, resume_command

    port = free_port()  # nothing listens: the store does not answer
    for uri, says in ((f"s3://{KEY}:{SECRET}@sweeps/ray?bogus=1", "--storage-path s3://***@sweeps/ray?bogus=1"),
                      (f"s3://{KEY}:{SECRET}@sweeps/ray?endpoint_override=127.0.0.1:{port}&scheme=http",
                       "cannot reach the storage at s3://***@sweeps")):
        opts = SweepOptions(sweep="arxiv_grid", storage_path=uri, name="x")
        with pytest.raises(ConfigError) as err:
            check_object_store(experiment_path(uri, "x"), "x", opts)
        assert says in str(err.value) and SECRET not in str(err.value) and KEY not in str(err.value), err.value
        assert "\n" not in str(err.value)
    # the resume command leaves them out and says where they come from, as a comment the shell skips
    line = resume_command(SweepOptions(sweep="arxiv_grid", storage_path=f"s3://{KEY}:{SECRET}@sweeps/ray",
                                       command=f"pefusion-grid --storage-path s3://***@sweeps/ray"), "x")
    assert line.startswith("pefusion-grid --storage-path s3://sweeps/ray --name x --resume  # ")
    assert "AWS_SECRET_ACCESS_KEY" in line and SECRET not in line


# The tiniest grid that an interruption can cut: 2 trials of 3 epochs, one after another.
TINY = ["--preset", "arxiv", "--synthetic", "--smoke", "--epochs", "3", "--pe-types", "sinusoidal",
        "--fusions", "add,concat", "--seeds", "0", "--max-concurrent", "1", "--num-cpus", "2", "--no-dashboard"]


def _stopped_after_its_first_trial(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, str]:
    """Run the sweep driver `cmd` (a `TINY` grid) and send it SIGTERM once its first trial has ended, as a user's
    Ctrl-C or a scheduler's preemption would; its stdout and stderr once it has stopped (exit 130, interrupted)."""
    driver = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in driver.stdout:
        seen.append(line)
        if " 1/2 done " in line:
            break
    else:
        raise AssertionError("the sweep ended before its first trial did:\n" + driver.stderr.read()[-3000:])
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=180)
    assert driver.returncode == 130, err[-3000:]
    return "".join(seen) + out, err


# Two sweep processes over moto's S3 server: `-m slow` (1.5 min on an idle 2-core machine, 9 min loaded).
@pytest.mark.slow
@pytest.mark.subprocess_ray
def test_a_planted_secret_is_found_nowhere_and_the_printed_resume_runs_as_printed(tmp_path, cache_dir,
                                                                                   s3_server, request):
    """`--storage-path s3://KEY:SECRET@sweeps/ray?endpoint_override=...` (moto's S3 server): the sweep is stopped
    by SIGTERM after its first trial; the `continue with:` line, run as printed (the credentials from the
    environment, as its comment says), finishes it under the same parent run, FINISHED. The secret (and the key)
    is then searched in every place listed in `searched`, and found in none."""
    from mlflow.tracking import MlflowClient

    endpoint = s3_server
    uri = f"s3://{KEY}:{SECRET}@sweeps/ray?endpoint_override={endpoint}&scheme=http"
    db = tmp_path / "mlflow.db"
    # no credentials in the environment: only the URI's reach the store (moto takes any)
    ray_tmp = Path(tempfile.mkdtemp(prefix="pfl-"))  # Ray's session logs, searched too (a short path: Ray's sockets)
    request.addfinalizer(lambda: shutil.rmtree(ray_tmp, ignore_errors=True))
    env = subprocess_env(AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None, RAY_TMPDIR=str(ray_tmp))
    cmd = [sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), *TINY, "--name", "leak", "--storage-path", uri,
           "--tracking-uri", f"sqlite:///{db}", "--cache-dir", str(cache_dir)]
    out, err = _stopped_after_its_first_trial(cmd, tmp_path, env)
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    printed = last.split("continue with: ", 1)[1]
    assert f"--storage-path 's3://sweeps/ray?endpoint_override={endpoint}&scheme=http'" in printed, printed
    assert "# the storage URI's credentials are not printed: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" \
        in printed

    # the user's shell, as the comment asks: credentials in the environment (others than the URI's, so that what
    # is searched below is the URI's alone: moto takes any), the line pasted as printed
    resumed = subprocess.run(printed, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                             env={**env, "AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": ENV_SECRET})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Ray experiment: s3://sweeps/ray/leak?endpoint_override={endpoint}&scheme=http" in resumed.stdout

    client = MlflowClient(f"sqlite:///{db}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    parents = [r for r in runs if r.data.tags.get(R.TAG_ROLE) == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", [p.info.status for p in parents]
    assert parents[0].data.tags[R.TAG_STORAGE] == "s3://sweeps/ray/leak"
    # the command that last ran the sweep (the resume, as printed)
    assert f"--storage-path 's3://sweeps/ray?endpoint_override={endpoint}&scheme=http'" in \
        parents[0].data.tags[R.TAG_COMMAND]
    assert sum(r.data.tags.get(R.TAG_ROLE) == "trial" for r in runs) == 2

    searched = {"the interrupted sweep's stdout": out, "its stderr": err,
                "the resumed sweep's stdout": resumed.stdout, "its stderr": resumed.stderr}
    for run in runs:  # every param, tag and artifact of every run (parent and children)
        searched[f"run {run.info.run_id} params and tags"] = repr((run.data.params, run.data.tags, run.info))
        folder = tmp_path / "artifacts" / run.info.run_id
        client.download_artifacts(run.info.run_id, "", str(folder.mkdir(parents=True) or folder))
    files = [db, *(tmp_path / "artifacts").rglob("*"), *(tmp_path / "results").rglob("*"),
             *(tmp_path / "ray_results").rglob("*"), *(tmp_path / "mlartifacts").rglob("*"),
             *ray_tmp.rglob("*")]  # the store's file, artifacts, CSVs, driver.log, Ray's session logs
    for path in files:
        if path.is_file() and not path.is_symlink():
            searched[str(path)] = path.read_bytes().decode("utf-8", "replace")
    assert any(name.endswith("driver.log") for name in searched), sorted(searched)
    assert any(name.endswith(".csv") for name in searched), sorted(searched)
    found = [name for name, text in searched.items() if SECRET in text or KEY in text]
    # Ray keeps the storage URI it was given in its own experiment state (the search's and the experiment's
    # state files, staged in its session folder on the head and uploaded beside tuner.pkl): said in
    # docs/clusters.md, which recommends the environment for that reason. Nothing of pefusion's holds it.
    ray_state = [name for name in found if "/driver_artifacts/" in name and Path(name).name.startswith(
        ("basic-variant-state-", "search_gen_state-", "experiment_state-", "tuner.pkl", "trainable.pkl"))]
    print(f"Ray's own state holding the URI as given: {[Path(n).name for n in ray_state]}")
    assert found == ray_state, [name for name in found if name not in ray_state]
    print(f"searched {len(searched)} places: {', '.join(sorted(searched))}")
    print(f"the environment's secret (Ray's to keep): in {[n for n, t in searched.items() if ENV_SECRET in t]}")
    # Not asserted (the bucket is where the credentials give access anyway), said: Ray's own state in the bucket
    from pyarrow import fs

    bucket = fs.S3FileSystem(access_key=KEY, secret_key=SECRET, scheme="http", endpoint_override=endpoint)
    holding = [info.path for info in bucket.get_file_info(fs.FileSelector("sweeps/ray/leak", recursive=True))
               if info.is_file and SECRET.encode() in bucket.open_input_file(info.path).read()]
    print(f"objects in the bucket holding the secret: {holding or 'none'}")


# --- one sweep, one parent -----------------------------------------------------------------------------------


def test_the_same_storage_reached_through_another_endpoint_spelling_keeps_one_parent(in_tmp):
    """A sweep stopped with its endpoint in the URI's query and resumed with it in the environment (and other
    credentials) finds the same parent run, which ends FINISHED; a parent recorded by the literal path before the
    canonical key (the query kept) is found too."""
    from mlflow.tracking import MlflowClient

    from pefusion.tracking.recorder import SweepRecorder
    from pefusion.tracking.store import resolve_tracking_uri

    uri = resolve_tracking_uri()
    first = SweepRecorder(uri, "pe-fusion", "arxiv_grid", "s3://sweeps/ray/x?endpoint_override=127.0.0.1:9000&scheme=http")
    first.interrupt_sweep()
    first.flush()
    again = SweepRecorder(uri, "pe-fusion", "arxiv_grid", f"s3://{KEY}:{SECRET}@sweeps/ray/x")
    assert again.parent_run_id == first.parent_run_id
    again.finish_sweep({"n_trials": 0})
    again.flush()
    other = SweepRecorder(uri, "pe-fusion", "arxiv_grid", "s3://sweeps/ray/y")
    assert other.parent_run_id != first.parent_run_id
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("pe-fusion")
    parent = client.get_run(first.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags[R.TAG_STORAGE] == "s3://sweeps/ray/x"
    assert parent.info.run_name == "x"
    # a parent of an earlier version, tagged with the path as typed
    legacy = client.create_run(exp.experiment_id, tags={R.TAG_ROLE: "sweep", R.TAG_STORAGE: "/data/ray/old"})
    assert SweepRecorder(uri, "pe-fusion", "arxiv_grid", "/data/ray/old").parent_run_id == legacy.info.run_id


# Two sweep processes over moto's S3 server: `-m slow` (1.7 min on 2 cores at a load average of 8).
@pytest.mark.slow
@pytest.mark.subprocess_ray
def test_a_real_sweep_resumed_with_its_endpoint_in_the_environment_keeps_one_parent(tmp_path, cache_dir, s3_server):
    """A real sweep (driver processes, moto's S3 server) started with the endpoint in the storage URI's query
    (`s3://sweeps/ray?endpoint_override=HOST:PORT&scheme=http`) and stopped by SIGTERM after its first trial, then
    resumed as `s3://sweeps/ray` with the endpoint in AWS_ENDPOINT_URL (pyarrow and so Ray read it): the resume
    reopens the same MLflow parent run, there is exactly one, and it ends FINISHED with both trials 'ok' under it."""
    from mlflow.tracking import MlflowClient

    endpoint = s3_server
    db = tmp_path / "mlflow.db"
    client = MlflowClient(f"sqlite:///{db}")
    base = [sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), *TINY, "--name", "moved",
            "--tracking-uri", f"sqlite:///{db}", "--cache-dir", str(cache_dir)]

    def parents() -> list:
        runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
        return [r for r in runs if r.data.tags.get(R.TAG_ROLE) == "sweep"]

    # conftest's environment has no AWS_ENDPOINT_URL: the first run reaches moto through the query alone
    _stopped_after_its_first_trial(
        [*base, "--storage-path", f"s3://sweeps/ray?endpoint_override={endpoint}&scheme=http"], tmp_path,
        subprocess_env(AWS_ENDPOINT_URL=None))
    (stopped,) = parents()
    assert stopped.info.status == "KILLED" and stopped.data.tags[R.TAG_STATUS] == R.STATUS_INTERRUPTED

    resumed = subprocess.run([*base, "--storage-path", "s3://sweeps/ray", "--resume"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600,
                             env=subprocess_env(AWS_ENDPOINT_URL=f"http://{endpoint}"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Ray experiment: s3://sweeps/ray/moved\n" in resumed.stdout, resumed.stdout[-2000:]
    assert f"parent run {stopped.info.run_id}" in resumed.stdout, resumed.stdout[-2000:]

    (parent,) = parents()  # one sweep, one parent: the same one, now FINISHED
    assert parent.info.run_id == stopped.info.run_id
    assert parent.info.status == "FINISHED" and parent.data.tags[R.TAG_STATUS] == "finished"
    assert parent.data.tags[R.TAG_STORAGE] == "s3://sweeps/ray/moved"
    trials = client.search_runs([parent.info.experiment_id], filter_string=f"tags.`{R.TAG_ROLE}` = 'trial'")
    assert sorted((t.data.tags[R.TAG_PARENT], t.info.status, t.data.tags[R.TAG_STATUS]) for t in trials) == \
        [(parent.info.run_id, "FINISHED", R.STATUS_OK)] * 2
    # and the store holds one experiment, which both invocations wrote (Tune's state beside its trials)
    from pyarrow import fs

    store = fs.S3FileSystem(scheme="http", endpoint_override=endpoint)
    assert [i.base_name for i in store.get_file_info(fs.FileSelector("sweeps/ray"))] == ["moved"]


# --- checkpoints are data -------------------------------------------------------------------------------------


def test_a_trainer_state_loads_as_data_and_a_planted_pickle_is_refused_in_one_line(tmp_path, smoke_preset,
                                                                                   smoke_corpus):
    """The resume state of a trainer, separate and stacked, loads with weights_only=True into a fresh trainer;
    a pickle that would run code (it does, loaded the old way) is refused in one line and runs nothing."""
    from pefusion.fusion.config import split_trial_config
    from pefusion.fusion.stacked import StackedTrainer
    from pefusion.fusion.trainable import UnsafeCheckpoint, load_trainer_state
    from pefusion.fusion.training import Trainer

    model_cfg, train_cfg = split_trial_config({}, smoke_preset)
    for make in (lambda: Trainer(model_cfg, train_cfg, smoke_corpus),
                 lambda: StackedTrainer(model_cfg, train_cfg, smoke_corpus, [0, 1])):
        trainer = make()
        trainer.train_epoch()
        path = tmp_path / f"{type(trainer).__name__}.pt"
        torch.save(trainer.state_dict(), path)
        fresh = make()
        fresh.load_state_dict(load_trainer_state(path))
        want = trainer.state_dict()
        got = fresh.state_dict()
        assert got.keys() == want.keys()
        assert torch.equal(got["torch_rng"], want["torch_rng"])

    marker = tmp_path / "ran"
    planted = tmp_path / "trainer.pt"
    torch.save({"model": {}, "payload": _RunsCode(marker)}, planted)
    torch.load(planted, weights_only=False)  # the plant is real: the old load runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(UnsafeCheckpoint) as err:
        load_trainer_state(planted)
    message = str(err.value)
    assert "\n" not in message and message.startswith("checkpoint trainer.pt refused: it holds more than tensors")
    assert "posix.system" in message
    assert not marker.exists()
    print(message)


def test_a_trial_resumed_from_a_planted_checkpoint_refuses_it_and_runs_nothing(local_ray, in_tmp, smoke_preset,
                                                                                smoke_corpus):
    """The trial's process is killed after its 2nd epoch and its checkpoint replaced by a pickle that runs code:
    Ray restarts the trial from it, and the trial ends 'error' with the one-line refusal; the code never ran."""
    import dataclasses
    import json

    from pefusion.fusion.trainable import TRAINER_STATE, pefusion_trainable
    from test_field_conditions import _grid, _options, _sweep

    preset = dataclasses.replace(smoke_preset, train=dataclasses.replace(smoke_preset.train, max_epochs=20,
                                                                         early_stopping=False))
    storage = in_tmp / "ray_results" / "s"
    marker = in_tmp / "ran"
    planted: list[Path] = []

    def plant_after_second_epoch() -> None:
        deadline = time.time() + 240
        while time.time() < deadline:
            for result_file in storage.glob("pefusion_trainable_*/result.json"):
                reports = [json.loads(ln) for ln in result_file.read_text().splitlines() if ln.strip()]
                if len(reports) >= 2 and R.STATUS not in reports[-1]:
                    os.kill(reports[-1]["pid"], signal.SIGKILL)
                    for state in result_file.parent.glob(f"checkpoint_*/{TRAINER_STATE}"):
                        torch.save({"payload": _RunsCode(marker)}, state)
                        planted.append(state)
                    return
            time.sleep(0.02)

    planter = threading.Thread(target=plant_after_second_epoch, daemon=True)
    planter.start()
    result = _sweep(smoke_corpus, preset, _grid(seed=[0]), _options(in_tmp, max_failures=2), pefusion_trainable)
    planter.join()
    assert planted, "the trial finished before its checkpoint could be replaced"
    row = result.rows.iloc[0]
    assert row[R.STATUS] == R.STATUS_ERROR, row.to_dict()
    assert row[R.ERROR].startswith("UnsafeCheckpoint: checkpoint trainer.pt refused"), row[R.ERROR]
    assert not marker.exists()


def test_the_drivers_check_of_tune_state_reads_it_without_running_it(tmp_path):
    """settle's check of a --resume's tuner.pkl names what it refers to without importing or calling any of it:
    a planted pickle runs nothing; one naming pefusion code this version lacks is still refused in one line."""
    from pefusion.sweep.settle import check_tune_state

    marker = tmp_path / "ran"
    check_tune_state(str(tmp_path), pickle.dumps({"callbacks": [_RunsCode(marker)]}))
    assert not marker.exists()

    # an instance of a class of pefusion 0.1 (GLOBAL, EMPTY_TUPLE, NEWOBJ: what pickle writes for one)
    gone = b"\x80\x02cpefusion.sweep.live\nMLflowLiveCallback\n)\x81."
    with pytest.raises(ConfigError, match=r"saved by pefusion 0\.1.*no pefusion\.sweep\.live\.MLflowLiveCallback"):
        check_tune_state(str(tmp_path), gone)
