"""The MLflow recorder across a driver restart: a driver killed anywhere inside a trial's finish leaves no run
RUNNING once the sweep is resumed (the SIGKILL test in test_sweep_processes.py hits these windows by chance;
here each one is set up on purpose on a real sqlite store)."""
from __future__ import annotations

import json
import pickle
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from pefusion import record as R
from pefusion.tracking.callbacks import MLflowRuns
from pefusion.tracking.recorder import SweepRecorder

FINAL = {R.STATUS: R.STATUS_OK, R.TEST_ACC: 0.75, R.EPOCHS_RUN: 2}


@pytest.fixture
def recorder(tmp_path) -> SweepRecorder:
    return SweepRecorder(f"sqlite:///{tmp_path}/mlflow.db", "pe-fusion", "arxiv_grid", str(tmp_path / "sweep"))


def _trial(trial_id: str, status: str = "TERMINATED", result: dict | None = None) -> SimpleNamespace:
    """The attributes of a Tune Trial that the callback reads."""
    return SimpleNamespace(trial_id=trial_id, status=status, config={R.SEED: 0}, checkpoint=None, error_file=None,
                           last_result={R.EPOCH: 2, **(FINAL if result is None else result)}, metric_analysis={},
                           get_error=lambda: "Traceback (most recent call last):\nRuntimeError: boom")


def _started(recorder: SweepRecorder, trial_id: str) -> str:
    run_id = recorder.trial_run(trial_id, {R.SEED: 0})
    for epoch in (1, 2):
        recorder.log_epoch(trial_id, epoch, {R.VAL_ACC: 0.5 + epoch / 10})
    return run_id


class _Restarted(MLflowRuns):
    """The driver's MLflow callback in a new driver (its recorder unpickled: no in-memory run state); each
    event waits for its MLflow writes, as the test reads them at once."""

    def complete(self, trial, trials):
        self.on_trial_complete(0, trials, trial)
        self.recorder.flush()

    def end(self, trials):
        self.on_experiment_end(trials)
        self.recorder.flush()


def _unfinished(recorder: SweepRecorder) -> set[str]:
    """Trial ids whose child run MLflow still holds RUNNING (asked here, not through the recorder)."""
    runs = recorder.client.search_runs([recorder.experiment_id], "attributes.status = 'RUNNING' and "
                                       f"tags.`{R.TAG_PARENT}` = '{recorder.parent_run_id}'")
    return {r.data.tags[R.TAG_TRIAL_ID] for r in runs}


def _restarted(recorder: SweepRecorder) -> LiveSweep:
    return _Restarted(pickle.loads(pickle.dumps(recorder)), {}, lambda config: "")


def test_finish_interrupted_after_the_status_tag_is_redone_when_the_trial_reports_again(recorder):
    run_id = _started(recorder, "t1")
    recorder.client.set_tag(run_id, R.TAG_STATUS, R.STATUS_OK)  # killed here, before set_terminated
    callback = _restarted(recorder)
    assert _unfinished(callback.recorder) == {"t1"}
    callback.complete(_trial("t1"), [])  # the restored trial re-reports its saved final record
    run = recorder.client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics[R.TEST_ACC] == 0.75
    assert _unfinished(callback.recorder) == set()


def test_trials_tune_had_concluded_are_finished_at_experiment_end_and_others_left_alone(recorder):
    done, cut, failed, pending = (_started(recorder, t) for t in ("done", "cut", "failed", "pending"))
    recorder.finish_trial("done", FINAL)
    recorder.client.set_tag(cut, R.TAG_STATUS, R.STATUS_OK)  # killed mid-finish
    callback = _restarted(recorder)
    callback.end([_trial("done"), _trial("cut"), _trial("failed", "ERROR", {}),
                                _trial("pending", "PENDING", {})])
    client: MlflowClient = recorder.client
    status = {k: client.get_run(r).info.status for k, r in
              {"done": done, "cut": cut, "failed": failed, "pending": pending}.items()}
    assert status == {"done": "FINISHED", "cut": "FINISHED", "failed": "FAILED", "pending": "RUNNING"}
    assert client.get_run(failed).data.tags[R.TAG_STATUS] == R.STATUS_ERROR
    assert client.get_run(failed).data.tags[R.TAG_ERROR] == "RuntimeError: boom"
    # the run finished before the restart was not written again; the redone one has its final metrics once more
    assert len(client.get_metric_history(done, R.TEST_ACC)) == 1
    assert client.get_run(cut).data.metrics[R.TEST_ACC] == 0.75
    # epochs are never re-logged by a finish
    assert [m.step for m in client.get_metric_history(cut, R.VAL_ACC)] == [1, 2]


