"""Sweeps on a real local Ray with a real sqlite MLflow: fractional GPUs, failures, MLflow contents, checkpoints,
ASHA, and the bad-input matrix (rejected before Ray starts)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from conftest import REPO, load_script
from study_names import EPOCH_METRICS, FINAL_METRICS
from pefusion import record as R
from pefusion.data.batching import iter_batches
from pefusion.errors import ConfigError
from pefusion.fusion.training import Trainer
from pefusion.tracking.store import resolve_tracking_uri


def _options(tmp: Path, **kw):
    from pefusion.sweep.options import SweepOptions

    kw.setdefault("cpus_per_trial", 1.0)
    return SweepOptions(sweep="arxiv_grid", experiment="pe-fusion", storage_path=str(tmp / "ray_results"),
                        dashboard=False, verbose=0, **kw)


def _grid(**axes):
    from pefusion.fusion.config import RULES
    from pefusion.sweep.space import parse_search_space

    return parse_search_space({k: {"grid": v} for k, v in axes.items()}, RULES)


def _sweep(corpus, preset, space, opts, trainable=None):
    """Study A's sweep of `space` on `corpus` through the one driver; returns its SweepResult."""
    from pefusion.fusion.study import pefusion_study
    from pefusion.fusion.trainable import pefusion_trainable
    from pefusion.sweep.driver import run_sweep

    study = pefusion_study("arxiv_grid", "smoke", preset, space, opts.cpus_per_trial, corpus=corpus,
                           trainable=trainable or pefusion_trainable)
    return run_sweep(study, opts, Path(opts.storage_path).parent / "results")


def _children(parent_run_id: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(resolve_tracking_uri())
    exp = client.get_experiment_by_name("pe-fusion")
    return client, client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent_run_id}'")


def test_fractional_gpus_run_four_trials_at_once(local_ray, in_tmp, smoke_preset, smoke_corpus):
    """0.25 GPU per trial on one logical GPU: four trials run together, each sees one device."""
    from pefusion.fusion.trainable import pefusion_trainable

    barrier = str(in_tmp / "barrier")

    def trainable_with_barrier(config, **kwargs):
        # Every trial waits until all four have started: this only passes if they really run at once.
        import time as _time
        from pathlib import Path as _P

        folder = _P(barrier)
        folder.mkdir(exist_ok=True)
        (folder / f"{config['seed']}").touch()
        deadline = _time.time() + 120
        while len(list(folder.iterdir())) < 4:
            if _time.time() > deadline:
                raise RuntimeError("trials did not run concurrently")
            _time.sleep(0.1)
        return pefusion_trainable(config, **kwargs)

    rows = _sweep(smoke_corpus, smoke_preset, _grid(seed=[0, 1, 2, 3]),
                  _options(in_tmp, cpus_per_trial=0.5, gpus_per_trial=0.25), trainable=trainable_with_barrier).rows
    assert list(rows[R.STATUS]) == [R.STATUS_OK] * 4
    assert set(rows["visible_devices"]) == {"0"}  # Ray assigned the one (logical) GPU to each trial
    starts, ends = rows["started_at"], rows["ended_at"]
    assert starts.max() < ends.min()  # all four intervals overlap


def test_failures_are_recorded_never_dropped(local_ray, in_tmp, smoke_preset, smoke_corpus):
    """A trial that raises and one that diverges leave the sweep complete and are recorded with their reason."""
    from pefusion.cli.fusion import summary_table
    from pefusion.cli.fusion import aggregate_rows
    from pefusion.fusion.trainable import pefusion_trainable

    def faulty(config, **kwargs):
        if config["fusion"] == "concat" and config["seed"] == 1:
            raise RuntimeError("injected failure")
        if config["fusion"] == "add" and config["seed"] == 1:
            config = {**config, "lr": 1e30}  # Adam steps of 1e30 overflow the attention logits at step 2
        return pefusion_trainable(config, **kwargs)

    result = _sweep(smoke_corpus, smoke_preset, _grid(fusion=["add", "concat"], seed=[0, 1]), _options(in_tmp),
                    trainable=faulty)
    rows = result.rows
    by = {(r.fusion, r.seed): r for r in rows.itertuples()}
    assert len(rows) == 4
    assert by[("concat", 1)].status == R.STATUS_ERROR and "injected failure" in by[("concat", 1)].error
    assert by[("add", 1)].status == R.STATUS_DIVERGED and "non-finite" in by[("add", 1)].error
    assert by[("add", 0)].status == by[("concat", 0)].status == R.STATUS_OK

    agg = aggregate_rows(rows).set_index(R.FUSION)
    assert agg.loc["add", "n_failed"] == 1 and agg.loc["concat", "n_failed"] == 1
    assert agg.loc["add", "n_seeds"] == 1  # the failed seed is excluded from the mean, and counted
    assert "2 failed" in summary_table(rows) and "injected failure" in summary_table(rows)

    client, runs = _children(result.parent_run_id)
    assert len(runs) == 4
    failed = {r.data.tags[R.TAG_STATUS]: r for r in runs if r.info.status == "FAILED"}
    assert set(failed) == {R.STATUS_ERROR, R.STATUS_DIVERGED}
    assert "injected failure" in failed[R.STATUS_ERROR].data.tags[R.TAG_ERROR]
    assert "non-finite" in failed[R.STATUS_DIVERGED].data.tags[R.TAG_ERROR]


def test_each_tokeniser_setting_of_a_space_is_its_own_corpus(local_ray, in_tmp, smoke_preset, smoke_corpus):
    """A max_vocab grid: the trial with a 12-word vocabulary trains a 12-row embedding, the other the preset's
    corpus; the two differ in parameters by exactly the vocabularies' difference times d_model."""
    result = _sweep(smoke_corpus, smoke_preset, _grid(max_vocab=[12, smoke_preset.data.max_vocab]),
                    _options(in_tmp))
    rows = result.rows.set_index("max_vocab")
    assert list(rows[R.STATUS]) == [R.STATUS_OK] * 2
    assert smoke_corpus.vocab_size > 12
    assert (rows.loc[smoke_preset.data.max_vocab, R.PARAMS] - rows.loc[12, R.PARAMS]
            == (smoke_corpus.vocab_size - 12) * smoke_preset.model.d_model)


