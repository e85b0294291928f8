"""Sweeps on a real local Ray with a real sqlite MLflow: fractional GPUs, failures, MLflow contents, checkpoints,
ASHA, and the bad-input matrix (rejected before Ray starts)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from conftest import REPO, load_script
from pefusion import record as R
from pefusion.config import ConfigError
from pefusion.tracking import resolve_tracking_uri


def _options(tmp: Path, **kw):
    from pefusion.tuning import SweepOptions

    kw.setdefault("cpus_per_trial", 1.0)
    return SweepOptions(sweep="arxiv_grid", experiment="pe-fusion", storage_path=str(tmp / "ray_results"),
                        dashboard=False, verbose=0, **kw)


def _grid(**axes):
    from ray import tune

    return {k: tune.grid_search(v) for k, v in axes.items()}


def _children(parent_run_id: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(resolve_tracking_uri())
    exp = client.get_experiment_by_name("pe-fusion")
    return client, client.search_runs([exp.experiment_id], f"tags.`{R.TAG_PARENT}` = '{parent_run_id}'")


def test_fractional_gpus_run_four_trials_at_once(local_ray, in_tmp, smoke_preset, smoke_corpus):
    """0.25 GPU per trial on one logical GPU: four trials run together, each sees one device."""
    from pefusion.fusion_sweep import pefusion_trainable, run_pefusion_sweep

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

    rows, _, _ = run_pefusion_sweep(smoke_corpus, smoke_preset, "smoke", _grid(seed=[0, 1, 2, 3]),
                                    _options(in_tmp, cpus_per_trial=0.5, gpus_per_trial=0.25),
                                    trainable=trainable_with_barrier)
    assert list(rows[R.STATUS]) == [R.STATUS_OK] * 4
    assert set(rows["visible_devices"]) == {"0"}  # Ray assigned the one (logical) GPU to each trial
    starts, ends = rows["started_at"], rows["ended_at"]
    assert starts.max() < ends.min()  # all four intervals overlap


def test_failures_are_recorded_never_dropped(local_ray, in_tmp, smoke_preset, smoke_corpus):
    """A trial that raises and one that diverges leave the sweep complete and are recorded with their reason."""
    from pefusion.fusion_sweep import aggregate_rows, pefusion_trainable, run_pefusion_sweep, summary_table

    def faulty(config, **kwargs):
        if config["fusion"] == "concat" and config["seed"] == 1:
            raise RuntimeError("injected failure")
        if config["fusion"] == "add" and config["seed"] == 1:
            config = {**config, "lr": 1e30}  # Adam steps of 1e30 overflow the attention logits at step 2
        return pefusion_trainable(config, **kwargs)

    rows, recorder, _ = run_pefusion_sweep(smoke_corpus, smoke_preset, "smoke",
                                           _grid(fusion=["add", "concat"], seed=[0, 1]), _options(in_tmp),
                                           trainable=faulty)
    by = {(r.fusion, r.seed): r for r in rows.itertuples()}
    assert len(rows) == 4
    assert by[("concat", 1)].status == R.STATUS_ERROR and "injected failure" in by[("concat", 1)].error
    assert by[("add", 1)].status == R.STATUS_DIVERGED and "non-finite" in by[("add", 1)].error
    assert by[("add", 0)].status == by[("concat", 0)].status == R.STATUS_OK

    agg = aggregate_rows(rows).set_index(R.FUSION)
    assert agg.loc["add", "n_failed"] == 1 and agg.loc["concat", "n_failed"] == 1
    assert agg.loc["add", "n_seeds"] == 1  # the failed seed is excluded from the mean, and counted
    assert "2 failed" in summary_table(rows) and "injected failure" in summary_table(rows)

    client, runs = _children(recorder.parent_run_id)
    assert len(runs) == 4
    failed = {r.data.tags[R.TAG_STATUS]: r for r in runs if r.info.status == "FAILED"}
    assert set(failed) == {R.STATUS_ERROR, R.STATUS_DIVERGED}
    assert "injected failure" in failed[R.STATUS_ERROR].data.tags[R.TAG_ERROR]
    assert "non-finite" in failed[R.STATUS_DIVERGED].data.tags[R.TAG_ERROR]


def test_mlflow_records_the_trial_contract_and_a_loadable_checkpoint(local_ray, in_tmp, smoke_preset, smoke_corpus):
    """Every SPEC §3 metric, per-epoch series at step = epoch, full config as params, and a checkpoint that
    loads with weights_only=True and reproduces the recorded test accuracy."""
    import mlflow

    from pefusion.fusion_sweep import load_checkpoint, run_pefusion_sweep
    from pefusion.text_data import iter_batches

    rows, recorder, _ = run_pefusion_sweep(smoke_corpus, smoke_preset, "smoke",
                                           _grid(pe_type=["learned"], fusion=["gate_cnn"], seed=[3]),
                                           _options(in_tmp))
    client, runs = _children(recorder.parent_run_id)
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.tags[R.TAG_STATUS] == R.STATUS_OK
    params = run.data.params
    assert (params[R.PE_TYPE], params[R.FUSION], params[R.SEED], params[R.DATASET]) == ("learned", "gate_cnn", "3",
                                                                                        "synthetic")
    assert params["d_model"] == str(smoke_preset.model.d_model) and params["lr"] == str(smoke_preset.train.lr)
    for name in R.FINAL_METRICS:
        assert name in run.data.metrics, name
    epochs = int(run.data.metrics[R.EPOCHS_RUN])
    for name in R.EPOCH_METRICS:
        assert [m.step for m in client.get_metric_history(run.info.run_id, name)] == list(range(1, epochs + 1))
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
    parent_files = {a.path for a in client.list_artifacts(recorder.parent_run_id, R.ARTIFACT_RESULTS_DIR)}
    assert parent_files == set()  # the CSVs are logged by the sweep script, tested below


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
    assert parent.data.tags[R.TAG_SWEEP] == "arxiv_grid" and "arxiv_grid.py" in parent.data.tags[R.TAG_COMMAND]
    assert parent.data.metrics["n_failed"] == 0
    logged = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, R.ARTIFACT_RESULTS_DIR)}
    assert logged == {"e2e_results_by_seed.csv", "e2e_results_aggregated.csv"}


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
    assert rows.loc[rows[R.STATUS] == R.STATUS_OK, R.TEST_ACC].notna().all()
    assert rows[R.EPOCHS_RUN].sum() < 6 * 4
    assert "best configuration:" in out and f"of {6 * 4} without early stopping" in out


def test_lambda_cv_sweep_records_points_curves_and_lambda_star(local_ray, in_tmp, capsys):
    from mlflow.tracking import MlflowClient

    cv = load_script("sweeps/lambda_cv.py")
    code = cv.student_main("lambda_cv", ["--smoke", "--alphas", "0.5,1.5", "--seeds", "0", "--name", "cv",
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
        cv.student_main("phase_diagram", ["--smoke", "--search-space", str(space)])
    with pytest.raises(ConfigError, match="alpha"):
        cv.student_main("phase_diagram", ["--smoke", "--alphas", "0"])
    with pytest.raises(ConfigError, match="omega"):
        cv.student_main("phase_diagram", ["--smoke", "--omegas", "1.5"])


# ---------------------------------------------------------------------------------------------------------
# The README's commands with their defaults: --preset demo's search spaces, lr_batch_asha's random search and
# FIFO scheduler, Optuna's sampler seed
# ---------------------------------------------------------------------------------------------------------


def _space_file(name: str) -> dict:
    """A search-space YAML of the repository, read here independently of pefusion.search_space."""
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
    return [m.step for m in client.get_metric_history(run.info.run_id, R.VAL_ACC)]


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
    code = script.main(argv) if sweep == "arxiv_grid" else script.student_main(sweep, argv)
    assert code == 0
    experiment = "pe-fusion" if sweep == "arxiv_grid" else "student-attention"
    _, parent, children = _sweep_runs("demo", experiment)
    assert Path(parent.data.tags[R.TAG_SEARCH_SPACE]).resolve() == (REPO / "search_spaces" / demo_file).resolve()
    assert sorted(int(c.data.params[R.SEED]) for c in children) == sorted(demo_seeds)
    assert all(c.data.tags[R.TAG_STATUS] == R.STATUS_OK for c in children)


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
            f"{n_stopped} trials stopped by ASHA, 0 failed") in out


def test_lr_batch_asha_fifo_trains_every_trial_for_max_t_epochs(local_ray, in_tmp, smoke_preset, smoke_corpus,
                                                                cache_dir, capsys):
    """`--scheduler fifo`: every trial trains --max-t epochs and none is 'stopped'. The trials are set up so
    that either early stopping would end one: a frozen learning rate keeps validation accuracy flat (the paper's
    in-trial patience would stop it), and the first trial starts with higher accuracy than the second (ASHA would
    stop the second at its first rung)."""
    from pefusion.config import split_trial_config
    from pefusion.training import Trainer

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
    client, _, children = _sweep_runs("fifo")
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
