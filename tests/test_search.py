"""Searches by name (`pefusion.sweep.search`): each rule refuses its combination before Ray starts, and the searches
the sweeps gained run for real: the λ search finds the grid CV's λ*, HyperBand lets a full-budget trial deliver its
final record, PBT restarts trials from each other's checkpoints with a mutated lr that the restored trainer runs."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import load_script
from pefusion import record as R
from pefusion.errors import ConfigError, KeyRule
from pefusion.sweep.search import Objective, SearchPlan, check
from pefusion.sweep.space import parse_search_space

# A study-free set of keys: the rules must hold for any study's names.
KEYS = {"lr": KeyRule(float, lo=0, lo_open=True), "width": KeyRule(int, lo=1), "opt": KeyRule(str, choices=("a", "b")),
        "seed": KeyRule(int, lo=0)}
PER_EPOCH = Objective(metric="score", mode="max", time_attr="step", checkpoints=True, perturbable=("lr",))
ONCE = Objective(metric="score", mode="min")
NO_METRIC = Objective(metric=None)
LR = {"loguniform": [1e-4, 1e-1]}


def space(**dims):
    return parse_search_space(dims, KEYS, "space.yaml")


@pytest.mark.parametrize("plan,objective,dims,message", [
    (SearchPlan(search="optuna"), ONCE, {"lr": LR, "seed": {"grid": [0, 1]}},
     "space.yaml: seed: grid cannot be used with Optuna .* write seed: {choice: \\[0, 1\\]}"),
    (SearchPlan(search="cmaes"), ONCE, {"lr": LR, "opt": {"choice": ["a", "b"]}},
     "space.yaml: opt: CMA-ES samples numeric ranges only .* use --search optuna"),
    (SearchPlan(search="cmaes"), ONCE, {"lr": 0.1}, "--search cmaes has no range to sample"),
    (SearchPlan(search="grid"), ONCE, {"lr": LR}, "space.yaml: lr: --search grid .* use --search random"),
    (SearchPlan(search="grid", num_samples=3), ONCE, {"seed": {"grid": [0, 1]}},
     "--num-samples 3 would repeat identical trials"),
    (SearchPlan(search="optuna"), NO_METRIC, {"lr": LR}, "--search optuna optimises a metric, and this sweep has none"),
    (SearchPlan(scheduler="asha"), ONCE, {"lr": LR}, "--scheduler asha acts between .* report once: use --scheduler fifo"),
    (SearchPlan(scheduler="hyperband"), ONCE, {"lr": LR}, "--scheduler hyperband .* use --scheduler fifo"),
    (SearchPlan(scheduler="asha", max_t=4, reduction_factor=1), PER_EPOCH, {"lr": LR}, "--reduction-factor > 1"),
    (SearchPlan(scheduler="hyperband", max_t=4), dataclasses.replace(PER_EPOCH, checkpoints=False), {"lr": LR},
     "--scheduler hyperband pauses trials .* use --scheduler asha"),
    (SearchPlan(scheduler="pbt"), dataclasses.replace(PER_EPOCH, checkpoints=False), {"lr": LR},
     "--scheduler pbt restarts trials .* does not restore"),
    (SearchPlan(scheduler="pbt", search="optuna"), PER_EPOCH, {"lr": LR}, "pbt .* use --search random"),
    (SearchPlan(scheduler="pbt"), PER_EPOCH, {"lr": LR, "width": {"randint": [1, 4]}},
     "space.yaml: width: PBT changes sampled keys mid-run.*perturbable: lr"),
    (SearchPlan(scheduler="pbt"), PER_EPOCH, {"lr": 0.1, "seed": {"grid": [0, 1]}}, "pbt has nothing to perturb"),
    (SearchPlan(num_samples=0), ONCE, {"lr": LR}, "--num-samples=0 must be >= 1"),
])
def test_each_rule_refuses_its_combination_in_one_line(plan, objective, dims, message):
    with pytest.raises(ConfigError, match=message) as info:
        check(plan, objective, space(**dims))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("plan,objective,dims", [
    (SearchPlan(search="optuna", scheduler="asha", max_t=3), PER_EPOCH, {"lr": LR, "opt": {"choice": ["a", "b"]}}),
    (SearchPlan(search="cmaes"), ONCE, {"lr": LR, "width": {"randint": [1, 4]}, "opt": "a"}),
    (SearchPlan(search="grid"), NO_METRIC, {"seed": {"grid": [0, 1]}, "opt": "b"}),
    (SearchPlan(search="random", scheduler="hyperband", max_t=2), PER_EPOCH, {"lr": LR, "seed": {"grid": [0, 1]}}),
    (SearchPlan(scheduler="pbt"), PER_EPOCH, {"lr": LR, "seed": {"grid": [0, 1]}}),
])
def test_the_combinations_the_rules_allow_pass(plan, objective, dims):
    check(plan, objective, space(**dims))


def test_sweeps_refuse_a_bad_search_before_ray_starts(in_tmp, cache_dir):
    import ray

    asha = load_script("sweeps/lr_batch_asha.py")
    base = ["--preset", "arxiv", "--synthetic", "--smoke", "--cache-dir", str(cache_dir), "--no-dashboard"]
    with pytest.raises(ConfigError, match="lr_batch.yaml: batch_size: CMA-ES samples numeric ranges only"):
        asha.main([*base, "--search", "cmaes"])
    with pytest.raises(ConfigError, match="lr_batch.yaml: lr: --search grid runs every grid value once"):
        asha.main([*base, "--search", "grid"])
    cv = load_script("sweeps/lambda_cv.py")
    with pytest.raises(ConfigError, match="alpha: --search optuna searches lambda at one point.*--alphas"):
        cv.main(["--smoke", "--search", "optuna", "--no-dashboard"])
    with pytest.raises(ConfigError, match="--num-samples 2 would repeat identical trials"):
        cv.main(["--smoke", "--num-samples", "2", "--no-dashboard"])
    assert not ray.is_initialized() and not (in_tmp / "ray_results").exists()


# ---------------------------------------------------------------------------------------------------------
# The searches, run
# ---------------------------------------------------------------------------------------------------------


def test_lambda_search_finds_the_grid_cvs_lambda_star(local_ray, in_tmp, capsys):
    """`lambda_cv.py --search optuna` at one point: λ* is the best trial's λ, in the grid CV's minimum's cell, with a
    CV error no worse than the grid's best; its CV error is the K-fold CV error at that λ."""
    from pefusion.student.config import STUDENT_PRESETS, StudentConfig, lam_grid, smoke_student
    from mlflow.tracking import MlflowClient

    from pefusion.student.cv import run_cv_point
    from pefusion.tracking.store import resolve_tracking_uri

    smoke = smoke_student(STUDENT_PRESETS["paper"])
    point = StudentConfig(**{**smoke.point, "alpha": 0.5, "init": "semantic", "seed": 0, "omega": 0.3, "sigma": 0.5})
    grid = lam_grid(smoke.cv["lam_grid_min"], smoke.cv["lam_grid_max"], 9)  # half-decades over [1e-4, 1]
    curve = run_cv_point(point, grid, smoke.cv["folds"])[R.CV_CURVE]
    errors = [c[R.CV_ERROR_MEAN] for c in curve]
    i = int(np.argmin(errors))
    assert 0 < i < len(grid) - 1  # an interior minimum: its cell is (grid[i-1], grid[i+1])

    code = load_script("sweeps/lambda_cv.py").main(
        ["--smoke", "--search", "optuna", "--alphas", "0.5", "--inits", "semantic", "--seeds", "0",
         "--num-samples", "12", "--name", "lam", "--no-dashboard", "-q"])
    assert code == 0
    rows = pd.read_csv(in_tmp / "results" / "lam_results.csv")
    assert len(rows) == 12 and set(rows[R.STATUS]) == {R.STATUS_OK} and rows[R.LAMBDA].nunique() == 12
    best = pd.read_csv(in_tmp / "results" / "lam_lambda_star.csv").iloc[0]
    lam_star = best[R.LAMBDA_STAR]
    assert lam_star == rows.loc[rows[R.CV_ERROR_MEAN].idxmin(), R.LAMBDA]
    assert grid[i - 1] < lam_star < grid[i + 1]
    assert best[R.CV_ERROR_MEAN] <= min(errors) * 1.02
    again = run_cv_point(dataclasses.replace(point, lam=lam_star), (lam_star,), smoke.cv["folds"])
    # the CSV keeps 5 significant figures of the student's errors
    assert best[R.CV_ERROR_MEAN] == pytest.approx(again[R.CV_CURVE][0][R.CV_ERROR_MEAN], rel=1e-4)
    assert best[R.EPS_G] == pytest.approx(again[R.EPS_G], rel=1e-4)
    assert f"lambda* = {lam_star:.4g}" in capsys.readouterr().out
    client = MlflowClient(resolve_tracking_uri())
    (parent,) = client.search_runs([client.get_experiment_by_name("student-attention").experiment_id],
                                   f"tags.`{R.TAG_ROLE}` = 'sweep'")
    assert parent.data.metrics[R.LAMBDA_STAR] == pytest.approx(lam_star)


