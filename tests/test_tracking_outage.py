"""A tracking server that goes away mid-sweep never costs a metric (docs/operations.md).

A real `mlflow server` on 127.0.0.1 is stopped (its whole process group) once the sweep's first trial is recorded,
kept down for OUTAGE seconds and started again on the same port with the same store and artifact folder. The
sweep, a separate process like a user's, must go on training meanwhile, say once that the server is away and once
that it is back, exit 0, and leave in MLflow exactly what a sweep without an outage records: one parent, one child
run per trial, every epoch once with Ray's own values, the final record of the results CSV, the checkpoint.

The short outage runs with `pytest -m system` (CI's second stage); `pytest -m slow` runs the issue's 5 minutes.
Each prints its timings (`-s`). The writer redoes a write the outage cut, whole: the first test cuts each write
of a trial on purpose.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from conftest import REPO, free_port, start_mlflow_server, stop_process_group, subprocess_env
from pefusion import record as R
from pefusion.analysis.formats import csv_ready
from pefusion.tracking import writer
from pefusion.tracking.recorder import SweepRecorder

# Every trial trains all its epochs (no early stop), so the sweep's length is known and epochs_run = EPOCHS.
SPACE = """\
pe_type: {grid: [sinusoidal]}
fusion: {grid: [add]}
seed: {grid: [0]}
early_stopping: false
"""
FINAL = (R.TEST_ACC, R.BEST_VAL_ACC, R.BEST_EPOCH, R.EPOCHS_RUN, R.TEST_MACRO_F1, R.PARAMS, R.LAT_MS_MEAN,
         R.TRAIN_TIME_S)


# --- one write cut by the outage: the writer retries it whole, so every write of a trial must be safe to redo ---

WRITES = ("create_run", "log_batch", "set_tag", "log_artifacts", "set_terminated")


class _CutOnce:
    """An MlflowClient whose `cut`-th write (counting from 1) fails once with what an outage raises: before the
    server sees it ('refused') or after the server made it, the answer lost on the way back ('lost')."""

    def __init__(self, client, cut: int = 0, how: str = "refused"):
        self._client, self.cut, self.how, self.writes = client, cut, how, []

    def __getattr__(self, name):
        method = getattr(self._client, name)
        if name not in WRITES:
            return method

        def write(*args, **kwargs):
            self.writes.append(name)
            cut, self.cut = len(self.writes) == self.cut, self.cut if len(self.writes) != self.cut else 0
            if cut and self.how == "refused":
                raise ConnectionError("Failed to establish a new connection: [Errno 111] Connection refused")
            out = method(*args, **kwargs)
            if cut:
                raise ConnectionError("Connection aborted: Remote end closed connection without response")
            return out
        return write


def _one_trial(recorder: SweepRecorder, checkpoint: Path) -> None:
    """What the Tune callback hands the writer for one trial of two epochs."""
    recorder.later(recorder.trial_run, "t1", {R.PE_TYPE: "sinusoidal", R.FUSION: "add", R.SEED: 0}, "s-add-0")
    recorder.later(recorder.tag_trial, "t1", {R.TAG_NODE: "n1"})
    for epoch in (1, 2):
        recorder.later(recorder.log_epoch, "t1", epoch, {R.TRAIN_LOSS: 1.0 / epoch, R.VAL_ACC: 0.5 + epoch / 10})
    recorder.later(recorder.finish_trial, "t1", {R.STATUS: R.STATUS_OK, R.VAL_ACC: 0.7, R.BEST_VAL_ACC: 0.7,
                                                 R.TEST_ACC: 0.6, R.EPOCHS_RUN: 2}, str(checkpoint))
    recorder.flush()


def test_a_write_cut_anywhere_in_a_trial_is_made_once_when_retried(tmp_path, monkeypatch, capsys):
    """Refused or lost at any write of a trial (create the run, params, node tag, each epoch, the final metrics,
    the final val_acc, the status tag, the checkpoint, the end), the retried write leaves the run exactly as an
    uncut one: params, each epoch once, the final metrics once, FINISHED, the checkpoint; and the two lines.

    The real server test below cuts one of these by chance (the server is stopped as the next trial's run is
    created); here each is cut on purpose, on a sqlite store."""
    # the writer's first retry comes after 1 s; a few ms here
    monkeypatch.setattr(writer, "time", SimpleNamespace(time=time.time, sleep=lambda s: time.sleep(min(s, .02))))
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.pt").write_bytes(b"weights")
    real_client = SweepRecorder.client.fget

    def recorder_cut_at(name: str, cut: int, how: str) -> tuple[SweepRecorder, _CutOnce]:
        recorder = SweepRecorder(f"sqlite:///{tmp_path / 'mlflow.db'}", "pe-fusion", "arxiv_grid", name)
        client = _CutOnce(real_client(recorder), cut, how)
        recorder.__dict__["_cut_client"] = client
        return recorder, client

    # the recorder's writes go through the cutting client once it is set (its setup is not cut)
    monkeypatch.setattr(SweepRecorder, "client", property(lambda self: self.__dict__.get("_cut_client")
                                                          or real_client(self)))
    recorder, counting = recorder_cut_at("uncut", 0, "refused")
    _one_trial(recorder, checkpoint)
    n_writes = len(counting.writes)
    assert n_writes >= 10, counting.writes
    capsys.readouterr()
    problems = []  # every cut that leaves the run different, named
    for how in ("refused", "lost"):
        for cut in range(1, n_writes + 1):
            where = f"{how} at write {cut} ({counting.writes[cut - 1]})"
            recorder, _ = recorder_cut_at(f"{how}{cut}", cut, how)
            _one_trial(recorder, checkpoint)
            err = capsys.readouterr().err
            if err.count("is unreachable") != 1 or err.count("is back after") != 1 or "skipped" in err:
                problems.append((where, err))
            client = real_client(recorder)
            runs = client.search_runs([recorder.experiment_id],
                                      f"tags.`{R.TAG_PARENT}` = '{recorder.parent_run_id}'")
            if len(runs) != 1:
                problems.append((where, f"{len(runs)} runs"))
                continue
            run = runs[0]
            if run.info.status != "FINISHED" or run.data.tags.get(R.TAG_STATUS) != R.STATUS_OK:
                problems.append((where, run.info.status, run.data.tags.get(R.TAG_STATUS)))
            if run.data.params != {R.PE_TYPE: "sinusoidal", R.FUSION: "add", R.SEED: "0"}:
                problems.append((where, "params", run.data.params))
            if run.data.tags.get(R.TAG_NODE) != "n1":
                problems.append((where, "node tag"))
            for name, steps in ((R.TRAIN_LOSS, [1, 2]), (R.VAL_ACC, [1, 2, 3]), (R.TEST_ACC, [0]),
                                (R.EPOCHS_RUN, [0])):
                history = sorted(m.step for m in client.get_metric_history(run.info.run_id, name))
                if history != steps:
                    problems.append((where, name, history))
            if run.data.metrics.get(R.VAL_ACC) != 0.7:
                problems.append((where, "val_acc", run.data.metrics.get(R.VAL_ACC)))
            if [a.path for a in client.list_artifacts(run.info.run_id)] != ["model.pt"]:
                problems.append((where, "no checkpoint"))
    assert not problems, "\n".join(map(str, problems))


# --- what the sweep has done, read from Ray's files and from MLflow ---------------------------------------------


def _ray_progress(exp_dir: Path) -> tuple[int, int]:
    """(epochs reported, trials with their final record) in Ray's result.json files of the experiment."""
    epochs = finished = 0
    for path in exp_dir.glob("*/result.json"):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                report = json.loads(line)
            except json.JSONDecodeError:  # a line being written
                continue
            if R.STATUS in report:
                finished += 1
            elif R.EPOCH in report:
                epochs += 1
    return epochs, finished