def test_final_val_acc_is_the_runs_value_and_a_redone_finish_logs_it_once(recorder):
    """The record's val_acc (the restored best epoch's: epoch 1 here, below the last epoch's) is what MLflow
    gives as the run's val_acc, logged one step past the epochs; a finish cut by a driver kill after its
    metrics, and redone by the restarted driver, does not log it a second time."""
    run_id = recorder.trial_run("t1", {R.SEED: 0})
    for epoch, acc in ((1, 0.8), (2, 0.7)):
        recorder.log_epoch("t1", epoch, {R.VAL_ACC: acc})
    record = {**FINAL, R.VAL_ACC: 0.8, R.BEST_VAL_ACC: 0.8, R.BEST_EPOCH: 1}
    recorder.finish_trial("t1", record)
    client: MlflowClient = recorder.client
    assert client.get_run(run_id).data.metrics[R.VAL_ACC] == 0.8
    history = [(m.step, m.value) for m in client.get_metric_history(run_id, R.VAL_ACC)]
    assert sorted(history) == [(1, 0.8), (2, 0.7), (3, 0.8)]

    client.delete_tag(run_id, R.TAG_STATUS)  # as if killed after the metrics, before the tag and the status
    client.update_run(run_id, status="RUNNING")
    callback = _restarted(recorder)
    callback.complete(_trial("t1", result=record), [])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics[R.VAL_ACC] == 0.8
    assert sorted(m.step for m in client.get_metric_history(run_id, R.VAL_ACC)) == [1, 2, 3]


def test_a_trial_whose_writes_were_all_lost_is_written_from_what_ray_stored(recorder, tmp_path):
    """A driver stopped while the tracking server was away loses its queued writes: a trial Ray finished may have
    no MLflow run at all. The resumed driver makes it from Ray's stored results: every epoch, the final record."""
    from pyarrow import fs

    folder = tmp_path / "trial"
    folder.mkdir()
    epochs = [{R.EPOCH: e, R.TRAIN_LOSS: 1.0 / e, R.VAL_ACC: 0.5 + e / 10} for e in (1, 2)]
    (folder / "result.json").write_text("\n".join(json.dumps(r) for r in [*epochs, {**FINAL, R.EPOCH: 2}]) + "\n")
    trial = _trial("lost")
    trial.storage = SimpleNamespace(storage_filesystem=fs.LocalFileSystem(), trial_fs_path=str(folder))
    callback = _restarted(recorder)
    callback.end([trial])
    (run,) = recorder.client.search_runs([recorder.experiment_id], f"tags.`{R.TAG_TRIAL_ID}` = 'lost'")
    assert run.info.status == "FINISHED" and run.data.metrics[R.TEST_ACC] == 0.75
    history = recorder.client.get_metric_history(run.info.run_id, R.TRAIN_LOSS)
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 0.5)]


# --- what the machine did: MLflow's system metrics on the parent run -----------------------------------------


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _wait_for(what: str, cond, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _mem_total_mb() -> float:
    """This machine's memory, read from /proc/meminfo (not through psutil, which MLflow's monitor uses)."""
    line = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal:"))
    return int(line.split()[1]) * 1024 / 1e6


def test_the_parent_run_gets_cpu_and_ram_system_metrics_and_a_resume_goes_on(tmp_path, monkeypatch, capsys):
    """MLflow's own monitor samples the machine onto the sweep's parent run while it is open: CPU and RAM on a
    machine without nvidia-ml-py (psutil is Ray's copy, importable in every driver since it imports Ray), no GPU
    series and no line about them. Stopped with the interrupted sweep, it starts again on the parent the resumed
    sweep reopens, one sample per step, on from the last."""
    import ray  # noqa: F401  (what puts Ray's psutil on the path, as in a driver)

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    uri, path = f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "sweep")
    client = MlflowClient(uri)
    first = SweepRecorder(uri, "pe-fusion", "arxiv_grid", path, system_metrics=True, announce=True)
    run_id = first.parent_run_id
    _wait_for("two samples", lambda: len(_history(client, run_id, R.SYSTEM_CPU)) >= 2)
    first.interrupt_sweep()
    before = len(_history(client, run_id, R.SYSTEM_CPU))
    resumed = SweepRecorder(uri, "pe-fusion", "arxiv_grid", path, system_metrics=True)
    assert resumed.parent_run_id == run_id
    _wait_for("two more samples", lambda: len(_history(client, run_id, R.SYSTEM_CPU)) >= before + 2)
    resumed.finish_sweep({"n_trials": 0})
    stopped = {key: _history(client, run_id, key) for key in (R.SYSTEM_CPU, R.SYSTEM_RAM_MB, R.SYSTEM_RAM_PCT)}
    time.sleep(0.6)
    assert {key: _history(client, run_id, key) for key in stopped} == stopped  # nothing after the run ended

    cpu, ram_mb, ram_pct = stopped.values()
    steps = [step for step, _ in cpu]
    assert steps == list(range(len(steps))) and len(steps) >= before + 2  # each step once, across the resume
    assert [s for s, _ in ram_mb] == steps == [s for s, _ in ram_pct]
    assert all(0 <= value <= 100 for _, value in cpu)
    total = _mem_total_mb()
    for (_, mb), (_, pct) in zip(ram_mb, ram_pct):
        assert 0 < mb < total and pct == pytest.approx(100 * mb / total, abs=0.2)
    metrics = client.get_run(run_id).data.metrics
    assert not [key for key in metrics if key.startswith(R.SYSTEM_PREFIX + "gpu")]
    assert "system metrics" not in capsys.readouterr().out


