"""A finished trial's model as an MLflow model that classifies raw text (`pefusion-export`): what it predicts from a
test split's raw text against the run's record and the checkpoint on the training's own token ids, what it answers
through a real `mlflow models serve`, and the runs it refuses in one line.

The sweep (`sweeps/arxiv_grid.py`, as a user runs it) reads a folder whose labels are strings, trains two stacked
seeds for each of two tokenisers, and then its token cache is moved away: the export has only what MLflow holds, as
on another machine. The moved cache is the reference: the training's own token ids of the test split (a subword
tokeniser trained again on the same text numbers its pieces differently).
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from conftest import REPO, free_port, load_script, start_mlflow_server, stop_process_group, subprocess_env
from pefusion import record as R
from pefusion.cli.commands import export_main
from pefusion.cli.flags import run_main

SPACE = """\
pe_type: {grid: [learned]}
fusion: {grid: [add]}
seed: {stack: [0, 1]}
tokenizer: {grid: [whitespace, wordpiece]}
lr: 0.003
max_epochs: 3
device: cpu
"""
# The data files' labels: generated class i is written as NAMES[i], and map_labels numbers the sorted names, so a
# label not mapped back through the label names (or through them in the wrong order) reads as another class.
NAMES = ("world", "sport", "science", "business")


@pytest.fixture(scope="module")
def sweep(local_ray, tmp_path_factory) -> SimpleNamespace:
    from mlflow.tracking import MlflowClient

    from pefusion.data.synthetic import generate_synthetic_corpus

    tmp = tmp_path_factory.mktemp("export")
    data = tmp / "data"
    data.mkdir()
    for split, docs in generate_synthetic_corpus(200, 100, 100, 0, 4).items():
        (data / f"{split}.jsonl").write_text("".join(json.dumps({"text": d["text"], "label": NAMES[d["label"]]}) + "\n"
                                                     for d in docs))
    (tmp / "space.yaml").write_text(SPACE)
    cache, uri = tmp / "token_cache", f"sqlite:///{tmp}/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        code = load_script("sweeps/arxiv_grid.py").main([
            "--preset", "arxiv", "--data-dir", str(data), "--smoke", "--cache-dir", str(cache), "--search-space",
            str(tmp / "space.yaml"), "--stack-seeds", "--name", "ex", "--no-dashboard"])
    assert code == 0
    kept = cache.rename(tmp / "kept_cache")  # as on another machine: the tokeniser is only in MLflow now
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(R.PEFUSION_EXPERIMENT)
    runs = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'trial'")
    rows = pd.read_csv(tmp / "results" / "ex_results_by_seed.csv")
    test = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    return SimpleNamespace(tmp=tmp, data=data, uri=uri, kept_cache=kept, client=client, runs=runs, rows=rows,
                           texts=[d["text"] for d in test], labels=np.array([d["label"] for d in test], dtype=object))


def _checkpoint_predictions(sweep: SimpleNamespace, run, smoke_preset) -> np.ndarray:
    """The run's checkpoint on the test split's token ids as the training encoded them (the sweep's cache entry,
    moved), as class names: the model's answer without the export."""
    import mlflow

    from pefusion.data.batching import iter_batches
    from pefusion.data.corpus import load_corpus
    from pefusion.fusion.model import load_checkpoint

    corpus = load_corpus(dataclasses.replace(smoke_preset.data, data_dir=str(sweep.data), synthetic=False,
                                             tokenizer=run.data.params["tokenizer"],
                                             cache_dir=str(sweep.kept_cache)))
    folder = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=R.ARTIFACT_CHECKPOINT_DIR,
                                                 tracking_uri=sweep.uri, dst_path=str(sweep.tmp / run.info.run_id))
    model, preds = load_checkpoint(folder), np.empty(len(corpus.test), dtype=np.int64)
    for batch in iter_batches(corpus.test, 16, shuffle=False):
        preds[batch.index.numpy()] = model(batch.tokens).argmax(-1).detach().numpy()
    return np.array(sorted(NAMES), dtype=object)[preds]