def test_a_range_over_a_tokeniser_key_is_refused_before_ray_starts(smoke_preset):
    from pefusion.fusion.study import corpus_settings
    from pefusion.fusion.config import RULES
    from pefusion.sweep.space import SearchSpaceError, parse_search_space

    grid = parse_search_space({"tokenizer": {"grid": ["whitespace", "words"]}, "max_vocab": {"choice": [10, 20]},
                               "lr": {"loguniform": [1e-4, 1e-2]}}, RULES)
    assert sorted(corpus_settings(grid, smoke_preset)) == ["whitespace/10/2", "whitespace/20/2", "words/10/2",
                                                          "words/20/2"]
    ranged = parse_search_space({"max_vocab": {"randint": [100, 200]}}, RULES, "space.yaml")
    with pytest.raises(SearchSpaceError, match="space.yaml: max_vocab: .* constant, grid or choice, not a range"):
        corpus_settings(ranged, smoke_preset)


def test_mlflow_records_the_trial_contract_and_a_loadable_checkpoint(local_ray, in_tmp, smoke_preset, smoke_corpus):
    """Every metric of a trial's record (docs/operations.md), per-epoch series at step = epoch, full config as
    params, and a checkpoint that loads with weights_only=True and reproduces the recorded test accuracy."""
    import mlflow

    from pefusion.fusion.model import load_checkpoint
    from pefusion.data.batching import iter_batches

    result = _sweep(smoke_corpus, smoke_preset, _grid(pe_type=["learned"], fusion=["gate_cnn"], seed=[3]),
                    _options(in_tmp))
    rows = result.rows
    client, runs = _children(result.parent_run_id)
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.tags[R.TAG_STATUS] == R.STATUS_OK
    params = run.data.params
    assert (params[R.PE_TYPE], params[R.FUSION], params[R.SEED], params[R.DATASET]) == ("learned", "gate_cnn", "3",
                                                                                        "synthetic")
    assert params["d_model"] == str(smoke_preset.model.d_model) and params["lr"] == str(smoke_preset.train.lr)
    # what the trial resolved where it ran (the preset asks for precision auto, pad multiple 0 and device auto),
    # in its run and its CSV row
    from pefusion.fusion.device import device_name

    assert (smoke_preset.train.precision, smoke_preset.train.pad_multiple) == ("auto", 0)
    resolved = {R.PRECISION: "fp32", R.PAD_MULTIPLE: "1", R.DEVICE: "cpu", R.DEVICE_NAME: device_name(torch.device("cpu"))}
    assert {k: params[k] for k in resolved} == resolved
    assert {k: str(rows.loc[0, k]) for k in resolved} == resolved
    for name in FINAL_METRICS:
        assert name in run.data.metrics, name
    epochs = int(run.data.metrics[R.EPOCHS_RUN])
    for name in EPOCH_METRICS:  # val_acc also has the final (restored best) value one step past the epochs
        final_step = [epochs + 1] if name == R.VAL_ACC else []
        assert ([m.step for m in client.get_metric_history(run.info.run_id, name)]
                == list(range(1, epochs + 1)) + final_step)
    for name in (R.TRAIN_SAMPLES_PER_S, R.TRAIN_TOKENS_PER_S, R.EPOCH_S):  # what each epoch cost, once each
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, name)) == list(range(1, epochs + 1))
    assert (params[R.GPU_SHARE], params[R.CPU_SHARE]) == ("0.0", "1.0")  # a trial of one run: all Ray gave it
    assert run.data.metrics[R.VAL_ACC] == run.data.metrics[R.BEST_VAL_ACC]
    assert any(k.startswith(R.LENGTH_METRIC_PREFIX) for k in run.data.metrics)
    assert run.data.metrics[R.TEST_ACC] == pytest.approx(rows.loc[0, R.TEST_ACC])

    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=R.ARTIFACT_CHECKPOINT_DIR,
                                                tracking_uri=resolve_tracking_uri(), dst_path=str(in_tmp / "dl"))
    state = torch.load(Path(local) / "model.pt", weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    model = load_checkpoint(local)
    test = smoke_corpus.test
    correct = 0
    with torch.no_grad():
        for batch in iter_batches(test, 64, shuffle=False):
            correct += int((model(batch.tokens).argmax(-1) == batch.labels).sum())
    assert correct / len(test) == pytest.approx(run.data.metrics[R.TEST_ACC])
    parent_files = {a.path for a in client.list_artifacts(result.parent_run_id, R.ARTIFACT_RESULTS_DIR)}
    # the one driver ends every sweep alike: its CSVs (the ones it wrote) are on the parent run
    assert parent_files == {f"{R.ARTIFACT_RESULTS_DIR}/{p.name}" for p in result.paths}


def test_every_epoch_of_a_run_records_its_cost_by_the_tests_own_count_and_clock(local_ray, in_tmp, smoke_preset,
                                                                               smoke_corpus):
    """Two seeds stacked in one trial of 0.5 GPU and 1 CPU (a trial of one run: the contract test below). Each
    run's MLflow series: training samples/s, tokens/s and the epoch's seconds, one point per epoch. Against the
    documents and non-pad tokens this test counts in the corpus and its own clock around the sweep: the training
    seconds a rate implies fit in the epoch's, are the same for both seeds (the stack's seconds over each seed's
    own documents), add up to the run's training time, and the epochs fit in its wall time, which fits in this
    test's, as do its start and end. Each run names its device and half the trial's CPUs, so that the sum over
    runs of wall time × share counts the trial once, and no GPU: the trial trained on the CPU, whatever logical
    GPU Ray scheduled it on; the report's compute table holds the mean of its epochs."""
    from pefusion.analysis import compute as CO
    from pefusion.analysis import runs as RU
    from pefusion.fusion.config import RULES
    from pefusion.fusion.device import device_name
    from pefusion.sweep.space import parse_search_space

    space = parse_search_space({R.SEED: {"stack": [0, 1]}, "early_stopping": False}, RULES)
    started, start = time.time(), time.monotonic()
    result = _sweep(smoke_corpus, smoke_preset, space, _options(in_tmp, gpus_per_trial=0.5))
    held, ended = time.monotonic() - start, time.time()
    documents = len(smoke_corpus.train)
    tokens = sum(int((b.tokens != 0).sum()) for b in iter_batches(smoke_corpus.train, 7, shuffle=False))
    client, runs = _children(result.parent_run_id)
    assert len(runs) == 2 and len({r.data.tags[R.TAG_STACKED] for r in runs}) == 1
    per_run = []
    for run in runs:
        metrics, params, epochs = run.data.metrics, run.data.params, int(run.data.metrics[R.EPOCHS_RUN])
        series = {name: [m.value for m in sorted(client.get_metric_history(run.info.run_id, name),
                                                 key=lambda m: m.step)]
                  for name in (R.TRAIN_SAMPLES_PER_S, R.TRAIN_TOKENS_PER_S, R.EPOCH_S)}
        assert {name: len(values) for name, values in series.items()} == dict.fromkeys(series, epochs)
        implied = [documents / rate for rate in series[R.TRAIN_SAMPLES_PER_S]]
        per_run.append(implied)
        assert all(0 < s <= e for s, e in zip(implied, series[R.EPOCH_S]))
        assert sum(implied) == pytest.approx(metrics[R.TRAIN_TIME_S], rel=1e-9)
        assert [r * s for r, s in zip(series[R.TRAIN_TOKENS_PER_S], implied)] == pytest.approx([tokens] * epochs)
        assert min(series[R.TRAIN_SAMPLES_PER_S]) >= documents / held
        assert sum(series[R.EPOCH_S]) <= metrics[R.WALL_S] <= held
        assert started <= metrics[R.STARTED_AT] < metrics[R.ENDED_AT] <= ended
        assert (params[R.DEVICE_NAME], params[R.GPU_SHARE], params[R.CPU_SHARE]) == \
            (device_name(torch.device("cpu")), "0.0", "0.5")
        assert R.PEAK_MEM_RESERVED_MIB not in metrics  # on a CPU
    assert per_run[0] == pytest.approx(per_run[1], rel=1e-12)
    span = max(r.data.metrics[R.ENDED_AT] for r in runs) - min(r.data.metrics[R.STARTED_AT] for r in runs)
    assert sum(r.data.metrics[R.WALL_S] * 0.5 for r in runs) == pytest.approx(span * 1.0, rel=1e-3)

    # the parent run's card time: the command's wall time, from before Ray's start, × the cluster's 1 logical GPU
    held_s = client.get_run(result.parent_run_id).data.metrics
    assert span < held_s[R.SWEEP_WALL_S] <= held and held_s[R.CLUSTER_GPUS] == 1.0
    assert held_s[R.CARD_HOURS] == pytest.approx(held_s[R.SWEEP_WALL_S] / 3600)

    sweep = RU.load_sweep(resolve_tracking_uri(), "pe-fusion", result.parent_run_id)
    table = CO.compute_table(sweep.trials, RU.epoch_points(sweep, CO.SERIES)).set_index(RU.TRIAL_ID)
    for run in runs:
        rates = [m.value for m in client.get_metric_history(run.info.run_id, R.TRAIN_SAMPLES_PER_S)]
        row = table.loc[run.data.tags[R.TAG_TRIAL_ID]]
        assert row[f"{R.TRAIN_SAMPLES_PER_S}_mean"] == pytest.approx(np.mean(rates))
        assert row[CO.CPU_HOURS] == pytest.approx(run.data.metrics[R.WALL_S] * 0.5 / 3600)
        assert row[CO.GPU_HOURS] == 0


def test_arxiv_grid_script_end_to_end(local_ray, in_tmp, cache_dir, capsys):
    """The script as a user runs it: CSVs written and logged to the parent run, a compact table printed."""
    from mlflow.tracking import MlflowClient

    grid = load_script("sweeps/arxiv_grid.py")
    code = grid.main(["--preset", "arxiv", "--synthetic", "--smoke", "--cache-dir", str(cache_dir),
                      "--pe-types", "sinusoidal,rope", "--fusions", "add,mlp_gate", "--seeds", "0", "--name", "e2e",
                      "--no-dashboard"])
    assert code == 0
    out = capsys.readouterr().out
    assert "4 trials, 4 ok, 0 failed" in out
    by_seed = pd.read_csv(in_tmp / "results" / "e2e_results_by_seed.csv")
    agg = pd.read_csv(in_tmp / "results" / "e2e_results_aggregated.csv")
    assert len(by_seed) == 4 and set(by_seed[R.STATUS]) == {R.STATUS_OK}
    assert len(agg) == 4 and (agg["n_seeds"] == 1).all() and (agg["n_failed"] == 0).all()
    client = MlflowClient(resolve_tracking_uri())
    exp = client.get_experiment_by_name("pe-fusion")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
    # a main called in-process records the sweep's installed command (this process's own is pytest's)
    assert parent.data.tags[R.TAG_SWEEP] == "arxiv_grid"
    assert parent.data.tags[R.TAG_COMMAND].startswith("pefusion-grid --preset arxiv --synthetic --smoke")
    assert parent.data.metrics["n_failed"] == 0
    # the plan printed before Ray started is the one on the parent run, with its estimate
    assert out.index("plan: 4 trials of arxiv_grid") < out.index("4 trials, 4 ok")
    assert parent.data.tags[R.TAG_PLAN] in out and parent.data.tags[R.TAG_PLAN_UNIT] == "core-hours"
    assert parent.data.metrics[R.PLAN_WALL_S] > 0 and parent.data.metrics[R.PLAN_CONCURRENT] >= 1
    logged = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, R.ARTIFACT_RESULTS_DIR)}
    assert logged == {"e2e_results_by_seed.csv", "e2e_results_aggregated.csv"}


