"""What a sweep promises when things fail (docs/operations.md), as a user meets it: Ctrl-C or SIGTERM then the printed
`--resume` command, a request no node can hold, a trial process killed mid-training, a trial whose own code raises,
progress lines.

Process behaviour (signals, exit codes, what is printed) is tested on real driver processes; the rest on a real
local Ray in this process. MLflow is a real sqlite store throughout.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from conftest import REPO, subprocess_env
from pefusion import record as R
from study_names import EPOCH_METRICS, TIMING_COLUMNS, TIMING_METRICS

GRID = ["--preset", "arxiv", "--synthetic", "--smoke", "--epochs", "8", "--pe-types", "sinusoidal,learned",
        "--fusions", "add,concat", "--seeds", "0", "--max-concurrent", "1", "--num-cpus", "2", "--no-dashboard"]
# The same 4 cells with 2 seeds each trained together: 4 trials carrying 8 runs.
STACKED = [*GRID[:GRID.index("--seeds")], "--seeds", "0,1", "--stack-seeds", *GRID[GRID.index("--seeds") + 2:]]
GRIDS = {"separate": (GRID, 1), "stacked": (STACKED, 2)}  # the flags, and the runs each trial carries
INTERRUPTED_LINE = re.compile(r"^interrupted: (\d+) of (\d+) (?:trials?|runs?) finished \((\d+) running, (\d+) "
                              r"pending\); continue with: (.+)$")


def _start(cwd: Path, args: list[str]) -> subprocess.Popen:
    """`python sweeps/arxiv_grid.py ARGS` in `cwd`, as a user starts it (stdout and stderr piped)."""
    return subprocess.Popen([sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), *args], cwd=cwd,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run(cwd: Path, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), *args], cwd=cwd,
                          env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


def _mlflow(db: Path) -> dict:
    """Parent and child runs of the one sweep in `db`: {"parent": run, "children": {(pe, fusion, seed): run}}."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("pe-fusion")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
    children = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent.info.run_id}'")
    keyed = {(c.data.params[R.PE_TYPE], c.data.params[R.FUSION], c.data.params[R.SEED]): c for c in children}
    assert len(keyed) == len(children), "two child runs for one trial"
    return {"client": client, "parent": parent, "children": keyed}