def test_the_model_of_each_run_classifies_raw_test_text_as_the_run_recorded(sweep, smoke_preset, monkeypatch):
    """Every run (stacked seeds, a word-level and a subword tokeniser), exported with the token cache gone and
    loaded through MLflow, classifies the test split's raw text with the run's recorded test accuracy to the
    CSV's digits, answers each document as the checkpoint does on the training's token ids, and names its label
    as the data file writes it; a second export finds the same model."""
    import mlflow

    from pefusion.fusion.export import export_run

    assert len(sweep.runs) == 4 and all(R.TAG_STACKED in run.data.tags for run in sweep.runs)
    assert {run.data.params["tokenizer"] for run in sweep.runs} == {"whitespace", "wordpiece"}
    csv = sweep.rows.set_index("trial_id")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sweep.uri)  # where models:/ URIs are looked up
    for run in sweep.runs:
        done = export_run(run.info.run_id, sweep.uri)
        assert done.created
        model = mlflow.pyfunc.load_model(done.model_uri)
        out = model.predict(pd.DataFrame({"text": sweep.texts}))
        probs = out[[f"prob_{name}" for name in sorted(NAMES)]].to_numpy()
        assert np.allclose(probs.sum(1), 1) and list(out["label"]) == list(np.array(sorted(NAMES))[probs.argmax(1)])
        recorded = csv.loc[run.data.tags[R.TAG_TRIAL_ID], "test_acc_pct"]
        assert round(100 * float(np.mean(out["label"].to_numpy() == sweep.labels)), 2) == recorded
        assert list(out["label"]) == list(_checkpoint_predictions(sweep, run, smoke_preset))
        again = export_run(run.info.run_id, sweep.uri)
        assert (again.model_uri, again.created) == (done.model_uri, False)
    logged = sweep.client.search_logged_models([sweep.runs[0].info.experiment_id])
    assert sorted(m.source_run_id for m in logged) == sorted(run.info.run_id for run in sweep.runs)