# On the contradicting corpus (conftest: validation = test with flipped labels), min_delta 1 makes the first epoch
# the best by construction and patience 6 ends each trial at epoch 7, whose weights learnt more of the rule: they
# score lower on validation and higher on test than the checkpoint's. A checkpoint, val_acc or test_acc taken from
# the last epoch shows. device cpu: the test retrains these configs in its own process and compares weights bit for
# bit, which holds only on the same device (on a GPU machine the test process would otherwise pick CUDA).
BEST_NOT_LAST_SPACE = """\
pe_type: {grid: [learned]}
fusion: {grid: [concat]}
seed: {grid: [0, 1]}
lr: 0.01
max_epochs: 20
patience: 6
min_delta: 1.0
device: cpu
"""


@pytest.fixture(scope="module")
def best_not_last_sweep(local_ray, cache_dir, tmp_path_factory, contradicting_dir,
                        contradicting_corpus) -> SimpleNamespace:
    """`sweeps/arxiv_grid.py` run once, as a user runs it, on BEST_NOT_LAST_SPACE over the contradicting corpus's
    folder (its own folder, sqlite store and search-space file); the tests below read what it left in MLflow and
    in results/, and `corpus` is the same folder loaded in this process."""
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("best_not_last")
    space = tmp / "best_not_last.yaml"
    space.write_text(BEST_NOT_LAST_SPACE)
    uri = f"sqlite:///{tmp}/mlflow.db"
    grid = load_script("sweeps/arxiv_grid.py")
    with pytest.MonkeyPatch.context() as mp:  # artifacts (./mlartifacts) and results/ land in tmp
        mp.chdir(tmp)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        code = grid.main(["--preset", "arxiv", "--data-dir", str(contradicting_dir), "--smoke",
                          "--cache-dir", str(cache_dir), "--search-space", str(space), "--name", "bnl",
                          "--no-dashboard"])
    assert code == 0
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("pe-fusion")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
    children = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent.info.run_id}'")
    rows = pd.read_csv(tmp / "results" / "bnl_results_by_seed.csv")
    return SimpleNamespace(tmp=tmp, uri=uri, client=client, space=space, parent=parent, children=children,
                           rows=rows, corpus=contradicting_corpus)