def test_hyperband_lets_a_full_budget_trial_deliver_its_final_record(local_ray, in_tmp, cache_dir, capsys):
    """HyperBand, like ASHA, stops a trial whose report reaches its max_t: with one epoch of headroom a trial that
    trained --max-t epochs is tested and recorded ok, the others stopped at a rung."""
    max_t = 3
    code = load_script("sweeps/lr_batch_asha.py").main(
        ["--preset", "arxiv", "--synthetic", "--smoke", "--cache-dir", str(cache_dir), "--scheduler", "hyperband",
         "--num-samples", "4", "--max-t", str(max_t), "--reduction-factor", "2", "--name", "hb", "--no-dashboard",
         "-q"])
    assert code == 0
    rows = pd.read_csv(in_tmp / "results" / "hb_results_by_seed.csv")
    ok = rows[rows[R.STATUS] == R.STATUS_OK]
    # (the CSV's accuracies are in %)
    assert len(ok) >= 1 and (ok[R.EPOCHS_RUN] == max_t).all() and ok[R.TEST_ACC + "_pct"].notna().all()
    assert set(rows[R.STATUS]) <= {R.STATUS_OK, R.STATUS_STOPPED}
    assert re.search(r"\d+ trials? stopped by HyperBand", capsys.readouterr().out)