def _fake_nvml(util: list[int], used_gb: list[float]) -> types.ModuleType:
    """The calls of nvidia-ml-py's `pynvml` that MLflow's GPU monitor makes, for len(util) devices of 80 GB."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = type("NVMLError", (Exception,), {})
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetCount = lambda: len(util)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=used_gb[h] * 1e9, total=80e9)
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=util[h])
    nvml.nvmlDeviceGetPowerUsage = lambda h: 300_000
    nvml.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    return nvml


def test_the_parent_run_gets_gpu_system_metrics_where_nvidia_ml_py_is_importable(tmp_path, monkeypatch, capsys):
    """With nvidia-ml-py (here a stand-in for two devices, as no GPU is here), each GPU's utilisation and memory
    join CPU and RAM on the parent run, and one line says what the utilisation is."""
    import ray  # noqa: F401
    from mlflow.system_metrics.metrics import gpu_monitor

    nvml = _fake_nvml(util=[73, 5], used_gb=[40.0, 2.5])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(gpu_monitor, "pynvml", nvml, raising=False)  # bound when MLflow's module was imported
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    recorder = SweepRecorder(uri, "pe-fusion", "arxiv_grid", str(tmp_path / "sweep"), system_metrics=True,
                             announce=True)
    run_id = recorder.parent_run_id
    busy = [R.system_gpu(i, R.GPU_UTILISATION) for i in (0, 1)]
    _wait_for("two samples", lambda: len(_history(client, run_id, busy[1])) >= 2)
    recorder.finish_sweep({"n_trials": 0})
    assert {v for _, v in _history(client, run_id, busy[0])} == {73.0}
    assert {v for _, v in _history(client, run_id, busy[1])} == {5.0}
    assert {v for _, v in _history(client, run_id, R.system_gpu(0, R.GPU_MEMORY_MB))} == {40_000.0}
    assert {v for _, v in _history(client, run_id, R.system_gpu(1, R.GPU_MEMORY_MB))} == {2_500.0}
    assert _history(client, run_id, R.SYSTEM_CPU)
    out = capsys.readouterr().out
    assert f"MLflow system metrics: 2 GPU(s) on the parent run every 0.2 s; {R.GPU_BUSY_LABEL}\n" in out


def test_the_card_time_of_an_interrupted_and_resumed_sweep_adds_up_on_its_parent_run(tmp_path):
    """Each invocation adds its wall seconds, and their card time on the cluster's GPUs, to the parent run's: 120 s
    on 2 GPUs, interrupted, then 60 s on 1 GPU: 180 s and (240 + 60) / 3600 card-hours, the last cluster's GPUs."""
    uri, path = f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "sweep")
    first = SweepRecorder(uri, "pe-fusion", "arxiv_grid", path)
    first.log_card_time(120.0, 2.0)
    first.interrupt_sweep()
    resumed = SweepRecorder(uri, "pe-fusion", "arxiv_grid", path)
    resumed.log_card_time(60.0, 1.0)
    resumed.finish_sweep({"n_trials": 0})
    metrics = MlflowClient(uri).get_run(first.parent_run_id).data.metrics
    assert (metrics[R.SWEEP_WALL_S], metrics[R.CLUSTER_GPUS]) == (180.0, 1.0)
    assert metrics[R.CARD_HOURS] == pytest.approx(300.0 / 3600)