def _download(sweep: SimpleNamespace, run_id: str, path: str) -> Path:
    import mlflow

    return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path, tracking_uri=sweep.uri,
                                                    dst_path=str(sweep.tmp / "dl" / run_id)))


def _predict(model: torch.nn.Module, split, batch_size: int) -> np.ndarray:
    """Predictions of `model` in the split's order, computed here, not by pefusion.fusion.training."""
    preds = np.empty(len(split), dtype=np.int64)
    model.eval()
    with torch.no_grad():
        for batch in iter_batches(split, batch_size, shuffle=False):
            preds[batch.index.numpy()] = model(batch.tokens).argmax(-1).numpy()
    return preds


def test_child_run_checkpoint_is_the_best_epochs_weights(best_not_last_sweep, smoke_preset):
    """The `checkpoint/model.pt` of each child run equals the weights this test saw after the trial's best
    validation epoch (training the same config again here, one thread as in the trial, snapshotting every
    epoch), not the last epoch's; and what those weights give on the test split is the run's test_acc and its
    per-length-bucket accuracies."""
    import yaml

    from pefusion.fusion.config import split_trial_config
    from pefusion.fusion.model import build_model_from_config

    sweep, corpus = best_not_last_sweep, best_not_last_sweep.corpus
    constants = {k: v for k, v in yaml.safe_load(BEST_NOT_LAST_SPACE).items() if not isinstance(v, dict)}
    assert len(sweep.children) == 2
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the trainable's thread count: the same float arithmetic, the same weights
    try:
        for run in sweep.children:
            config = {R.PE_TYPE: "learned", R.FUSION: "concat", R.SEED: int(run.data.params[R.SEED]), **constants}
            model_cfg, train_cfg = split_trial_config(config, smoke_preset)
            bs = train_cfg.batch_size
            fresh = build_model_from_config(model_cfg, corpus.vocab_size, corpus.num_classes)
            trainer = Trainer(model_cfg, train_cfg, corpus)  # reseeds: building `fresh` first changes nothing
            snapshots, val, bad = [], [], 0
            while bad < train_cfg.patience:  # early stopping by this test's own count
                trainer.train_epoch()
                snapshots.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
                fresh.load_state_dict(snapshots[-1])
                val.append(float(np.mean(_predict(fresh, corpus.validation, bs) == corpus.validation.labels)))
                bad = 0 if val[-1] > max(val[:-1], default=-1.0) + train_cfg.min_delta else bad + 1
            best = int(np.argmax(val))
            assert (best, len(snapshots)) == (0, 1 + train_cfg.patience)  # the corpus's construction (conftest)

            metrics = run.data.metrics
            assert (metrics[R.BEST_EPOCH], metrics[R.EPOCHS_RUN]) == (best + 1, len(snapshots))
            saved = torch.load(_download(sweep, run.info.run_id, R.ARTIFACT_CHECKPOINT_DIR) / "model.pt",
                               weights_only=True)
            assert saved.keys() == snapshots[best].keys()
            assert all(torch.equal(saved[k], snapshots[best][k]) for k in saved), "checkpoint != best epoch's weights"
            assert not all(torch.equal(saved[k], snapshots[-1][k]) for k in saved)

            fresh.load_state_dict(saved)
            preds = _predict(fresh, corpus.test, bs)
            assert metrics[R.TEST_ACC] == pytest.approx(np.mean(preds == corpus.test.labels))
            assert metrics[R.BEST_VAL_ACC] == pytest.approx(val[best])
            edges = smoke_preset.data.length_edges
            labels = [f"le{e}" for e in edges] + [f"gt{edges[-1]}"]
            lo = [-1, *edges]
            raw = corpus.test.raw_lengths
            buckets = 0
            for i, label in enumerate(labels):
                sel = (raw > lo[i]) & (raw <= edges[i]) if i < len(edges) else raw > edges[-1]
                key = R.length_metric(label)
                if sel.any():
                    buckets += 1
                    assert metrics[key] == pytest.approx(np.mean(preds[sel] == corpus.test.labels[sel])), key
                else:
                    assert key not in metrics, key
            assert buckets == 2  # short and long documents (conftest)
            # the last epoch learnt more of the training rule: a test_acc taken from its weights would show too
            fresh.load_state_dict(snapshots[-1])
            assert np.mean(_predict(fresh, corpus.test, bs) == corpus.test.labels) > metrics[R.TEST_ACC]
    finally:
        torch.set_num_threads(threads)