# Whether PBT exploits in a 4-trial, 4-epoch run depends on which trial reports first (it did in 3 of 4 full-suite
# runs on 2 cores), so this check is opt-in: `pytest -m slow tests/test_search.py`.
@pytest.mark.slow
def test_pbt_restarts_trials_from_checkpoints_with_a_mutated_lr(local_ray, in_tmp, cache_dir, tmp_path):
    """`--scheduler pbt`: every trial finishes (the checkpoints PBT clones are kept), and a trial whose lr PBT
    mutated ends with an lr it did not start with."""
    lrs = tmp_path / "lr.yaml"
    lrs.write_text(yaml.safe_dump({"lr": {"loguniform": [1e-4, 1e-2]}, "batch_size": 32}))
    code = load_script("sweeps/lr_batch_asha.py").main(
        ["--preset", "arxiv", "--synthetic", "--smoke", "--cache-dir", str(cache_dir), "--search-space", str(lrs),
         "--scheduler", "pbt", "--perturbation-interval", "1", "--num-samples", "4", "--max-t", "4",
         "--name", "pbt", "--no-dashboard", "-q"])
    assert code == 0
    rows = pd.read_csv(in_tmp / "results" / "pbt_results_by_seed.csv")
    assert len(rows) == 4 and set(rows[R.STATUS]) == {R.STATUS_OK} and (rows[R.EPOCHS_RUN] == 4).all()
    # PBT's own log: per exploited trial, [its tag, the donor's, iterations, the donor's config, its new config]
    policies = sorted((in_tmp / "ray_results" / "pbt").glob("pbt_policy_*.txt"))
    assert policies  # PBT exploited at least once
    lr = dict(zip(rows["trial_id"].astype(str), rows["lr"]))
    for policy in policies:
        *_, donor_config, new_config = json.loads(policy.read_text().splitlines()[-1])
        assert new_config["lr"] != donor_config["lr"]  # perturbed, not only copied
        assert lr[policy.stem.removeprefix("pbt_policy_")] == pytest.approx(new_config["lr"], rel=1e-9)


def test_a_restored_trainer_runs_its_own_configs_lr(smoke_preset, smoke_corpus):
    """PBT restores a trial from another's checkpoint with a mutated lr and weight decay: those, not the
    checkpoint's, drive the optimiser from then on."""
    from pefusion.fusion.config import split_trial_config
    from pefusion.fusion.training import Trainer

    def trainer(lr: float) -> Trainer:
        model_cfg, train_cfg = split_trial_config({"lr": lr, "weight_decay": lr / 10}, smoke_preset)
        return Trainer(model_cfg, train_cfg, smoke_corpus)

    donor, mutated = trainer(1e-3), trainer(2.5e-3)
    donor.train_epoch()
    mutated.load_state_dict(donor.state_dict())
    assert {(g["lr"], g["weight_decay"]) for g in mutated.optimizer.param_groups} == {(2.5e-3, 2.5e-4)}
    assert mutated.epoch == 1