def _refused(argv: list[str], capsys) -> str:
    """What `pefusion-export argv` prints on stderr, after checking it exits 2 with one line."""
    with pytest.raises(SystemExit) as stop:
        run_main(export_main, argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_a_run_without_a_model_is_refused_in_one_line_naming_it(in_tmp, capsys):
    """A failed run, a run the scheduler stopped, a student-study run, a sweep's parent run and a made-up run id
    (runs written by the sweeps' own recorder): one line naming the run, exit 2; the made-up one also through the
    script, as a user runs it."""
    from pefusion.tracking.recorder import SweepRecorder

    uri = f"sqlite:///{in_tmp}/mlflow.db"
    recorder = SweepRecorder(uri, R.PEFUSION_EXPERIMENT, "arxiv_grid", str(in_tmp / "grid"))
    params = {R.PE_TYPE: "learned", R.FUSION: "add", R.SEED: 0, R.DATASET: "synthetic", "tokenizer": "whitespace",
              "max_vocab": 50000, "min_freq": 2}
    ended = {}
    for status in (R.STATUS_ERROR, R.STATUS_STOPPED):
        ended[status] = recorder.trial_run(status, params)
        recorder.finish_trial(status, {R.STATUS: status, R.ERROR: "boom" if status == R.STATUS_ERROR else "",
                                       R.EPOCHS_RUN: 1})
    student = SweepRecorder(uri, R.STUDENT_EXPERIMENT, "lambda_cv", str(in_tmp / "student"))
    student_run = student.trial_run("s", {R.ALPHA: 1.0, R.SEED: 0})
    student.finish_trial("s", {R.STATUS: R.STATUS_OK, R.EPS_G: 0.1})
    capsys.readouterr()  # (MLflow's lines as it created the store)
    for run_id, says in ((ended[R.STATUS_ERROR], "ended with status 'error' (boom)"),
                         (ended[R.STATUS_STOPPED], "ended with status 'stopped'"),
                         (student_run, "is a student-study run (lambda_cv)"),
                         (recorder.parent_run_id, "is a sweep's parent run"),
                         ("0123456789abcdef0123456789abcdef", "no such run")):
        err = _refused(["--run", run_id, "--tracking-uri", uri], capsys)
        assert f"run {run_id}" in err and says in err, err
    made_up = subprocess.run([sys.executable, str(REPO / "scripts" / "export_model.py"), "--run", "nope",
                              "--tracking-uri", uri], capture_output=True, text=True, timeout=300,
                             env=subprocess_env())
    assert made_up.returncode == 2 and made_up.stderr == f"error: run nope: no such run in {uri}\n"


@pytest.mark.slow
def test_a_registered_model_served_by_mlflow_answers_as_predict(sweep):
    """Through a real `mlflow server` on 127.0.0.1 (over the sweep's store): export with --register, then a real
    `mlflow models serve --env-manager local` of the registered version answers a POST of two documents with the
    labels `predict` gives."""
    import mlflow

    from pefusion.fusion.export import export_run

    root = sweep.tmp / "server"
    root.mkdir()
    port, serve_port = free_port(), free_port()
    server = start_mlflow_server(port, root, store=sweep.uri)
    served = None
    try:
        uri = f"http://127.0.0.1:{port}"
        run = next(r for r in sweep.runs if r.data.params["tokenizer"] == "wordpiece")
        done = export_run(run.info.run_id, uri, register="pefusion-test")
        assert done.registered_uri == "models:/pefusion-test/1"
        assert export_run(run.info.run_id, uri, register="pefusion-test").registered_uri == done.registered_uri
        two = sweep.texts[:2]
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MLFLOW_TRACKING_URI", uri)
            expected = mlflow.pyfunc.load_model(done.registered_uri).predict(pd.DataFrame({"text": two}))
        log = open(root / "serve.log", "ab")
        served = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "models", "serve", "-m", done.registered_uri, "--env-manager", "local",
             "-h", "127.0.0.1", "-p", str(serve_port), "-w", "1"],
            stdout=log, stderr=log, start_new_session=True, env=subprocess_env(MLFLOW_TRACKING_URI=uri))
        answer = _post(serve_port, {"dataframe_records": [{"text": t} for t in two]}, served, root / "serve.log")
        assert [row["label"] for row in answer["predictions"]] == list(expected["label"])
    finally:
        if served is not None:
            stop_process_group(served, serve_port)
        stop_process_group(server, port)


def _post(port: int, body: dict, proc: subprocess.Popen, log: Path, timeout_s: float = 300) -> dict:
    """POST `body` to the served model's /invocations once /ping answers."""
    import time

    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                break
        except OSError:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, "mlflow models serve did not start"
            time.sleep(0.5)
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.loads(resp.read())


def test_a_seed_with_its_own_corpus_exports_with_its_own_tokeniser():
    """agnews draws each seed's split and vocabulary: the parent run holds one tokeniser per seed, and a run's
    export must read its seed's, not another's."""
    from pefusion.fusion.export import _tokenizer_folder

    asked = []

    class Client:
        def list_artifacts(self, run_id, folder):
            asked.append(folder)
            return [SimpleNamespace(path=f"{folder}/meta.json")]

    params = {"tokenizer": "whitespace", "max_vocab": "50000", "min_freq": "2", "seed": "3"}
    for drawn, folder in (("True", "tokenizer/whitespace/50000/2/split3"), ("False", "tokenizer/whitespace/50000/2")):
        run = SimpleNamespace(info=SimpleNamespace(run_id="r"), data=SimpleNamespace(
            params={**params, "split_per_seed": drawn}, tags={"mlflow.parentRunId": "p"}))
        assert _tokenizer_folder(Client(), run) == ("p", folder)