def test_mlflow_child_runs_hold_the_csv_values_and_the_parent_its_provenance(best_not_last_sweep):
    """For every trial: the child run's final metrics equal its row of `results/<name>_results_by_seed.csv`,
    `val_acc` (the latest value, what the MLflow UI shows) is the restored best checkpoint's (= best_val_acc,
    the maximum of the per-epoch series, not its last point), `length_buckets.json` equals the run's
    `test_acc_len_*`/`test_n_len_*` metrics and the CSV; the parent run names the commit and the search-space
    file that ran."""
    import json

    sweep = best_not_last_sweep
    client, rows = sweep.client, sweep.rows.set_index("trial_id")
    assert len(sweep.children) == len(rows) == 2
    assert sorted(rows[R.SEED]) == [0, 1] and set(rows["lr"]) == {0.01}  # the file's grid and constants ran
    for run in sweep.children:
        row, metrics = rows.loc[run.data.tags[R.TAG_TRIAL_ID]], run.data.metrics
        assert run.info.status == "FINISHED" and row[R.STATUS] == R.STATUS_OK
        for key in (R.BEST_EPOCH, R.EPOCHS_RUN, R.PARAMS):
            assert metrics[key] == row[key], key
        for key in (R.TEST_ACC, R.BEST_VAL_ACC, R.TEST_MACRO_F1, R.VAL_ACC):  # the CSV's are in %, 2 decimals
            assert row[f"{key}_pct"] == pytest.approx(metrics[key] * 100, abs=0.005 + 1e-9), key
        for key in (R.PE_TYPE, R.FUSION, R.SEED, "lr", "patience", "max_epochs"):
            assert run.data.params[key] == str(row[key]), key

        epochs = int(row[R.EPOCHS_RUN])
        history = sorted(client.get_metric_history(run.info.run_id, R.VAL_ACC), key=lambda m: m.step)
        per_epoch = [m.value for m in history if m.step <= epochs]
        assert [m.step for m in history] == list(range(1, epochs + 2))  # each epoch once, then the final value
        assert metrics[R.BEST_VAL_ACC] == max(per_epoch)
        assert metrics[R.BEST_EPOCH] == per_epoch.index(max(per_epoch)) + 1
        assert metrics[R.VAL_ACC] == metrics[R.BEST_VAL_ACC]  # the final val_acc is the restored best's
        assert per_epoch[-1] < max(per_epoch)  # the corpus's construction (conftest): the last epoch scores lower

        buckets = json.loads((_download(sweep, run.info.run_id, R.ARTIFACT_LENGTH_BUCKETS)).read_text())
        logged = {k: v for k, v in metrics.items() if k.startswith((R.LENGTH_METRIC_PREFIX, R.LENGTH_COUNT_PREFIX))}
        assert any(k.startswith(R.LENGTH_METRIC_PREFIX) for k in buckets)
        assert buckets == logged
        in_csv = {k.removesuffix("_pct"): row[k] for k in row.index
                  if k.startswith((R.LENGTH_METRIC_PREFIX, R.LENGTH_COUNT_PREFIX)) and pd.notna(row[k])}
        assert in_csv == pytest.approx({k: v * 100 if k.startswith(R.LENGTH_METRIC_PREFIX) else v  # CSV: %, 2 dp
                                        for k, v in buckets.items()}, abs=0.005 + 1e-9)

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    commit = head.stdout.strip()
    assert len(commit) == 40
    assert sweep.parent.data.tags[R.TAG_GIT_COMMIT] == commit
    assert {run.data.tags[R.TAG_GIT_COMMIT] for run in sweep.children} == {commit}
    assert Path(sweep.parent.data.tags[R.TAG_SEARCH_SPACE]).resolve() == sweep.space.resolve()


def test_lr_batch_asha_stops_trials_early(local_ray, in_tmp, cache_dir, capsys):
    asha = load_script("sweeps/lr_batch_asha.py")
    code = asha.main(["--preset", "arxiv", "--synthetic", "--smoke", "--cache-dir", str(cache_dir),
                      "--search", "optuna", "--num-samples", "6", "--max-t", "4", "--reduction-factor", "2",
                      "--name", "asha", "--no-dashboard"])
    assert code == 0
    out = capsys.readouterr().out
    rows = pd.read_csv(in_tmp / "results" / "asha_results_by_seed.csv")
    assert len(rows) == 6 and rows["lr"].nunique() == 6
    assert (rows[R.STATUS] == R.STATUS_STOPPED).sum() >= 1  # ASHA stopped someone
    assert (rows[R.STATUS] == R.STATUS_OK).sum() >= 1  # and someone trained the whole budget and was tested
    assert rows.loc[rows[R.STATUS] == R.STATUS_OK, R.TEST_ACC + "_pct"].notna().all()  # percent, as headed
    assert rows[R.EPOCHS_RUN].sum() < 6 * 4
    assert "best configuration:" in out and f"of {6 * 4} without early stopping" in out


def test_lambda_cv_sweep_records_points_curves_and_lambda_star(local_ray, in_tmp, capsys):
    from mlflow.tracking import MlflowClient

    cv = load_script("sweeps/lambda_cv.py")
    code = cv.main(["--smoke", "--alphas", "0.5,1.5", "--seeds", "0", "--name", "cv",
                                         "--no-dashboard"])
    assert code == 0
    rows = pd.read_csv(in_tmp / "results" / "cv_results.csv")
    assert len(rows) == 4 and set(rows[R.STATUS]) == {R.STATUS_OK}
    assert set(zip(rows[R.ALPHA], rows[R.INIT])) == {(a, i) for a in (0.5, 1.5) for i in ("semantic", "positional")}
    lam_grid = set(np.logspace(-4, 0, 3))  # the smoke grid: 3 values in [1e-4, 1]
    assert all(min(abs(l - g) for g in lam_grid) < 1e-12 for l in rows[R.LAMBDA_STAR])
    for key in (R.EPS_G, R.EPS_T, R.M, R.THETA, R.EPS_LIN):
        assert rows[key].notna().all() and (rows[key] >= 0).all()
    # the linear baseline sees z only: the same for both initialisations at a point
    assert rows.groupby(R.ALPHA)[R.EPS_LIN].nunique().eq(1).all()

    client = MlflowClient(resolve_tracking_uri())
    exp = client.get_experiment_by_name("student-attention")
    runs = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'trial'")
    assert len(runs) == 4
    run = runs[0]
    assert {R.ALPHA, R.INIT, R.SEED, R.OMEGA, R.SIGMA, "d"} <= set(run.data.params)
    assert {R.EPS_G, R.EPS_T, R.M, R.THETA, R.EPS_LIN, R.LAMBDA_STAR} <= set(run.data.metrics)
    assert R.CV_CURVE_ARTIFACT in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_phase_diagram_rejects_an_init_axis_and_bad_points(in_tmp):
    cv = load_script("sweeps/phase_diagram.py")
    space = in_tmp / "space.yaml"
    space.write_text("alpha: {grid: [0.5]}\ninit: {grid: [semantic, positional]}\n")
    with pytest.raises(ConfigError, match="fits both initialisations"):
        cv.main(["--smoke", "--search-space", str(space)])
    with pytest.raises(ConfigError, match="alpha"):
        cv.main(["--smoke", "--alphas", "0"])
    with pytest.raises(ConfigError, match="omega"):
        cv.main(["--smoke", "--omegas", "1.5"])


# The d → ∞ theory's α_c at σ 0.5, λ 0.01 (docs/theory.md; the published table says 0.928 and 1.241).
THEORY_ALPHA_C = {0.2: 0.947, 0.3: 1.252}