def _ray_epochs(exp_dir: Path) -> dict[str, list[dict]]:
    """trial id -> its per-epoch reports, as Ray stored them."""
    out: dict[str, list[dict]] = {}
    for path in exp_dir.glob("*/result.json"):
        reports = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for r in reports:
            if R.STATUS not in r and R.EPOCH in r:
                out.setdefault(r["trial_id"], []).append(r)
    return out


def _finished_children(client) -> int:
    exp = client.get_experiment_by_name("pe-fusion")
    if exp is None:
        return 0
    return len(client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'trial' and "
                                                       f"attributes.status = 'FINISHED'"))


def _wait(what: str, cond, timeout: float, driver: subprocess.Popen | None = None, every: float = 0.5) -> float:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        if driver is not None:
            assert driver.poll() is None, f"the sweep ended while waiting for {what}"
        time.sleep(every)
    return time.time()


def _say(text: str) -> None:
    print(f"[outage {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# --- the test ------------------------------------------------------------------------------------------------


@pytest.mark.subprocess_ray
@pytest.mark.parametrize("outage_s, epochs, fusions, seeds", [
    # sized so that the driver is still running when the server comes back (8 trials of ~2-3 s on 2 CPUs); CI
    # runs it in its second stage (.ci/run), with the other tests that start servers of their own
    pytest.param(15, 10, "add,concat,gate_scalar,mlp_gate", "0,1", id="15s", marks=pytest.mark.system),
    # the measure: 5 minutes, 25 trials of 20 epochs (4-11 min of training at 0.5-1.3 s an epoch: the
    # server comes back mid-sweep, or after the last trial, the driver waiting for it with a line every 30 s)
    pytest.param(300, 20, "add,concat,gate_scalar,gate_cnn,mlp_gate", "0,1,2,3,4", id="5min",
                 marks=[pytest.mark.slow, pytest.mark.timeout(2400)]),
])
def test_a_tracking_server_away_mid_sweep_costs_no_metric(tmp_path, cache_dir, outage_s, epochs, fusions, seeds):
    from mlflow.artifacts import download_artifacts
    from mlflow.tracking import MlflowClient

    port, srv_root = free_port(), tmp_path / "server"
    srv_root.mkdir()
    uri = f"http://127.0.0.1:{port}"
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    n_trials = len(fusions.split(",")) * len(seeds.split(","))
    cmd = [sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), "--preset", "arxiv", "--synthetic", "--smoke",
           "--search-space", str(space), "--epochs", str(epochs), "--pe-types", "sinusoidal", "--fusions", fusions,
           "--seeds", seeds, "--max-concurrent", "1", "--num-cpus", "2", "--no-dashboard", "--tracking-uri", uri,
           "--cache-dir", str(cache_dir), "--name", "outage"]
    exp_dir = tmp_path / "ray_results" / "outage"
    out_path, err_path = tmp_path / "driver.out", tmp_path / "driver.err"
    server = start_mlflow_server(port, srv_root)
    try:  # the server, whichever is up, is stopped however the test ends
        client = MlflowClient(uri)
        t = {"start": time.time()}
        with open(out_path, "w") as out, open(err_path, "w") as err:
            # the parent's system metrics (MLflow's monitor, its own writer) sampled every second, not every 10 s
            env = subprocess_env(MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL="1")
            driver = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            # the first trial's child run is FINISHED on the server: stop the server, its whole process group
            t["first_recorded"] = _wait("the first trial's run", lambda: _finished_children(client) >= 1, 600, driver)
            before = _ray_progress(exp_dir)
            stop_process_group(server, port)
            t["stopped"] = time.time()
            _say(f"server stopped {t['stopped'] - t['start']:.0f} s into the sweep (in "
                 f"{t['stopped'] - t['first_recorded']:.1f} s); Ray had {before[0]} epochs, "
                 f"{before[1]} trials finished")
            while time.time() - t["stopped"] < outage_s:
                time.sleep(1)
            during = _ray_progress(exp_dir)
            driver_alive_at_restart = driver.poll() is None
            server = start_mlflow_server(port, srv_root)
            t["restarted"] = time.time()
            _say(f"server answers again {t['restarted'] - t['stopped']:.0f} s after it stopped; Ray has "
                 f"{during[0]} epochs, {during[1]} trials finished; driver "
                 f"{'running' if driver_alive_at_restart else 'exited'}")

            # the driver says the server is back (at its first write made), then catches up: every trial Ray had
            # finished by the restart is FINISHED in MLflow (a driver that exits without either fails below)
            deadline = time.time() + 600
            while "caught_up" not in t or "back_line" not in t:
                now, ended = time.time(), driver.poll() is not None
                assert now < deadline, f"no catching up in 600 s: {err_path.read_text()[-2000:]}"
                if "back_line" not in t and "is back after" in err_path.read_text():
                    t["back_line"] = now
                if "caught_up" not in t and _finished_children(client) >= during[1]:
                    t["caught_up"] = now
                if ended:
                    break
                time.sleep(0.25)
            driver.wait(timeout=1800)
            t["exited"] = time.time()
        finally:
            if driver.poll() is None:
                driver.send_signal(signal.SIGTERM)
                try:
                    driver.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(driver.pid, signal.SIGKILL)
                    driver.wait()
        stdout, stderr = out_path.read_text(), err_path.read_text()
        since = {k: f"{t[k] - t['restarted']:.1f} s" if k in t else "never" for k in ("caught_up", "back_line")}
        _say(f"caught up {since['caught_up']} after the restart ('back' line after {since['back_line']}); "
             f"driver exited {t['exited'] - t['restarted']:.0f} s after "
             f"the restart, {t['exited'] - t['start']:.0f} s in all; during the outage Ray reported "
             f"{during[0] - before[0]} epochs and finished {during[1] - before[1]} of {n_trials} trials; "
             f"{stderr.count('waiting for the MLflow tracking store')} 'waiting' lines; {n_trials - during[1]} "
             f"trials finished after the restart")
        for line in stderr.splitlines():
            if "MLflow tracking store" in line:
                _say(f"driver: {line}")

        # the sweep went on while the server was away, and ended well
        assert driver.returncode == 0, stdout[-3000:] + stderr[-3000:]
        assert during[0] > before[0] and during[1] > before[1], (before, during)
        assert stderr.count("is unreachable; the sweep goes on") == 1, stderr[-3000:]
        assert stderr.count("is back after") == 1, stderr[-3000:]
        assert "MLflow write skipped" not in stderr, stderr[-3000:]
        assert "View run" not in stdout and "View experiment" not in stdout, stdout[-3000:]

        # MLflow holds what a sweep without an outage records
        rows = pd.read_csv(tmp_path / "results" / "outage_results_by_seed.csv").set_index("trial_id")
        assert len(rows) == n_trials and (rows[R.STATUS] == R.STATUS_OK).all(), rows[R.STATUS]
        assert (rows[R.EPOCHS_RUN] == epochs).all()
        stored = _ray_epochs(exp_dir)
        exp = client.get_experiment_by_name("pe-fusion")
        parents = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        parent = parents[0]
        assert parent.data.metrics["n_trials"] == n_trials and parent.data.metrics["n_failed"] == 0
        assert {a.path for a in client.list_artifacts(parent.info.run_id, R.ARTIFACT_RESULTS_DIR)} >= {
            f"{R.ARTIFACT_RESULTS_DIR}/outage_results_by_seed.csv"}
        children = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent.info.run_id}'",
                                      max_results=1000)
        assert sorted(c.data.tags[R.TAG_TRIAL_ID] for c in children) == sorted(rows.index)  # one run per trial
        assert len(client.search_runs([exp.experiment_id], "", max_results=1000)) == n_trials + 1
        for child in children:
            run_id, trial_id = child.info.run_id, child.data.tags[R.TAG_TRIAL_ID]
            row = rows.loc[trial_id]
            assert child.info.status == "FINISHED" and child.data.tags[R.TAG_STATUS] == R.STATUS_OK, trial_id
            assert child.data.params[R.FUSION] == row[R.FUSION] and int(child.data.params[R.SEED]) == row[R.SEED]
            # every epoch once, with the value Ray stored for it
            reports = {r[R.EPOCH]: r for r in stored[trial_id]}
            assert sorted(reports) == list(range(1, epochs + 1)), (trial_id, sorted(reports))
            for name, last_step in ((R.TRAIN_LOSS, epochs), (R.VAL_LOSS, epochs), (R.VAL_ACC, epochs + 1)):
                history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))
                assert [s for s, _ in history] == list(range(1, last_step + 1)), (trial_id, name, history)
                for step, value in history[:epochs]:
                    assert value == pytest.approx(reports[step][name], rel=1e-12), (trial_id, name, step)
            # the final record: the CSV's row (which names each column's unit and rounds it); val_acc's run value
            # is the restored best checkpoint's
            logged = csv_ready(pd.DataFrame([{name: child.data.metrics[name] for name in FINAL}])).iloc[0]
            for name, value in logged.items():
                assert float(row[name]) == pytest.approx(float(value), rel=1e-12), (trial_id, name)
            for name in FINAL:
                assert len(client.get_metric_history(run_id, name)) == 1, (trial_id, name)
            assert child.data.metrics[R.VAL_ACC] == child.data.metrics[R.BEST_VAL_ACC]
            # the checkpoint reached the server's artifact store, and loads as the model's weights
            model = download_artifacts(run_id=run_id, tracking_uri=uri,
                                       artifact_path=f"{R.ARTIFACT_CHECKPOINT_DIR}/model.pt",
                                       dst_path=str(tmp_path / "dl" / run_id))
            assert "head.weight" in torch.load(model, weights_only=True)
        assert not (tmp_path / "mlartifacts").exists()  # artifacts went to the server, not the working directory

        # What the machine did, on the parent run: sampled before the outage, each step once, and again once the
        # server was back (its monitor, which ends in an outage, started anew) when the sweep trained on after it.
        cpu = client.get_metric_history(parent.info.run_id, R.SYSTEM_CPU)
        steps = sorted(m.step for m in cpu)
        after = [m for m in cpu if m.timestamp > t["back_line"] * 1000]
        _say(f"system metrics: {len(cpu)} samples, {len(after)} after the 'back' line, "
             f"which came {t['exited'] - t['back_line']:.0f} s before the driver exited")
        assert steps == list(range(len(steps))) and any(m.timestamp < t["stopped"] * 1000 for m in cpu), steps
        if t["exited"] - t["back_line"] > 5:
            assert after, [(m.step, m.timestamp) for m in cpu]
    finally:
        stop_process_group(server, port)