def _history(client, run, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def _comparable(csv: Path) -> pd.DataFrame:
    df = pd.read_csv(csv)
    return df.drop(columns=[c for c in TIMING_COLUMNS if c in df]).reset_index(drop=True)


def _ray_configs(experiment: Path) -> dict[str, dict]:
    """trial id -> the config Ray itself stored for it (params.json of its folder): the truth a CSV row is
    checked against (a stacked trial's seed is the list of its runs' seeds)."""
    configs = {}
    for folder in experiment.glob("pefusion_trainable_*"):
        params = folder / "params.json"
        if params.exists():
            trial_id = "_".join(folder.name.split("_")[2:4])
            configs[trial_id] = json.loads(params.read_text())
    return configs


def _wait_for_a_trial_mid_training(experiment: Path, driver: subprocess.Popen, timeout: float = 120) -> None:
    """Return once a trial of the experiment has reported an epoch (so it has a checkpoint) and not its final
    record, as Ray stored them (result.json)."""
    deadline = time.time() + timeout
    while True:
        for path in experiment.glob("pefusion_trainable_*/result.json"):
            reports = _whole_json(path.read_text().splitlines())
            if any(R.EPOCH in r for r in reports) and not any(R.STATUS in r for r in reports):
                return
        assert driver.poll() is None, "the sweep ended before a next trial trained"
        assert time.time() < deadline, "no trial mid-training in time"
        time.sleep(0.1)


def _whole_json(lines: list[str]) -> list[dict]:
    """The lines that parse (the line Ray is writing may not yet)."""
    out = []
    for line in filter(str.strip, lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache_dir):
    """The sweep of GRIDS[variant] run to its end without interruption (and with -q), once per variant for both
    signals."""
    made: dict[str, SimpleNamespace] = {}

    def sweep(variant: str) -> SimpleNamespace:
        if variant not in made:
            folder = tmp_path_factory.mktemp(f"uninterrupted_{variant}")
            db = folder / "full.db"
            proc = _run(folder, [*GRIDS[variant][0], "--name", "full", "-q", "--tracking-uri", f"sqlite:///{db}",
                                 "--cache-dir", str(cache_dir)])
            assert proc.returncode == 0, proc.stderr[-3000:]
            made[variant] = SimpleNamespace(db=db, csv=folder / "results" / "full_results_by_seed.csv",
                                            stdout=proc.stdout)
        return made[variant]

    return sweep


@pytest.mark.subprocess_ray
# SIGTERM goes through the handler Ctrl-C uses (`_sigterm_as_ctrl_c`), so the default suite runs it alone; the
# SIGINT run (~70 s) is `-m slow`, and so is the stacked one (~60 s): CPU sweeps train separately by default, and
# test_sweeps' stacked grid checks a stacked trial's runs in every record.
@pytest.mark.parametrize("sig,variant", [pytest.param(signal.SIGINT, "separate", marks=pytest.mark.slow),
                                         (signal.SIGTERM, "separate"),
                                         pytest.param(signal.SIGTERM, "stacked", marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGTERM", "SIGTERM-stacked"])
def test_interrupt_then_printed_resume_equals_an_uninterrupted_sweep(tmp_path, cache_dir, uninterrupted, sig,
                                                                     variant):
    """The first Ctrl-C (or SIGTERM) mid-sweep: exit 130 and one line with the exact --resume command; the CSV
    lists every run Tune made with its own configuration, nothing unfinished as finished (no 'stopped'), the
    unfinished runs and the parent not FINISHED. The printed command then ends with the CSV and MLflow of an
    uninterrupted sweep, timing aside: the same child runs, FINISHED, with the same values and each epoch once.
    A sweep run with -q prints no progress line; the interrupted one printed one per trial end. `stacked`: the
    trials carry 2 seeds each, trained together, every seed its own run."""
    grid, per_trial = GRIDS[variant]
    reference = uninterrupted(variant)
    full_db, cut_db = reference.db, tmp_path / "cut.db"
    assert not re.search(r"^\[\d\d:\d\d:\d\d\]", reference.stdout, re.M), reference.stdout

    args = [*grid, "--name", "cut", "--tracking-uri", f"sqlite:///{cut_db}", "--cache-dir", str(cache_dir)]
    driver = _start(tmp_path, args)
    lines = []
    for line in driver.stdout:  # the progress line of the first trial's end
        lines.append(line)
        if " 1/4 done " in line:
            break
    _wait_for_a_trial_mid_training(tmp_path / "ray_results" / "cut", driver)
    driver.send_signal(sig)
    out, err = driver.communicate(timeout=120)
    lines += out.splitlines(keepends=True)
    assert driver.returncode == 130, err[-3000:]
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    match = INTERRUPTED_LINE.match(last)
    assert match, err[-3000:]
    finished, n, running, pending = map(int, match.groups()[:4])
    runs = 4 * per_trial
    assert n == runs and finished >= 1 and finished + running + pending == runs and running <= per_trial
    # the command as it was run, every path absolute (the storage and results folders of the working folder
    # named), pasted below as is
    portable = [*grid, "--name", "cut", "--tracking-uri", f"sqlite:///{cut_db}", "--cache-dir",
                str(Path(cache_dir).resolve())]
    assert shlex.split(match.group(5))[1:] == [str(REPO / "sweeps" / "arxiv_grid.py"), *portable, "--storage-path",
                                               str(tmp_path.resolve() / "ray_results"), "--out",
                                               str(tmp_path.resolve() / "results"), "--resume"]
    progress = [ln for ln in lines if re.match(r"^\[\d\d:\d\d:\d\d\] \d/4 done", ln)]
    # a trial's end names it by what the grid varies (…; learned add: ok, test 22.0 %, a stacked one's seeds too:
    # learned add seed 0,1: ok, test 22.0 % | ok, test 25.0 %); a periodic line names none
    ended = [ln for ln in progress if re.search(r"; (sinusoidal|learned) (add|concat)( seed 0,1)?: ", ln)]
    each = r"ok, test \d+\.\d %"
    assert len(ended) * per_trial >= finished, lines
    assert all(re.search(rf": {each}( \| {each}){{{per_trial - 1}}}$", ln.strip()) for ln in ended), lines

    rows = pd.read_csv(tmp_path / "results" / "cut_results_by_seed.csv")
    truth = _ray_configs(tmp_path / "ray_results" / "cut")
    for row in rows.itertuples():
        trial = truth[row.trial_id.split("/")[0]]  # a stacked run's key: <trial id>/seed=<its seed>
        config = {**trial, R.SEED: row.seed} if isinstance(trial[R.SEED], list) else trial
        assert row.seed in (trial[R.SEED] if isinstance(trial[R.SEED], list) else [trial[R.SEED]])
        assert {k: getattr(row, k) for k in config} == config, row.trial_id
    assert R.STATUS_STOPPED not in set(rows[R.STATUS])
    assert (rows[R.STATUS] == R.STATUS_OK).sum() == finished
    assert (rows[R.STATUS] == R.STATUS_INTERRUPTED).sum() == running
    cut = _mlflow(cut_db)
    assert cut["parent"].info.status == "KILLED"
    for run in cut["children"].values():
        tag = run.data.tags[R.TAG_STATUS]
        assert (run.info.status, tag) in {("FINISHED", R.STATUS_OK), ("KILLED", R.STATUS_INTERRUPTED)}, tag
    assert sum(r.info.status == "FINISHED" for r in cut["children"].values()) == finished

    resumed = subprocess.run(match.group(5), shell=True, cwd=tmp_path, env=subprocess_env(), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    pd.testing.assert_frame_equal(_comparable(tmp_path / "results" / "cut_results_by_seed.csv"),
                                  _comparable(reference.csv))
    ref, got = _mlflow(full_db), _mlflow(cut_db)
    assert got["parent"].info.status == "FINISHED" and set(got["children"]) == set(ref["children"])
    for key, want in ref["children"].items():
        run = got["children"][key]
        assert run.info.status == "FINISHED" and run.data.tags[R.TAG_STATUS] == R.STATUS_OK, key
        assert run.data.params == want.data.params, key
        drop = lambda m: {k: v for k, v in m.items() if k not in TIMING_METRICS}  # noqa: E731
        assert drop(run.data.metrics) == drop(want.data.metrics), key
        for metric in EPOCH_METRICS:  # each epoch once, with the uninterrupted sweep's values
            assert _history(got["client"], run, metric) == _history(ref["client"], want, metric), (key, metric)
        artifacts = {a.path for a in got["client"].list_artifacts(run.info.run_id)}
        assert R.ARTIFACT_CHECKPOINT_DIR in artifacts and R.ARTIFACT_LENGTH_BUCKETS in artifacts


@pytest.mark.subprocess_ray
@pytest.mark.parametrize("flags,message", [
    (["--gpus-per-trial", "0.5", "--num-gpus", "0"],
     "--gpus-per-trial 0.5 but the cluster has no GPU; declare logical GPUs with --num-gpus N or leave the flag out"),
    (["--cpus-per-trial", "4", "--num-cpus", "2"],
     "--cpus-per-trial 4 but the largest node has 2 CPUs; lower --cpus-per-trial or declare more with --num-cpus N"),
], ids=["gpu", "cpu"])
def test_a_request_no_node_can_hold_exits_2_in_one_line(tmp_path, cache_dir, flags, message):
    """Refused before any trial starts, within 30 s, in one line naming the flag and what the cluster has;
    no MLflow run is made."""
    db = tmp_path / "m.db"
    start = time.time()
    proc = _run(tmp_path, ["--preset", "arxiv", "--synthetic", "--smoke", "--no-dashboard", *flags,
                           "--tracking-uri", f"sqlite:///{db}", "--cache-dir", str(cache_dir)], timeout=120)
    elapsed = time.time() - start
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert elapsed < 30, elapsed
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: {message}"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    if db.exists():
        import sqlite3

        with sqlite3.connect(db) as con:
            assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


@pytest.mark.subprocess_ray
def test_a_tracking_store_that_cannot_be_opened_ends_the_sweep_in_one_line(tmp_path, cache_dir):
    """The store is opened while Ray starts the trials (`SweepRecorder(wait=False)`): one that cannot be used
    (here a file that is not a database) still ends the command with one line and exit 2, not a traceback
    from the writer thread, and no trial outlives it."""
    db = tmp_path / "m.db"
    db.write_text("not a database\n")
    proc = _run(tmp_path, ["--preset", "arxiv", "--synthetic", "--smoke", "--no-dashboard",
                           "--tracking-uri", f"sqlite:///{db}", "--cache-dir", str(cache_dir)], timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: cannot use the MLflow tracking store sqlite:///{db}: (sqlite3.DatabaseError) file "
                      f"is not a database"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "MLflow write skipped" not in proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.subprocess_ray
def test_autoscaling_waits_for_the_request_instead_of_refusing_it(tmp_path, cache_dir):
    """With --autoscaling the same request passes the check and waits for a node (Ray's to provide); Ctrl-C
    then stops it like any sweep: exit 130 with its --resume line, the trial pending."""
    proc = _start(tmp_path, ["--preset", "arxiv", "--synthetic", "--smoke", "--no-dashboard", "--autoscaling",
                             "--cpus-per-trial", "4", "--num-cpus", "2", "--name", "wait",
                             "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--cache-dir", str(cache_dir)])
    for line in proc.stdout:
        if line.startswith("MLflow:"):  # printed after the resource check
            break
    time.sleep(3)
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    match = INTERRUPTED_LINE.match([ln for ln in err.splitlines() if ln.strip()][-1])
    assert match and match.group(1) == "0" and match.group(3) == "0", err[-2000:]


# --- in-process: a real local Ray, sqlite MLflow ---------------------------------------------------------------


def _options(tmp: Path, **kw):
    from pefusion.sweep.options import SweepOptions

    return SweepOptions(sweep="arxiv_grid", experiment="pe-fusion", storage_path=str(tmp / "ray_results"),
                        dashboard=False, verbose=0, progress=False, name="s", **kw)


def _grid(**axes):
    from pefusion.fusion.config import RULES
    from pefusion.sweep.space import parse_search_space

    return parse_search_space({k: {"grid": v} for k, v in axes.items()}, RULES)


def _sweep(corpus, preset, space, opts, trainable):
    from pefusion.fusion.study import pefusion_study
    from pefusion.sweep.driver import run_sweep

    study = pefusion_study("arxiv_grid", "smoke", preset, space, opts.cpus_per_trial, corpus=corpus,
                           trainable=trainable)
    return run_sweep(study, opts, Path(opts.storage_path).parent / "results")


def _children(parent_run_id: str):
    from mlflow.tracking import MlflowClient

    from pefusion.tracking.store import resolve_tracking_uri

    client = MlflowClient(resolve_tracking_uri())
    exp = client.get_experiment_by_name("pe-fusion")
    return client, client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent_run_id}'")


def test_a_trial_whose_own_code_raises_runs_once_and_is_recorded_once(local_ray, in_tmp, smoke_preset,
                                                                       smoke_corpus):
    """With --max-failures 2, an exception of the trial's code is not retried: the trial ran once, its row and
    its FAILED child run carry the exception's line, and the other trial is unaffected."""
    from pefusion.fusion.trainable import pefusion_trainable

    calls = in_tmp / "calls"

    def raising(config, **kwargs):
        with open(calls, "a") as f:
            f.write(f"{config[R.SEED]}\n")
        if config[R.SEED] == 1:
            raise ValueError("bad value 7")
        return pefusion_trainable(config, **kwargs)

    result = _sweep(smoke_corpus, smoke_preset, _grid(seed=[0, 1]), _options(in_tmp, max_failures=2), raising)
    assert sorted(calls.read_text().split()) == ["0", "1"]  # each trial's code ran once
    by_seed = result.rows.set_index(R.SEED)
    assert by_seed.loc[1, R.STATUS] == R.STATUS_ERROR and by_seed.loc[1, R.ERROR] == "ValueError: bad value 7"
    assert by_seed.loc[0, R.STATUS] == R.STATUS_OK
    _, runs = _children(result.parent_run_id)
    failed = [r for r in runs if r.info.status == "FAILED"]
    assert len(runs) == 2 and len(failed) == 1
    assert failed[0].data.tags[R.TAG_STATUS] == R.STATUS_ERROR
    assert failed[0].data.tags[R.TAG_ERROR] == "ValueError: bad value 7"


# The stacked case (~17 s) is `-m slow`: it restarts through the same checkpoint path, with every seed's state in it.
@pytest.mark.parametrize("seeds,stack", [([0], False), pytest.param([0, 1], True, marks=pytest.mark.slow)],
                         ids=["trial", "stacked"])
def test_a_trial_process_killed_mid_training_resumes_from_its_checkpoint(local_ray, in_tmp, smoke_preset,
                                                                          smoke_corpus, seeds, stack):
    """SIGKILL of the trial's process after its 3rd epoch (the OOM killer, a preempted node): Ray restarts it from
    its last epoch checkpoint (not from epoch 1) in a new process; the sweep completes; its child runs (a stacked
    trial's: one per seed, all restored together) have the epochs 1..E exactly once and are FINISHED, their wall
    time summed over both processes."""
    import dataclasses

    from pefusion.fusion.trainable import pefusion_trainable

    preset = dataclasses.replace(smoke_preset, train=dataclasses.replace(smoke_preset.train, max_epochs=30,
                                                                         early_stopping=False))
    storage = in_tmp / "ray_results" / "s"
    killed: dict = {}

    def kill_after_third_epoch() -> None:
        deadline = time.time() + 240
        while time.time() < deadline:
            for result_file in storage.glob("pefusion_trainable_*/result.json"):
                reports = [json.loads(ln) for ln in result_file.read_text().splitlines() if ln.strip()]
                if len(reports) >= 3 and R.STATUS not in reports[-1]:
                    killed.update(pid=reports[-1]["pid"], epoch=reports[-1][R.EPOCH],
                                  trial_id=reports[-1]["trial_id"])
                    os.kill(killed["pid"], signal.SIGKILL)
                    return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_after_third_epoch, daemon=True)
    killer.start()
    result = _sweep(smoke_corpus, preset, _grid(seed=seeds), _options(in_tmp, max_failures=2, stack=stack),
                    pefusion_trainable)
    killer.join()
    assert killed, "the trial finished before it could be killed"
    assert list(result.rows[R.STATUS]) == [R.STATUS_OK] * len(seeds)

    reports = [json.loads(ln) for f in storage.glob("pefusion_trainable_*/result.json")
               for ln in f.read_text().splitlines() if ln.strip()]
    after = [r for r in reports if r["pid"] != killed["pid"]]
    assert after, "no report from a new process: the trial was not restarted"
    first_after = min(r[R.EPOCH] for r in after)
    assert 1 < first_after <= killed["epoch"] + 1, (killed, first_after)  # from the checkpoint, not from scratch
    assert max(r[R.EPOCH] for r in reports) == 30

    client, runs = _children(result.parent_run_id)
    assert sorted(int(run.data.params[R.SEED]) for run in runs) == seeds
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.tags[R.TAG_STATUS] == R.STATUS_OK
        assert [s for s, _ in _history(client, run, R.TRAIN_LOSS)] == list(range(1, 31))
        # the trial's clock went on from its checkpoint: its wall time per epoch never falls back at the restart,
        # and from its first process's start to its end is at least that wall time (the killed process's seconds
        # in it)
        walls = [v for s, v in _history(client, run, R.WALL_S) if s <= 30]
        assert walls == sorted(walls)
        metrics = run.data.metrics
        assert metrics[R.ENDED_AT] - metrics[R.STARTED_AT] >= metrics[R.WALL_S] > walls[-1]


class _Clock:
    """A clock the test holds: `now` seconds, moved by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _trial(i: int, status: str, **config) -> SimpleNamespace:
    return SimpleNamespace(trial_id=f"t{i}", status=status, config={"seed": i, **config}, last_result={},
                           checkpoint=None)


def test_progress_line_counts_trials_and_estimates_the_time_left(capsys):
    """The line as each trial ends: done (failed) / running / pending of n, elapsed, time left from the rate of
    this driver's trials (ended ones, and the epochs of running ones), the trial by what the search varies and the
    study's main metric. A study whose trials report no epochs (the student's)."""
    from ray.tune.experiment import Trial

    from pefusion.sweep.progress import Progress

    clock = _Clock()
    live = Progress(clock=clock, run_name=lambda config: f"s{config['seed']}", varying=("seed",), total=10,
                    shown={R.TEST_ACC: lambda v: f"test {100 * v:.1f} %"})
    live.started_at = live.first_start = clock.now - 120
    trials = [_trial(i, s) for i, s in enumerate([Trial.TERMINATED, Trial.TERMINATED, Trial.RUNNING,
                                                   Trial.RUNNING, Trial.PENDING])]
    live.ended_before, live.ran = set(), {"t0", "t1", "t2", "t3"}
    live.concluded = {"t0": R.STATUS_ERROR}
    live.finished_here = 1
    trials[1].last_result = {R.STATUS: R.STATUS_OK, R.TEST_ACC: 0.8125}
    live.complete(trials[1], trials)
    assert capsys.readouterr().out == ""  # said once the next trial had time to start (the test below)
    live.step(trials)
    clock.now += live.settle_s
    live.step(trials)
    line = capsys.readouterr().out.strip()
    # 2 of 10 ended (1 failed) in 121 s: 60.5 s each, 8 left -> ~8 min
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] 2/10 done \(1 failed\), 2 running, 6 pending; 2m01s elapsed, "
                        r"~8m04s left; seed 1: ok, test 81\.2 %", line), line
    live.every_s = 0.0
    live.step(trials)
    assert "2/10 done (1 failed), 2 running, 6 pending" in capsys.readouterr().out
    # Ended trials ran 4 epochs; the running ones 2 each: 2 + 2 * 2/4 = 3 trials' work in 121 s, 7 left -> 282 s
    live.epochs = {"t0": 4, "t1": 4, "t2": 2, "t3": 2}
    live.step(trials)
    assert re.search(r"2 running, 6 pending; 2m01s elapsed, ~4m42s left$", capsys.readouterr().out.strip())
    live.progress = False
    live.step(trials)
    assert capsys.readouterr().out == ""


def test_a_trial_that_ends_is_said_with_the_trial_that_took_its_place_running(capsys):
    """Two trials at once: as one ends, Tune starts the next in its place, and the line says 2 running, not 1
    (it was printed as the trial ended, before its successor started)."""
    from ray.tune.experiment import Trial

    from pefusion.sweep.progress import Progress

    clock = _Clock()
    live = Progress(clock=clock, run_name=lambda config: f"s{config['seed']}", varying=("seed",), total=3)
    trials = [_trial(i, s) for i, s in enumerate([Trial.RUNNING, Trial.RUNNING, Trial.PENDING])]
    live.first_step(trials)
    live.start(trials[0], trials)
    live.start(trials[1], trials)
    clock.now += 10
    trials[0].last_result = {R.STATUS: R.STATUS_OK}
    live.complete(trials[0], trials)
    clock.now += 0.01
    live.start(trials[2], trials)  # Tune calls back before it marks the new trial RUNNING
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] 1/3 done \(0 failed\), 2 running, 0 pending; 10s elapsed, "
                        r"~20s left; seed 0: ok", capsys.readouterr().out.strip())
    trials[0].status = Trial.TERMINATED
    # the last trials: nothing starts after them, and the line comes `settle_s` later, or at the sweep's end
    trials[1].last_result = {R.STATUS: R.STATUS_OK}
    live.complete(trials[1], trials)
    trials[1].status = Trial.TERMINATED
    clock.now += live.settle_s
    live.step(trials)
    assert "2/3 done (0 failed), 1 running, 0 pending" in capsys.readouterr().out
    trials[2].last_result = {R.STATUS: R.STATUS_OK}
    live.complete(trials[2], trials)
    live.end(trials)
    assert "3/3 done (0 failed), 0 running, 0 pending" in capsys.readouterr().out


def test_the_time_left_counts_epochs_from_the_first_one(capsys):
    """Three trials of 20 planned epochs, 10 s an epoch, none ended: at epoch 4 the line gives the time
    left of 16 more epochs (within 10 %), an upper bound since early stopping may end them sooner, and the epochs
    the running trials have done of those planned. Once one ends early, at epoch 6, a trial's length is what it ran
    (the measured epochs), no longer the plan."""
    from ray.tune.experiment import Trial

    from pefusion.sweep.progress import Progress

    clock, epoch_s, planned = _Clock(), 10.0, 20
    live = Progress(clock=clock, every_s=4 * epoch_s,
                    run_name=lambda config: f"s{config['seed']}", varying=("seed",), total=3,
                    planned_epochs=lambda config: config["max_epochs"],
                    may_end_early=lambda config: config["early_stopping"])
    trials = [_trial(i, Trial.RUNNING, max_epochs=planned, early_stopping=True) for i in range(3)]
    live.first_step(trials)
    for trial in trials:
        live.start(trial, trials)
    assert live.time_left(trials, 3, set(), trials) == "time left known after the first epoch"
    for epoch in range(1, 5):
        clock.now += epoch_s
        for trial in trials:
            live.result(trial, {R.EPOCH: epoch, R.VAL_ACC: 0.5})
        live.step(trials)
    line = capsys.readouterr().out.strip()
    match = re.fullmatch(r"\[\d\d:\d\d:\d\d\] 0/3 done \(0 failed\), 3 running \(12/60 epochs\), 0 pending; "
                         r"40s elapsed, ~(\d+)m(\d\d)s left at most \(trials may stop early\)", line)
    assert match, line
    arithmetic = (planned - 4) * epoch_s  # every trial has 16 epochs of 10 s left, the three at once
    assert int(match[1]) * 60 + int(match[2]) == pytest.approx(arithmetic, rel=0.1)

    for epoch in (5, 6):  # t0 stops early after its 6th epoch (ok: its own stopping rule)
        clock.now += epoch_s
        for trial in trials:
            live.result(trial, {R.EPOCH: epoch, R.VAL_ACC: 0.5})
    trials[0].last_result = {R.STATUS: R.STATUS_OK, R.EPOCHS_RUN: 6}
    live.complete(trials[0], trials)
    trials[0].status = Trial.TERMINATED
    clock.now += live.settle_s
    live.step(trials)
    line = capsys.readouterr().out.strip()
    match = re.search(r"1/3 done \(0 failed\), 2 running \(12/40 epochs\), 0 pending; 1m01s elapsed, "
                      r"~(\d+)s left; seed 0: ok$", line)
    assert match, line
    # t1 and t2 are as long as t0 was: each has 1 epoch left (at least one past the 6 done), an epoch 10 s of a
    # slot (3 slots x 60 s over 18 epochs), the two at once
    assert int(match[1]) == round(2 * (3 * 60 / 18) / 2)


def test_the_time_left_counts_a_trials_last_phase_and_never_grows_in_it(capsys):
    """Two trials of 2 planned epochs of 10 s, one at a time, whose last phase (test and latency passes, 60 s in
    the plan, 30 s as the first one measures it) follows their last epoch: the line counts that phase from the
    plan, says the trial is testing, never grows while it tests, and the second trial is counted with the first's
    measured phase."""
    from ray.tune.experiment import Trial

    from pefusion.sweep.progress import Progress

    clock, epoch_s = _Clock(), 10.0
    live = Progress(clock=clock, run_name=lambda config: f"s{config['seed']}", varying=("seed",), total=2,
                    planned_epochs=lambda config: config["max_epochs"], testing_s_planned=60.0)
    trials = [_trial(i, Trial.RUNNING if i == 0 else Trial.PENDING, max_epochs=2) for i in range(2)]
    live.first_step(trials)
    live.start(trials[0], trials)

    def left() -> float:
        live.say(trials)
        line = capsys.readouterr().out.strip()
        match = re.search(r"~(?:(\d+)m)?(\d+)s left", line)
        assert match, line
        return int(match[1] or 0) * 60 + int(match[2]), line

    clock.now += epoch_s
    live.result(trials[0], {R.EPOCH: 1, R.VAL_ACC: 0.5})
    seconds, line = left()
    # t0: 1 epoch + its last phase (60 s planned); t1: 2 epochs + 60 s, one slot
    assert seconds == pytest.approx(10 + 60 + 2 * 10 + 60, abs=1), line
    clock.now += epoch_s
    live.result(trials[0], {R.EPOCH: 2, R.VAL_ACC: 0.5, R.PHASE: R.PHASE_TESTING})
    seen = []
    for _ in range(6):  # 60 s of testing, in 10 s steps
        seconds, line = left()
        assert "(2/2 epochs, 1 testing)" in line, line
        seen.append(seconds)
        clock.now += 10
    assert all(b <= a for a, b in zip(seen, seen[1:])), seen
    assert seen[0] == pytest.approx(60 + 2 * 10 + 60, abs=1), seen
    # it ends 20 s later: 80 s of testing in all
    clock.now += 20
    trials[0].last_result = {R.STATUS: R.STATUS_OK, R.EPOCHS_RUN: 2}
    live.complete(trials[0], trials)
    trials[0].status, trials[1].status = Trial.TERMINATED, Trial.RUNNING
    live.start(trials[1], trials)
    capsys.readouterr()
    seconds, line = left()
    assert seconds == pytest.approx(2 * 10 + 80, abs=1), line


def test_a_study_without_epochs_keeps_its_line(capsys):
    """The student's trials report no epochs: no epoch counts in the line, the time left after the first trial."""
    from ray.tune.experiment import Trial

    from pefusion.sweep.progress import Progress

    clock = _Clock()
    live = Progress(clock=clock, run_name=lambda config: "p", total=2)
    trials = [_trial(i, Trial.RUNNING) for i in range(2)]
    live.first_step(trials)
    live.start(trials[0], trials)
    clock.now += 40
    live.step(trials)
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] 0/2 done \(0 failed\), 1 running, 1 pending; 40s elapsed, "
                        r"time left known after the first trial", capsys.readouterr().out.strip())


class _Heard:
    """A callback that notes the trials it hears start (picklable: a module's class, plain attributes)."""

    def __init__(self, driver: str) -> None:
        self.driver, self.started = driver, []

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started.append(trial.trial_id)


def test_a_resumed_sweep_calls_back_the_resuming_drivers_callbacks_not_the_saved_ones():
    """Tune pickles the callbacks with the experiment and unpickles them on --resume: the driver's pickle to
    nothing, and come back as those of the driver restoring it (outside a restore, as none)."""
    from pefusion.sweep.tuner import DriverCallbacks, restored_with

    first, resuming = _Heard("first"), _Heard("resuming")
    saved = pickle.dumps(DriverCallbacks([first]))
    assert b"first" not in saved
    with restored_with([resuming]):
        restored = pickle.loads(saved)
    restored.on_trial_start(iteration=0, trials=[], trial=SimpleNamespace(trial_id="t0"))
    assert resuming.started == ["t0"] and first.started == []
    pickle.loads(saved).on_trial_start(iteration=0, trials=[], trial=SimpleNamespace(trial_id="t1"))
    assert resuming.started == ["t0"]