@pytest.mark.slow
def test_phase_diagram_demo_shows_one_transition_near_the_theory(local_ray, in_tmp):
    """The README's `sweeps/phase_diagram.py --preset demo` (minutes on 2 cores): along α at each ω the points
    called from the seeds change between positional and semantic at most once, and the seed-mean training-loss
    gap crosses within 0.2 of the theory's α_c (the d = 200, 1 500-step demo crossed at 0.70 for ω 0.2)."""
    from pefusion.analysis import student_tables as ST

    assert load_script("sweeps/phase_diagram.py").main(["--preset", "demo", "--name", "demo",
                                                        "--no-dashboard"]) == 0
    rows = pd.read_csv(in_tmp / "results" / "demo_results.csv")
    assert set(rows[R.STATUS]) == {R.STATUS_OK} and rows[R.SEED].nunique() >= 2
    deltas = pd.DataFrame({"source": ST.SOURCE_PHASE, R.ALPHA: rows[R.ALPHA], R.OMEGA: rows[R.OMEGA],
                           R.SIGMA: rows[R.SIGMA], R.D: rows[R.D], ST.LAM_FIXED: rows[R.LAMBDA],
                           R.SEED: rows[R.SEED], "delta_eps_g": 0.0,
                           "delta_eps_t": rows["eps_t_positional"] - rows["eps_t_semantic"]})
    crossing = ST.crossing_alphas(deltas).set_index(R.OMEGA)
    for omega, row in crossing.iterrows():
        assert row.n_call_changes <= 1, (omega, row.sign_changes)
        if omega in THEORY_ALPHA_C:
            assert abs(row.alpha_c_estimate - THEORY_ALPHA_C[omega]) < 0.2, (omega, row.alpha_c_estimate)
    assert set(THEORY_ALPHA_C) & set(crossing.index)


# ---------------------------------------------------------------------------------------------------------
# The README's commands with their defaults: --preset demo's search spaces, lr_batch_asha's random search and
# FIFO scheduler, Optuna's sampler seed
# ---------------------------------------------------------------------------------------------------------


def _space_file(name: str) -> dict:
    """A search-space YAML of the repository, read here independently of pefusion.sweep.space."""
    return yaml.safe_load((REPO / "search_spaces" / name).read_text())


def _sweep_runs(name: str, experiment: str = "pe-fusion"):
    """(client, parent run, child runs) of the sweep `--name name` in this test's MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(resolve_tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    parents = [p for p in client.search_runs([exp.experiment_id], f"tags.`{R.TAG_ROLE}` = 'sweep'")
               if Path(p.data.tags[R.TAG_STORAGE]).name == name]
    assert len(parents) == 1, [p.data.tags[R.TAG_STORAGE] for p in parents]
    children = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parents[0].info.run_id}'")
    return client, parents[0], children


def _epochs_logged(client, run) -> list[int]:
    """Steps of a per-epoch-only metric (val_acc also has the final value, one step past the last epoch)."""
    return [m.step for m in client.get_metric_history(run.info.run_id, R.TRAIN_LOSS)]


@pytest.mark.parametrize("sweep,narrowing,demo_file", [
    ("arxiv_grid", ["--pe-types", "sinusoidal", "--fusions", "add"], "arxiv_grid_demo.yaml"),
    ("lambda_cv", ["--alphas", "0.5", "--inits", "semantic"], "lambda_cv_demo.yaml"),
])
def test_preset_demo_runs_the_demo_search_space(local_ray, in_tmp, sweep, narrowing, demo_file):
    """`--preset demo` sweeps search_spaces/<sweep>_demo.yaml: the seeds the trials ran are the demo file's,
    which differ from the default file's (narrowed on the other axes to seconds; the seed axis is left alone)."""
    demo_seeds = _space_file(demo_file)[R.SEED]["grid"]
    assert demo_seeds != _space_file(f"{sweep}.yaml")[R.SEED]["grid"]  # else this test could not tell them apart
    script = load_script(f"sweeps/{sweep}.py")
    argv = ["--preset", "demo", "--smoke", *narrowing, "--name", "demo", "--no-dashboard"]
    code = script.main(argv)
    assert code == 0
    experiment = "pe-fusion" if sweep == "arxiv_grid" else "student-attention"
    _, parent, children = _sweep_runs("demo", experiment)
    assert Path(parent.data.tags[R.TAG_SEARCH_SPACE]).resolve() == (REPO / "search_spaces" / demo_file).resolve()
    assert sorted(int(c.data.params[R.SEED]) for c in children) == sorted(demo_seeds)
    assert all(c.data.tags[R.TAG_STATUS] == R.STATUS_OK for c in children)


@pytest.mark.parametrize("sweep,ext,flags,space_file", [
    ("arxiv_grid", ".csv", ["--pe-types", "sinusoidal", "--fusions", "add", "--seeds", "0"], "arxiv_grid.yaml"),
    ("lr_batch_asha", ".parquet", ["--num-samples", "2", "--max-t", "1"], "lr_batch_text.yaml"),
])
def test_preset_text_runs_every_pe_fusion_sweep_on_a_folder_with_string_labels(local_ray, in_tmp, sweep, ext, flags,
                                                                            space_file):
    """`--preset text --data-dir DIR` and nothing else about the data: string labels, the preset's `words`
    tokeniser and recipe on every child run, and the text search space for the search."""
    rng, data = np.random.default_rng(0), in_tmp / "reviews"
    data.mkdir()
    words = {"pos": ["great", "superb", "fine"], "neg": ["awful", "dull", "poor"]}
    for split, n in (("train", 40), ("validation", 12), ("test", 12)):
        labels = rng.choice(["pos", "neg"], n)
        texts = [" ".join(rng.choice(words[y] + ["the", "film", "<br />"], 12)) + "." for y in labels]
        frame = pd.DataFrame({"text": texts, "label": labels})
        frame.to_csv(data / f"{split}.csv", index=False) if ext == ".csv" else frame.to_parquet(data / f"{split}.parquet")
    code = load_script(f"sweeps/{sweep}.py").main(["--preset", "text", "--data-dir", str(data), "--smoke", *flags,
                                                    "--name", "text", "--no-dashboard"])
    assert code == 0
    _, parent, children = _sweep_runs("text")
    assert Path(parent.data.tags[R.TAG_SEARCH_SPACE]).name == space_file
    assert children and all(c.data.tags[R.TAG_STATUS] in (R.STATUS_OK, R.STATUS_STOPPED) for c in children)
    for child in children:
        params = child.data.params
        assert (params["tokenizer"], params["norm_first"], params["final_norm"]) == ("words", "True", "True")
        assert params[R.DATASET] == "reviews"


def test_lr_batch_asha_default_random_search_samples_lr_batch_yaml(local_ray, in_tmp, cache_dir, capsys):
    """`python sweeps/lr_batch_asha.py` with its defaults (random search, ASHA, search_spaces/lr_batch.yaml):
    every trial's configuration comes from the file, and the printed epoch budget is what MLflow logged."""
    asha = load_script("sweeps/lr_batch_asha.py")
    n, max_t = 4, 3
    code = asha.main(["--preset", "arxiv", "--synthetic", "--smoke", "--cache-dir", str(cache_dir),
                      "--num-samples", str(n), "--max-t", str(max_t), "--name", "random", "--no-dashboard"])
    assert code == 0
    out = capsys.readouterr().out
    space = _space_file("lr_batch.yaml")
    lo, hi = map(float, space["lr"]["loguniform"])  # YAML 1.1 reads 1e-4 as a string
    batch_sizes = space["batch_size"]["choice"]
    client, parent, children = _sweep_runs("random")
    assert Path(parent.data.tags[R.TAG_SEARCH_SPACE]).name == "lr_batch.yaml"
    assert len(children) == n
    lrs = [float(c.data.params["lr"]) for c in children]
    assert all(lo <= lr <= hi for lr in lrs) and len(set(lrs)) == n  # sampled, one value per trial
    assert {int(c.data.params["batch_size"]) for c in children} <= set(batch_sizes)
    for key in (R.PE_TYPE, R.FUSION, R.SEED):  # the file's constants
        assert {c.data.params[key] for c in children} == {str(space[key])}
    epochs = {c.data.tags[R.TAG_TRIAL_ID]: _epochs_logged(client, c) for c in children}
    for child in children:
        logged = epochs[child.data.tags[R.TAG_TRIAL_ID]]
        assert logged == list(range(1, len(logged) + 1)) and 1 <= len(logged) <= max_t
        assert child.data.tags[R.TAG_STATUS] in (R.STATUS_OK, R.STATUS_STOPPED)
        assert child.data.metrics[R.EPOCHS_RUN] == len(logged)
        if child.data.tags[R.TAG_STATUS] == R.STATUS_OK:  # no in-trial early stopping here: the whole budget
            assert len(logged) == max_t and R.TEST_ACC in child.data.metrics
    trained = sum(len(e) for e in epochs.values())
    n_stopped = sum(c.data.tags[R.TAG_STATUS] == R.STATUS_STOPPED for c in children)
    assert (f"epochs trained: {trained} of {n * max_t} without early stopping ({100 * trained / (n * max_t):.1f}%); "
            f"{n_stopped} trial{'' if n_stopped == 1 else 's'} stopped by ASHA, 0 failed") in out
    # What the search report reads: who spent the budget, and the budget as the parent run logged it.
    assert parent.data.tags[R.TAG_SCHEDULER] == "asha"
    assert (parent.data.metrics[R.EPOCHS_TRAINED], parent.data.metrics[R.EPOCHS_FULL_BUDGET]) == (trained, n * max_t)


def test_lr_batch_asha_fifo_trains_every_trial_for_max_t_epochs(local_ray, in_tmp, smoke_preset, smoke_corpus,
                                                                cache_dir, capsys):
    """`--scheduler fifo`: every trial trains --max-t epochs and none is 'stopped'. The trials are set up so
    that either early stopping would end one: a frozen learning rate keeps validation accuracy flat (the paper's
    in-trial patience would stop it), and the first trial starts with higher accuracy than the second (ASHA would
    stop the second at its first rung)."""
    from pefusion.fusion.config import split_trial_config
    from pefusion.fusion.training import Trainer

    fixed = {"lr": 1e-12, "batch_size": 64, R.PE_TYPE: "sinusoidal", R.FUSION: "gate_scalar"}

    def initial_val_acc(seed: int) -> float:
        model_cfg, train_cfg = split_trial_config({**fixed, R.SEED: seed}, smoke_preset)
        return Trainer(model_cfg, train_cfg, smoke_corpus).evaluate(smoke_corpus.validation)["acc"]

    acc = {seed: initial_val_acc(seed) for seed in range(6)}
    first, second = max(acc, key=acc.get), min(acc, key=acc.get)
    space = in_tmp / "frozen.yaml"
    space.write_text(yaml.safe_dump({**fixed, R.SEED: {"grid": [first, second]}}))
    max_t = smoke_preset.train.patience + 2
    asha = load_script("sweeps/lr_batch_asha.py")
    code = asha.main(["--preset", "arxiv", "--synthetic", "--smoke", "--cache-dir", str(cache_dir),
                      "--search-space", str(space), "--scheduler", "fifo", "--num-samples", "1", "--max-t", str(max_t),
                      "--max-concurrent", "1", "--name", "fifo", "--no-dashboard"])
    assert code == 0
    out = capsys.readouterr().out
    client, parent, children = _sweep_runs("fifo")
    assert parent.data.tags[R.TAG_SCHEDULER] == "fifo"
    by_seed = {int(c.data.params[R.SEED]): c for c in children}
    assert set(by_seed) == {first, second}
    # the setup: accuracy is flat, and the second trial is below the first at epoch 1
    histories = {s: [m.value for m in client.get_metric_history(c.info.run_id, R.VAL_ACC)]
                 for s, c in by_seed.items()}
    assert histories[first][0] > histories[second][0]
    assert all(len(set(h)) == 1 for h in histories.values())
    for child in children:
        assert child.data.tags[R.TAG_STATUS] == R.STATUS_OK
        assert _epochs_logged(client, child) == list(range(1, max_t + 1))
        assert child.data.metrics[R.EPOCHS_RUN] == max_t and R.TEST_ACC in child.data.metrics
    rows = pd.read_csv(in_tmp / "results" / "fifo_results_by_seed.csv")
    assert list(rows[R.STATUS]) == [R.STATUS_OK] * 2 and list(rows[R.EPOCHS_RUN]) == [max_t] * 2
    assert (f"epochs trained: {2 * max_t} of {2 * max_t} without early stopping (100.0%); 0 trials stopped by "
            f"ASHA, 0 failed") in out


def test_optuna_sampler_seed_fixes_the_sampled_configurations(local_ray, in_tmp, cache_dir):
    """`--search optuna --sampler-seed S`: the same S samples the same configurations, another S others."""
    asha = load_script("sweeps/lr_batch_asha.py")

    def sampled(name: str, seed: int) -> list[tuple[float, int]]:
        code = asha.main(["--preset", "arxiv", "--synthetic", "--smoke", "--cache-dir", str(cache_dir),
                          "--search", "optuna", "--sampler-seed", str(seed), "--num-samples", "3", "--max-t", "1",
                          "--name", name, "--no-dashboard"])
        assert code == 0
        _, _, children = _sweep_runs(name)
        assert len(children) == 3
        return sorted((float(c.data.params["lr"]), int(c.data.params["batch_size"])) for c in children)

    first, again, other = sampled("seed7", 7), sampled("seed7-again", 7), sampled("seed8", 8)
    assert first == again
    assert {lr for lr, _ in other}.isdisjoint({lr for lr, _ in first})


def test_a_new_per_epoch_metric_of_any_trainable_reaches_mlflow_listed_nowhere(local_ray, in_tmp, capsys):
    """A toy study (not PE-fusion) whose trainable reports a metric no module names: its whole per-epoch series
    is in MLflow, its final value one step past the last epoch (the run's value), the study's own experiment is
    used, and the progress line names the trial by the searched key and shows the study's metric."""
    from mlflow.tracking import MlflowClient

    from pefusion.errors import KeyRule
    from pefusion.sweep.driver import run_sweep
    from pefusion.sweep.space import parse_search_space
    from pefusion.sweep.study import StudySweep

    def toy(config, **shipped):
        from ray import tune

        for epoch in (1, 2, 3):
            tune.report({"epoch": epoch, "toy_metric": config["x"] * epoch, "toy_loss": 1.0 / epoch})
        tune.report({"status": "ok", "error": "", "epochs_run": 3, "toy_metric": 100.0 * config["x"],
                     "toy_final": 7.0})

    space = parse_search_space({"x": {"grid": [1, 2]}, "unused": 5}, {"x": KeyRule(int), "unused": KeyRule(int)})
    study = StudySweep(sweep="toy", preset="tiny", experiment="toy-study", space=space, trainable=toy,
                       ship=dict, check_point=lambda point: None, static_params={}, identity={}, sort_keys=("x",),
                       run_name=lambda config: "", shown={"toy_metric": lambda v: f"toy {v:g}"})
    opts = _options(in_tmp, max_concurrent=1)
    opts.experiment, opts.sweep = None, "toy"
    result = run_sweep(study, opts, in_tmp / "results")
    assert list(result.rows["status"]) == ["ok", "ok"]
    assert "x 2: ok, toy 200" in capsys.readouterr().out

    client = MlflowClient(resolve_tracking_uri())
    exp = client.get_experiment_by_name("toy-study")
    runs = client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{result.parent_run_id}'")
    assert len(runs) == 2
    for run in runs:
        x = int(run.data.params["x"])
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "toy_metric"))
        assert history == [(1, x), (2, 2 * x), (3, 3 * x), (4, 100 * x)]
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "toy_loss")) == [1, 2, 3]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "toy_final")] == [0]
        assert run.data.metrics["toy_metric"] == 100 * x
        assert set(run.data.metrics) == {"toy_metric", "toy_loss", "toy_final", "epochs_run"}  # none of Ray's


def test_a_trial_that_raises_in_a_search_is_recorded_and_the_search_goes_on(local_ray, in_tmp):
    """With a metric to optimise (a search), Tune refuses a result without it; a trial whose own code raises is
    still recorded once as an error (the metric NaN beside it) and the other trials run to their end."""
    from pefusion.errors import KeyRule
    from pefusion.sweep.driver import run_sweep
    from pefusion.sweep.space import parse_search_space
    from pefusion.sweep.study import StudySweep

    def toy(config, **shipped):
        from ray import tune

        if config["x"] == 2:
            raise ValueError("x = 2 is a bug")
        tune.report({"epoch": 1, "score": float(config["x"])})
        tune.report({"status": "ok", "error": "", "epochs_run": 1, "score": float(config["x"])})

    space = parse_search_space({"x": {"grid": [1, 2, 3]}}, {"x": KeyRule(int)})
    study = StudySweep(sweep="toy", preset="tiny", experiment="toy-study", space=space, trainable=toy,
                       ship=dict, check_point=lambda point: None, static_params={}, identity={}, sort_keys=("x",),
                       run_name=lambda config: "", metric="score", mode="max")
    opts = _options(in_tmp, max_concurrent=1)
    opts.experiment, opts.sweep = None, "toy"
    rows = run_sweep(study, opts, in_tmp / "results").rows
    assert list(rows["status"]) == ["ok", "error", "ok"]
    assert rows.loc[1, "error"] == "ValueError: x = 2 is a bug"


def test_a_stacked_grid_is_one_run_per_seed_in_every_record(local_ray, in_tmp, smoke_preset, smoke_corpus):
    """`stack=True` (`--stack-seeds`): 2 trials train 2 seeds each, and every record holds 4 runs as separate
    trials would: a CSV row each (keyed `<trial>/seed=<s>`), an MLflow child run each with its own seed, params,
    per-epoch series, final metrics and best checkpoint (which, loaded here, scores the run's test accuracy), and
    Table 1's cells count 2 seeds; only the tag `pefusion.stacked_in` names the trial that carried them."""
    import mlflow

    from pefusion.cli.fusion import aggregate_rows
    from pefusion.fusion.model import load_checkpoint

    result = _sweep(smoke_corpus, smoke_preset, _grid(fusion=["add", "concat"], seed=[0, 1]),
                    _options(in_tmp, stack=True))
    rows = result.rows
    assert len(rows) == 4 and set(rows[R.STATUS]) == {R.STATUS_OK}
    trials = {key.split("/")[0] for key in rows["trial_id"]}
    assert len(trials) == 2
    assert sorted(rows["trial_id"]) == sorted(f"{t}/seed={s}" for t in trials for s in (0, 1))
    assert sorted(zip(rows[R.FUSION], rows[R.SEED])) == [("add", 0), ("add", 1), ("concat", 0), ("concat", 1)]
    assert (aggregate_rows(rows).set_index(R.FUSION)["n_seeds"] == 2).all()

    client, runs = _children(result.parent_run_id)
    assert len(runs) == 4
    for run in runs:
        key, seed = run.data.tags[R.TAG_TRIAL_ID], int(run.data.params[R.SEED])
        assert key == f"{run.data.tags[R.TAG_STACKED]}/seed={seed}" and run.data.tags[R.TAG_STACKED] in trials
        assert run.info.status == "FINISHED" and run.data.params[R.PRECISION] == "fp32"
        epochs = int(run.data.metrics[R.EPOCHS_RUN])
        for name in EPOCH_METRICS:
            assert [m.step for m in client.get_metric_history(run.info.run_id, name)][:epochs] == \
                list(range(1, epochs + 1)), name
        for name in FINAL_METRICS:
            assert name in run.data.metrics, name
        row = rows.set_index("trial_id").loc[key]
        assert run.data.metrics[R.TEST_ACC] == pytest.approx(row[R.TEST_ACC])
        local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=R.ARTIFACT_CHECKPOINT_DIR,
                                                    tracking_uri=resolve_tracking_uri(),
                                                    dst_path=str(in_tmp / "dl" / run.info.run_id))
        preds = _predict(load_checkpoint(local), smoke_corpus.test, 64)
        assert np.mean(preds == smoke_corpus.test.labels) == pytest.approx(run.data.metrics[R.TEST_ACC])
