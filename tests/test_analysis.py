"""Analysis and reports from MLflow: a sqlite store built through the MLflow API with known numbers, and the
tables, figures and HTML report checked against numbers computed here (and scipy's tests on the same numbers)."""
from __future__ import annotations

import csv
import math
import os
import re
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from pefusion import record as R
from pefusion.analysis import formats as FM
from pefusion.analysis import fusion_tables as FT
from pefusion.analysis import published as PB
from pefusion.analysis import runs as RU
from pefusion.analysis import search as SE
from pefusion.analysis import student_tables as ST
from pefusion.analysis.report.page import build_report, notes
from pefusion.errors import ConfigError

from conftest import REPO, load_script

ARXIV = "ccdv/arxiv-classification"
PES, FUSIONS, SEEDS = ("sinusoidal", "learned"), ("add", "concat", "gate_scalar"), (0, 1, 2)
MISSING = ("learned", "concat", 2)  # never run: its partner seed is unpaired
FAILED = ("sinusoidal", "gate_scalar", 2)  # diverged: listed, counted, excluded
COMMAND = "python sweeps/arxiv_grid.py --preset demo --smoke"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
ALPHAS_CV, ALPHAS_PHASE, OMEGAS_PHASE = (0.4, 0.8, 1.2, 1.6), (0.5, 1.0, 1.5), (0.0, 0.3)
ALPHA_C = {0.0: 0.548, 0.3: 1.241}
ALPHA_L = {0.0: 0.722, 0.3: 1.4506}


def accuracy(pe: str, fu: str, seed: int) -> float:
    """Known test accuracies (fractions); the per-seed wobble scales with the fusion so deltas vary by seed."""
    return 0.55 + 0.04 * FUSIONS.index(fu) + 0.02 * PES.index(pe) + (0.011, -0.007, 0.019)[seed] * (
        1 + FUSIONS.index(fu)) + 0.003 * seed * PES.index(pe)


def latency(fu: str, seed: int) -> float:
    return 1.0 + 0.1 * FUSIONS.index(fu) + 0.01 * seed


def student_eps_t(init: str, alpha: float, seed: int) -> float:
    """Positional lower below α = 1, semantic lower above: Δε_t = 0.1 (α − 1) + 0.001 seed."""
    return 0.3 + (0.1 * (alpha - 1.0) + 0.001 * seed if init == "positional" else 0.0)


# ---------------------------------------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------------------------------------


def _metrics(values: dict, step: int = 0, t: int = 0):
    from mlflow.entities import Metric
    return [Metric(k, float(v), t, step) for k, v in values.items()]


def _params(values: dict):
    from mlflow.entities import Param
    return [Param(k, str(v)) for k, v in values.items()]


def _parent(client, exp_id: str, sweep: str, start: int) -> str:
    run = client.create_run(exp_id, start_time=start, tags={
        R.TAG_ROLE: "sweep", R.TAG_SWEEP: sweep, R.TAG_COMMAND: COMMAND, R.TAG_GIT_COMMIT: COMMIT,
        R.TAG_SEARCH_SPACE: f"search_spaces/{sweep}.yaml", R.TAG_RAY_ADDRESS: "local"})
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def _trial(client, exp_id: str, parent: str | None, trial_id: str, params: dict, metrics: dict, start: int,
           status: str = R.STATUS_OK, error: str = "", epochs: int = 0, tags: bool = True) -> str:
    run_tags = {R.TAG_PARENT: parent, R.TAG_ROLE: "trial", R.TAG_TRIAL_ID: trial_id, R.TAG_STATUS: status} \
        if tags else {}
    if error:
        run_tags[R.TAG_ERROR] = error
    run = client.create_run(exp_id, start_time=start, tags=run_tags)
    rid = run.info.run_id
    per_epoch = [m for e in range(1, epochs + 1) for m in _metrics(
        {R.TRAIN_LOSS: 1.0 / e, R.VAL_LOSS: 1.1 / e, R.VAL_ACC: 0.4 + 0.05 * e}, step=e)]
    client.log_batch(rid, metrics=per_epoch + _metrics(metrics, step=epochs), params=_params(params))
    client.set_terminated(rid, "FINISHED" if status == R.STATUS_OK else "FAILED")
    return rid


def _build_store(root: Path) -> dict:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    art = (root / "artifacts").as_uri()
    ids = {name: client.create_experiment(name, artifact_location=f"{art}/{name}")
           for name in ("pe-fusion", "student-attention", "broken", "empty", "other-tool", "search")}
    t0 = 1_700_000_000_000

    # pe-fusion: an older sweep with one run that a newer sweep repeats, then the sweep under test.
    old = _parent(client, ids["pe-fusion"], "arxiv_grid", t0)
    _trial(client, ids["pe-fusion"], old, "old_0", {R.DATASET: ARXIV, R.PE_TYPE: "sinusoidal", R.FUSION: "add",
                                                     R.SEED: 0}, {R.TEST_ACC: 0.1}, t0 + 1)
    parent = _parent(client, ids["pe-fusion"], "arxiv_grid", t0 + 1000)
    for i, (pe, fu, seed) in enumerate((p, f, s) for p in PES for f in FUSIONS for s in SEEDS):
        if (pe, fu, seed) == MISSING:
            continue
        params = {R.DATASET: ARXIV, R.PE_TYPE: pe, R.FUSION: fu, R.SEED: seed, "lr": 3e-4, "d_model": 32}
        if (pe, fu, seed) == FAILED:
            _trial(client, ids["pe-fusion"], parent, f"t{i}", params, {}, t0 + 1001 + i, R.STATUS_DIVERGED,
                   "non-finite training loss at epoch 2", epochs=2)
            continue
        acc = accuracy(pe, fu, seed)
        final = {R.PARAMS: 1000 + 10 * FUSIONS.index(fu), R.BEST_VAL_ACC: acc + 0.01, R.BEST_EPOCH: 3,
                 R.TEST_ACC: acc, R.TEST_MACRO_F1: acc - 0.05, R.LAT_MS_MEAN: latency(fu, seed),
                 R.LAT_MS_STD: 0.05, R.TRAIN_TIME_S: 12.0, R.EPOCHS_RUN: 3,
                 R.length_metric("le512"): acc + 0.05, R.LENGTH_COUNT_PREFIX + "le512": 60,
                 R.LENGTH_COUNT_PREFIX + "le1024": 0,  # an empty bucket: a count, no accuracy
                 R.length_metric("gt1024"): acc - 0.05, R.LENGTH_COUNT_PREFIX + "gt1024": 40}
        _trial(client, ids["pe-fusion"], parent, f"t{i}", params, final, t0 + 1001 + i, epochs=3)

    # broken: ok runs without test_acc. other-tool: untagged runs with the identity params.
    for seed in (0, 1):
        _trial(client, ids["broken"], None, f"b{seed}", {R.DATASET: "synthetic", R.PE_TYPE: "learned",
                                                          R.FUSION: "add", R.SEED: seed}, {R.VAL_ACC: 0.5}, t0)
        _trial(client, ids["other-tool"], None, "", {R.DATASET: "mine", R.PE_TYPE: "learned", R.FUSION: "add",
                                                     R.SEED: seed}, {R.TEST_ACC: 0.6 + 0.1 * seed}, t0, tags=False)

    # student: a λ-CV sweep (one init per run) and a newer phase-diagram sweep (both inits per run).
    cv = _parent(client, ids["student-attention"], "lambda_cv", t0)
    for alpha in ALPHAS_CV:
        for seed in (0, 1):
            for init in ("semantic", "positional"):
                params = {R.ALPHA: alpha, R.OMEGA: 0.3, R.SIGMA: 0.5, R.D: 100, R.SEED: seed, R.INIT: init,
                          R.LAMBDA: 0.01}
                if (alpha, seed, init) == (1.6, 1, "positional"):
                    _trial(client, ids["student-attention"], cv, "cv_fail", params, {}, t0 + 1, R.STATUS_ERROR,
                           "RuntimeError: out of memory")
                    continue
                eps_t = student_eps_t(init, alpha, seed)
                _trial(client, ids["student-attention"], cv, f"cv_{alpha}_{seed}_{init}", params, {
                    R.EPS_T: eps_t, R.EPS_G: eps_t + 0.05, R.M: 0.9 if init == "positional" else 0.1,
                    R.THETA: 0.2 if init == "positional" else 0.8, R.EPS_LIN: 0.4,
                    R.LAMBDA_STAR: 0.01 * (1 + alpha)}, t0 + 1)
    phase = _parent(client, ids["student-attention"], "phase_diagram", t0 + 1000)
    for alpha in ALPHAS_PHASE:
        for omega in OMEGAS_PHASE:
            sign = 1.0 if alpha > ALPHA_C[omega] else -1.0
            _trial(client, ids["student-attention"], phase, f"ph_{alpha}_{omega}", {
                R.ALPHA: alpha, R.OMEGA: omega, R.SIGMA: 0.5, R.D: 100, R.SEED: 0, R.LAMBDA: 0.01}, {
                "eps_t_semantic": 0.3, "eps_t_positional": 0.3 + 0.02 * sign, "eps_g_semantic": 0.35,
                "eps_g_positional": 0.35 + 0.01 * sign, "m_semantic": 0.1, "m_positional": 0.9,
                "theta_semantic": 0.8, "theta_positional": 0.2, R.EPS_LIN: 0.4}, t0 + 1001)
    # search: an lr × batch search whose stopped trial's last epoch (0.40) is below its best (0.50).
    search = _parent(client, ids["search"], "lr_batch_asha", t0)
    client.log_batch(search, metrics=_metrics({R.EPOCHS_TRAINED: 5, R.EPOCHS_FULL_BUDGET: 6}))
    for trial, status, val_acc, final in (("ok", R.STATUS_OK, (0.30, 0.45, 0.42), {R.BEST_VAL_ACC: 0.45}),
                                          ("stopped", R.STATUS_STOPPED, (0.30, 0.50, 0.40), {})):
        run = client.create_run(ids["search"], start_time=t0 + 1, tags={
            R.TAG_PARENT: search, R.TAG_ROLE: "trial", R.TAG_TRIAL_ID: trial, R.TAG_STATUS: status}).info.run_id
        epochs = [m for e, v in enumerate(val_acc, start=1) for m in _metrics({R.VAL_ACC: v}, step=e)]
        client.log_batch(run, metrics=epochs + _metrics({**final, R.EPOCHS_RUN: len(val_acc)}, step=len(val_acc)),
                         params=_params({"lr": 1e-3}))
        client.set_terminated(run, "FINISHED")
    return {"uri": uri, "parent": parent, "old": old, "cv": cv, "phase": phase, "search": search, "root": root}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return _build_store(tmp_path_factory.mktemp("mlflow"))


@pytest.fixture(scope="module")
def trials(store):
    return RU.load_trial_runs(store["uri"], "pe-fusion", store["parent"])


def _assert_png(path: Path) -> None:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
    assert float(np.var(imread(path))) > 0.0


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------


def test_loader_reads_trials_with_status_and_parsed_params(store, trials):
    assert len(trials) == 2 * 3 * 3 - 1  # the missing seed never ran; the failed one is kept
    assert trials[R.SEED].dtype == "Int64" and trials["lr"].dtype == "float64"
    bad = trials[trials[R.STATUS] != R.STATUS_OK]
    assert len(bad) == 1 and bad[R.ERROR].iloc[0] == "non-finite training loss at epoch 2"
    assert RU.study_of(trials) == "pefusion"
    everything = RU.load_trial_runs(store["uri"], "pe-fusion")  # no parent: both sweeps' trials
    assert len(everything) == len(trials) + 1
    untagged = RU.load_trial_runs(store["uri"], "other-tool")  # runs of other tools, no tags
    assert sorted(untagged[R.TEST_ACC]) == [0.6, 0.7]


def test_latest_sweep_and_run_prefix(store):
    sweep = RU.load_sweep(store["uri"], "pe-fusion", latest_sweep=True)
    assert sweep.parent_run_id == store["parent"] and sweep.name == "arxiv_grid"
    assert sweep.parent_tags[R.TAG_COMMAND] == COMMAND
    assert RU.load_sweep(store["uri"], "pe-fusion", store["old"][:10]).parent_run_id == store["old"]


def test_loader_errors_are_one_line(store, tmp_path):
    cases = [(dict(tracking_uri=f"sqlite:///{tmp_path / 'nothing.db'}", experiment="pe-fusion"), "no MLflow store"),
             (dict(tracking_uri=store["uri"], experiment="nope"), "no experiment named 'nope'"),
             (dict(tracking_uri=store["uri"], experiment="empty"), "has no finished trial runs; run python sweeps")]
    for kwargs, text in cases:
        with pytest.raises(RU.AnalysisError, match=text) as info:
            RU.load_trial_runs(**kwargs)
        assert "\n" not in str(info.value)
    assert not (tmp_path / "nothing.db").exists()  # never creates a store by looking
    with pytest.raises(ConfigError, match="unreachable"):  # a closed local port: refused at once
        RU.load_trial_runs("http://127.0.0.1:9", "pe-fusion")


def test_search_sweep_ranks_trials_and_stopped_is_not_failed(tmp_path):
    trials = pd.DataFrame({
        RU.TRIAL_ID: ["a", "b", "c"], RU.RUN_ID: ["r1", "r2", "r3"], "lr": [1e-3, 1e-4, 3e-4],
        "batch_size": [32, 32, 32], R.STATUS: [R.STATUS_OK, R.STATUS_STOPPED, R.STATUS_ERROR],
        R.ERROR: ["", "", "boom"], R.BEST_VAL_ACC: [0.6, 0.671, np.nan], R.TEST_ACC: [0.5, np.nan, np.nan]})
    table = SE.search_table(trials)
    assert list(table[RU.TRIAL_ID]) == ["b", "a", "c"] and "batch_size" not in table  # only what varies
    assert table[R.BEST_VAL_ACC].iloc[0] == pytest.approx(0.671)
    assert list(RU.failed(trials)[RU.TRIAL_ID]) == ["c"]
    sweep = RU.Sweep("sqlite:///unused.db", "pe-fusion", trials.assign(**{RU.START_TIME: 0}), "f" * 32,
                     {R.TAG_SWEEP: "lr_batch_asha", R.TAG_COMMAND: "python sweeps/lr_batch_asha.py"})
    page, written = build_report(sweep, tmp_path, log_to_mlflow=False)
    text = page.read_text()
    assert page.name == "report_lr_batch_asha_ffffffff.html" and "Search trials" in text and "boom" in text
    assert "1 ok, 1 stopped early by the scheduler, 1 failed" in text
    assert written == [tmp_path / "search_trials.csv", tmp_path / "figures" / "search_scores.png",
                       tmp_path / "figures" / "search_parallel_coordinates.png"]
    # Percentages as a reader types them: 0.671 x 100 is 67.10000000000001 in floating point.
    with open(tmp_path / "search_trials.csv", newline="") as f:
        assert next(csv.DictReader(f))[R.BEST_VAL_ACC + "_pct"] == "67.1"
    assert "no parameter importances: only lr varies among the 2 scored trials" in text
    assert "No epoch budget" in text  # neither a max_epochs param nor a parent run's budget


def test_stopped_trials_score_their_best_epoch_and_the_parent_budget_is_read(store):
    sweep = RU.load_sweep(store["uri"], "search", latest_sweep=True)
    best = dict(zip(sweep.trials[RU.TRIAL_ID], sweep.trials[R.BEST_VAL_ACC]))
    assert best == {"ok": pytest.approx(0.45), "stopped": pytest.approx(0.50)}  # not the stopped one's last 0.40
    assert sweep.parent_metrics == {R.EPOCHS_TRAINED: 5.0, R.EPOCHS_FULL_BUDGET: 6.0}


# ---------------------------------------------------------------------------------------------------------
# Table 1 and paired deltas: exact numbers
# ---------------------------------------------------------------------------------------------------------


def _ok_seeds(pe: str, fu: str) -> list[int]:
    return [s for s in SEEDS if (pe, fu, s) not in (MISSING, FAILED)]


def test_table1_exact(trials):
    table = FT.table1(trials).set_index(["pe_type", "fusion"])
    assert list(table.index) == [(p, f) for p in PES for f in FUSIONS]
    for pe in PES:
        for fu in FUSIONS:
            seeds = _ok_seeds(pe, fu)
            acc = np.array([accuracy(pe, fu, s) * 100 for s in seeds])
            lat = np.array([latency(fu, s) for s in seeds])
            row = table.loc[(pe, fu)]
            assert row.n_seeds == len(seeds)
            assert row.test_acc_mean == pytest.approx(acc.mean(), rel=1e-12)
            assert row.test_acc_std == pytest.approx(acc.std(ddof=1), rel=1e-9)
            assert row.params_mean == 1000 + 10 * FUSIONS.index(fu)
            assert row.lat_ms_mean == pytest.approx(lat.mean(), rel=1e-12)
            assert row.lat_ms_std == pytest.approx(lat.std(ddof=1), rel=1e-9)
            assert row.n_failed == (1 if (pe, fu) == FAILED[:2] else 0)
            assert (row.published_mean, row.published_std) == PB.TABLE3_ARXIV.cells[(pe, fu)]


def test_table1_published_only_for_arxiv_and_renderings(trials):
    other = FT.table1(trials.assign(**{R.DATASET: "synthetic"}).drop(columns=[R.PRESET], errors="ignore"))
    assert "published_mean" not in other and list(other.columns) == list(FT.TABLE1_COLUMNS)
    display = FT.table1_display(FT.table1(trials), digits=2)  # as the .md and .tex files print it
    markdown, latex = FM.to_markdown(display), FM.to_latex(display, "Table 1")
    assert "| sinusoidal | add | 3 |" in markdown and "59.22 ± 1.07" in markdown  # the paper beside ours, in %
    mean = np.mean([accuracy("sinusoidal", "add", s) * 100 for s in SEEDS])
    assert f"{mean:.2f} ± " in markdown
    assert r"59.22 $\pm$ 1.07" in latex and r"gate\_scalar" in latex and r"\toprule" in latex


def test_superseded_runs_are_left_out_and_noted(store, trials):
    sweep = RU.load_sweep(store["uri"], "pe-fusion")  # both sweeps: the old run repeats (sinusoidal, add, 0)
    pd.testing.assert_frame_equal(FT.table1(sweep.trials), FT.table1(trials))
    remarks = notes(sweep)
    assert any("1 of 18 trial runs failed" in r for r in remarks)
    assert any(r.startswith("1 older ok results") for r in remarks)


def test_paired_deltas_exact_against_scipy(trials):
    summary, per_seed = FT.paired_deltas(trials, baseline="add")
    summary = summary.set_index(["pe_type", "fusion"])
    assert list(summary.index) == [(p, f) for p in PES for f in FUSIONS if f != "add"]
    for pe in PES:
        for fu in ("concat", "gate_scalar"):
            seeds = _ok_seeds(pe, fu)  # add has every seed, so the pairs are the fusion's ok seeds
            a = np.array([accuracy(pe, fu, s) * 100 for s in seeds])
            b = np.array([accuracy(pe, "add", s) * 100 for s in seeds])
            d = a - b
            row = summary.loc[(pe, fu)]
            assert row.n_pairs == len(seeds) and row.n_unpaired == 3 - len(seeds)
            assert row.delta_mean == pytest.approx(d.mean(), rel=1e-9)
            assert row.delta_std == pytest.approx(d.std(ddof=1), rel=1e-9)
            half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
            assert (row.ci95_low, row.ci95_high) == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-9)
            assert row.t_pvalue == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-9)
            assert row.wilcoxon_pvalue == pytest.approx(stats.wilcoxon(a, b).pvalue, rel=1e-9)
            pairs = per_seed[(per_seed.pe_type == pe) & (per_seed.fusion == fu)]
            assert list(pairs.seed) == seeds and pairs.delta_pp.to_numpy() == pytest.approx(d, rel=1e-9)
    with pytest.raises(RU.AnalysisError, match="baseline fusion 'ad' has no runs; fusions present: add, concat"):
        FT.paired_deltas(trials, baseline="ad")


@pytest.mark.parametrize("a,b", [([61.0, 63.5, 60.2], [59.9, 61.0, 60.4]),
                                 ([80.1, 79.4, 81.0, 80.6, 79.9], [80.3, 80.0, 80.2, 79.5, 80.8])])
def test_paired_stats_against_scipys_paired_tests(a, b):
    """Mean, SD, the 95 % interval and both p-values as scipy's ttest_rel and wilcoxon give them."""
    d = np.subtract(a, b)
    got = FT.paired_stats(a, b)
    paired = stats.ttest_rel(a, b)
    assert got["n_pairs"] == len(a) and got["note"] == ""
    assert (got["delta_mean"], got["delta_std"]) == (pytest.approx(d.mean(), rel=1e-12),
                                                      pytest.approx(d.std(ddof=1), rel=1e-12))
    assert (got["ci95_low"], got["ci95_high"]) == pytest.approx(tuple(paired.confidence_interval(0.95)), rel=1e-9)
    assert got["t_pvalue"] == pytest.approx(paired.pvalue, rel=1e-9)
    assert got["wilcoxon_pvalue"] == pytest.approx(stats.wilcoxon(a, b).pvalue, rel=1e-9)
    assert got["wilcoxon_min_p"] == 2.0 ** (1 - len(a))


def test_paired_stats_undefined_cases():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no mean of an empty array, no test on too few pairs
        none, one = FT.paired_stats([], []), FT.paired_stats([0.7], [0.6])
    nan = math.nan
    assert none == pytest.approx({"n_pairs": 0, "delta_mean": nan, "delta_std": nan, "ci95_low": nan,
                                  "ci95_high": nan, "t_pvalue": nan, "wilcoxon_pvalue": nan, "wilcoxon_min_p": nan,
                                  "note": "no seed on both sides"}, nan_ok=True)
    assert one == pytest.approx({"n_pairs": 1, "delta_mean": 0.1, "delta_std": nan, "ci95_low": nan,
                                 "ci95_high": nan, "t_pvalue": nan, "wilcoxon_pvalue": nan, "wilcoxon_min_p": 1.0,
                                 "note": "one pair: no spread, no test"}, nan_ok=True)
    zero = FT.paired_stats([0.5, 0.6, 0.7], [0.5, 0.6, 0.7])
    assert zero["delta_mean"] == 0 and math.isnan(zero["wilcoxon_pvalue"])
    assert zero["note"] == "all differences equal: tests undefined"
    # equal differences of 1000 points whose float rounding leaves a spread of ~1e-13: still equal
    a, b = np.array([1100.7, 1200.3, 1300.9, 1003.3]), np.array([100.6, 200.2, 300.8, 3.2])
    rounded = FT.paired_stats(a, b)
    assert 1e-13 < np.ptp(a - b) < 1e-12 and rounded["note"] == "all differences equal: tests undefined"
    # differences spread by less than 1 point are a test's business
    two = FT.paired_stats([0.3, 0.1], [0.0, 0.0])  # two pairs: an interval and both tests
    assert two["note"] == "" and two["t_pvalue"] == pytest.approx(stats.ttest_1samp([0.3, 0.1], 0).pvalue)
    assert (two["ci95_low"], two["ci95_high"]) == pytest.approx(tuple(stats.ttest_1samp([0.3, 0.1], 0)
                                                                      .confidence_interval(0.95)))
    small = FT.paired_stats([0.1, 0.3, 0.2], [0.0, 0.0, 0.0])
    assert small["note"] == "" and small["t_pvalue"] == pytest.approx(stats.ttest_1samp([0.1, 0.3, 0.2], 0).pvalue)


def test_wilcoxon_min_p_of_no_pair_and_one():
    assert math.isnan(FT.wilcoxon_min_p(0)) and FT.wilcoxon_min_p(1) == 1.0 and FT.wilcoxon_min_p(2) == 0.5


def test_length_buckets_and_fusion_summary(trials):
    buckets = FT.length_bucket_summary(trials)
    assert list(dict.fromkeys(buckets.bucket)) == ["le512", "le1024", "gt1024"]
    row = buckets[(buckets.pe_type == "learned") & (buckets.fusion == "add") & (buckets.bucket == "gt1024")].iloc[0]
    expected = np.array([(accuracy("learned", "add", s) - 0.05) * 100 for s in SEEDS])
    assert row.test_acc_mean == pytest.approx(expected.mean()) and row.n_docs_mean == 40
    empty = buckets[buckets.bucket == "le1024"]
    assert (empty.n_seeds == 0).all() and empty.test_acc_mean.isna().all() and (empty.n_docs_mean == 0).all()
    fusions = FT.fusion_summary(trials).set_index("fusion")
    pooled = [accuracy(p, "concat", s) * 100 for p in PES for s in _ok_seeds(p, "concat")]
    assert fusions.loc["concat", "n_runs"] == 5
    assert fusions.loc["concat", "test_acc_mean"] == pytest.approx(np.mean(pooled))


# ---------------------------------------------------------------------------------------------------------
# Student runs
# ---------------------------------------------------------------------------------------------------------


def test_student_frame_and_deltas(store):
    trials = RU.load_trial_runs(store["uri"], "student-attention")
    student = ST.student_frame(trials)
    n_cv, n_phase = len(ALPHAS_CV) * 2 * 2, len(ALPHAS_PHASE) * len(OMEGAS_PHASE) * 2
    assert len(student) == n_cv + n_phase
    assert set(student.columns) >= {R.ALPHA, R.OMEGA, R.SIGMA, R.SEED, R.D, R.INIT, R.EPS_G, R.EPS_T, R.M,
                                    R.THETA, R.EPS_LIN, R.LAMBDA_STAR}
    deltas = ST.student_deltas(student)
    cv = deltas[deltas.source == ST.SOURCE_CV]
    assert len(cv) == len(ALPHAS_CV) * 2 - 1  # the failed positional run leaves its seed unpaired
    for row in cv.itertuples():
        assert row.delta_eps_t == pytest.approx(0.1 * (row.alpha - 1.0) + 0.001 * row.seed, abs=1e-12)
    summary = ST.student_delta_summary(deltas)
    cv_summary = summary[summary.source == ST.SOURCE_CV].set_index(R.ALPHA)
    assert cv_summary.loc[1.6, "n_pairs"] == 1 and cv_summary.loc[0.8, "lower_train_loss"] == "positional"
    assert cv_summary.loc[1.2, "lower_train_loss"] == "semantic"
    crossing = ST.crossing_alphas(deltas, ALPHA_C)
    row = crossing[crossing.source == ST.SOURCE_CV].iloc[0]
    # mean Δε_t: 0.1 (α − 1) + 0.0005 at α = 0.8 and 1.2 → crossing at 0.8 + 0.4 · 0.0195 / 0.04
    assert row.alpha_c_estimate == pytest.approx(0.8 + 0.4 * 0.0195 / 0.04) and row.alpha_c_published == 1.241
    phase = summary[summary.source == ST.SOURCE_PHASE]
    assert len(phase) == len(ALPHAS_PHASE) * len(OMEGAS_PHASE)
    for row in phase.itertuples():
        assert row.lower_train_loss == ("semantic" if row.alpha > ALPHA_C[row.omega] else "positional")
    # each fit named by where it ended (θ > m: semantic): the positional phase fits (m 0.9, θ 0.2) stayed
    ok = student[student[R.STATUS] == R.STATUS_OK]
    assert (ok[R.REACHED] == ok[R.INIT]).all() and (student.loc[student[R.M].isna(), R.REACHED] == "unknown").all()
    lam = ST.student_summary(student)
    lam = lam[(lam.source == ST.SOURCE_CV) & (lam[R.INIT] == "semantic")].set_index(R.ALPHA)
    assert lam.loc[0.4, "lam_star_mean"] == pytest.approx(0.014) and lam.loc[0.4, "n_seeds"] == 2


# ---------------------------------------------------------------------------------------------------------
# Scripts and the report
# ---------------------------------------------------------------------------------------------------------


def test_table1_and_paired_delta_scripts(store, tmp_path, capsys):
    argv = ["--tracking-uri", store["uri"], "--parent-run", store["parent"], "--out", str(tmp_path)]
    assert load_script("scripts/make_table1.py").main(argv) == 0
    csv = pd.read_csv(tmp_path / "summary_ccdv-arxiv-classification.csv")
    assert list(csv.columns[:8]) == ["pe_type", "fusion", "n_seeds", "test_acc_mean_pct", "test_acc_std_pct",
                                     "params_mean", "lat_ms_mean", "lat_ms_std"]
    assert "59.22 ± 1.07" in (tmp_path / "summary_ccdv-arxiv-classification.md").read_text()
    assert (tmp_path / "summary_ccdv-arxiv-classification.tex").exists()
    assert load_script("scripts/paired_deltas.py").main(argv) == 0
    deltas = pd.read_csv(tmp_path / "paired_deltas_ccdv-arxiv-classification.csv")
    assert list(deltas.columns[:11]) == ["pe_type", "fusion", "baseline", "n_pairs", "delta_mean_pp",
                                         "delta_std_pp", "ci95_low_pp", "ci95_high_pp", "t_pvalue", "wilcoxon_pvalue",
                                         "wilcoxon_min_p"]
    for pe in PES:
        _assert_png(tmp_path / "figures" / f"paired_deltas_ccdv-arxiv-classification_{pe}.png")
    assert "wrote" in capsys.readouterr().out


def _best_seed(pe: str, fu: str) -> int:
    """The seed of the cell's best run as the store's numbers make it (best_val_acc = test accuracy + 0.01)."""
    return max((s for s in SEEDS if (pe, fu, s) not in (MISSING, FAILED)), key=lambda s: accuracy(pe, fu, s))


def test_best_run_per_cell_is_chosen_on_validation_never_on_test():
    """Per cell the ok run with the highest best_val_acc, even where another seed tested higher; a tie goes to the
    lower seed; a failed run never counts, and a cell with no ok run has no best run."""
    rows = [("a", 0, R.STATUS_OK, 0.70, 0.90), ("a", 1, R.STATUS_OK, 0.80, 0.60), ("a", 2, R.STATUS_DIVERGED, 0.95, 0.1),
            ("b", 1, R.STATUS_OK, 0.50, 0.40), ("b", 0, R.STATUS_OK, 0.50, 0.45), ("c", 0, R.STATUS_ERROR, 0.9, 0.9)]
    frame = pd.DataFrame([{RU.RUN_ID: f"{fu}{seed}", RU.START_TIME: i, R.STATUS: status, R.DATASET: "d",
                           R.PE_TYPE: "learned", R.FUSION: fu, R.SEED: seed, R.BEST_VAL_ACC: val, R.TEST_ACC: test}
                          for i, (fu, seed, status, val, test) in enumerate(rows)])
    best = FT.best_runs(frame)
    assert list(zip(best[R.FUSION], best[R.SEED], best[RU.RUN_ID])) == [("a", 1, "a1"), ("b", 0, "b0")]


def test_report_pefusion_sweep_logged_to_parent(store, trials, tmp_path):
    from mlflow.tracking import MlflowClient

    argv = ["--tracking-uri", store["uri"], "--out", str(tmp_path)]  # defaults to the latest sweep
    assert load_script("scripts/report.py").main(argv) == 0
    page = tmp_path / f"report_arxiv_grid_{store['parent'][:8]}.html"
    text = page.read_text()
    assert COMMAND in text and COMMIT in text
    assert "non-finite training loss at epoch 2" in text and "diverged" in text
    assert text.count("data:image/png;base64,") == 2 + 2 + 1  # deltas per PE, accuracy, latency, length
    assert "59.22 ± 1.07" in text
    run_of = {(r.pe_type, r.fusion, r.seed): r.run_id for r in trials.itertuples()}
    for pe in PES:
        for fu in FUSIONS:  # each cell's best run with the command that makes its model
            assert f"pefusion-export --run {run_of[(pe, fu, _best_seed(pe, fu))]} --tracking-uri {store['uri']}" in text
    for stem in ("accuracy_per_fusion", "latency_per_fusion", "accuracy_per_length"):
        _assert_png(tmp_path / "figures" / f"{stem}_ccdv-arxiv-classification.png")
    client = MlflowClient(tracking_uri=store["uri"])
    logged = {a.path for a in client.list_artifacts(store["parent"], "results")}
    assert f"results/{page.name}" in logged and "results/summary_ccdv-arxiv-classification.csv" in logged
    figures = {a.path for a in client.list_artifacts(store["parent"], "results/figures")}
    assert "results/figures/accuracy_per_fusion_ccdv-arxiv-classification.pdf" in figures


def test_report_student_sweep(store, tmp_path, capsys, monkeypatch):
    """The report's plumbing of the d → ∞ theory (said as it starts, cached, beside every point, in the figures)
    with a coarse solver: its numbers are test_student_theory's, at the default solver's minutes."""
    import functools

    import pefusion.analysis.report.page
    from pefusion.student.theory import Solver

    monkeypatch.setattr(pefusion.analysis.report.page, "build_report",
                        functools.partial(pefusion.analysis.report.page.build_report, theory=Solver(nodes=5)))
    assert RU.load_sweep(store["uri"], "student-attention", latest_sweep=True).name == "phase_diagram"
    argv = ["--tracking-uri", store["uri"], "--experiment", "student-attention", "--parent-run", store["cv"],
            "--out", str(tmp_path), "--no-log"]
    assert load_script("scripts/report.py").main(argv) == 0
    # the theory takes minutes the first time: said as it starts, and how long it took
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("report: solving the d → ∞ theory at every point (minutes; cached in "), lines
    assert re.fullmatch(r"report: the d → ∞ theory ready in \d+ s", lines[1]), lines
    assert load_script("scripts/report.py").main(argv) == 0
    assert capsys.readouterr().out.startswith(f"report: the d → ∞ theory from {tmp_path / 'student_theory_points.csv'}")
    text = (tmp_path / f"report_lambda_cv_{store['cv'][:8]}.html").read_text()
    assert "RuntimeError: out of memory" in text and COMMAND in text
    assert text.count("data:image/png;base64,") == 4
    for stem in ("student_deltas", "student_phase_diagram", "student_order_parameters", "student_lambda_star"):
        _assert_png(tmp_path / "figures" / f"{stem}.png")
    crossing = pd.read_csv(tmp_path / "student_alpha_c.csv")
    assert crossing.alpha_c_estimate.iloc[0] == pytest.approx(0.8 + 0.4 * 0.0195 / 0.04)


def test_user_errors_exit_2_with_one_line(store, tmp_path):
    """Run as a user would, in subprocesses (both at once: each spends most of its time importing)."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": store["uri"]}
    commands = {"missing metric": ["make_table1.py", "--experiment", "broken"],
                "empty experiment": ["report.py", "--experiment", "empty"]}
    procs = {case: subprocess.Popen([sys.executable, str(REPO / "scripts" / args[0]), *args[1:], "--out",
                                     str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=env, cwd=tmp_path) for case, args in commands.items()}
    done = {case: (proc.wait(timeout=120), proc.communicate()[1]) for case, proc in procs.items()}
    code, stderr = done["missing metric"]
    assert code == 2 and stderr.count("\n") == 1
    assert stderr.startswith("error: metric 'test_acc' is missing from 2 of 2 ok trial runs (e.g. run ")
    code, stderr = done["empty experiment"]
    assert code == 2 and stderr == ("error: experiment 'empty' has no finished trial runs; run python "
                                    "sweeps/arxiv_grid.py --preset demo first (or python sweeps/lambda_cv.py "
                                    "--preset demo for the student study)\n")


def test_analysis_csvs_read_back_rounded_with_units(trials, tmp_path):
    """Every CSV the PE-fusion analysis writes, read back as text: accuracies in % under `_pct` headers and
    deltas in points under `_pp`, 2 decimals at most, counts as integers; values against a computation here."""
    from pefusion.analysis.outputs import write_paired_deltas, write_pefusion_summaries, write_table1

    paths = write_table1(trials, tmp_path) + write_paired_deltas(trials, tmp_path, figures=False)
    paths += write_pefusion_summaries(trials, tmp_path)
    csvs = [p for p in paths if p.suffix == ".csv"]
    assert len(csvs) == 5
    for path in csvs:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        for name in rows[0]:
            if "acc" in name or name.startswith(("delta", "ci95", "published")):
                assert name.endswith(("_pct", "_pp")), (path.name, name)
                cells = [r[name] for r in rows if r[name]]
                assert all(len(c.partition(".")[2]) <= 2 for c in cells), (path.name, name, cells)
            if name.startswith("n_") and name != "n_docs_mean":
                assert all("." not in r[name] for r in rows), (path.name, name)
    table = pd.read_csv(tmp_path / "summary_ccdv-arxiv-classification.csv").set_index(["pe_type", "fusion"])
    acc = [accuracy("learned", "gate_scalar", s) * 100 for s in SEEDS]
    assert table.loc[("learned", "gate_scalar"), "test_acc_mean_pct"] == round(float(np.mean(acc)), 2)
    assert table.loc[("learned", "gate_scalar"), "test_acc_std_pct"] == round(float(np.std(acc, ddof=1)), 2)
    per_seed = pd.read_csv(tmp_path / "paired_deltas_per_seed_ccdv-arxiv-classification.csv")
    first = per_seed.iloc[0]
    assert first.delta_pp == round((accuracy(first.pe_type, first.fusion, first.seed)
                                    - accuracy(first.pe_type, "add", first.seed)) * 100, 2)


def test_wilcoxon_min_p_and_the_report_says_three_pairs_cannot_reach_005(store, tmp_path):
    for n in (3, 5, 6):  # every difference of one sign: the smallest p the exact test gives
        assert FT.wilcoxon_min_p(n) == pytest.approx(stats.wilcoxon(np.arange(1, n + 1), np.zeros(n)).pvalue)
    shown, note = FT.paired_display(FT.paired_deltas(FT.latest_ok_pefusion(RU.load_trial_runs(
        store["uri"], "pe-fusion", store["parent"])))[0])
    assert "cannot give a p-value below 0.25" in note
    assert set(shown["Wilcoxon signed-rank p"]) >= {"not informative: ≥ 0.25 with 3 pairs"}
    assert list(shown.columns[:5]) == ["PE", "fusion", "baseline", "seed pairs", "Δ accuracy (points), mean ± SD"]


def test_length_bucket_table_in_table1_order_with_token_ranges(trials):
    shown = FT.length_bucket_display(FT.length_bucket_summary(trials))
    table = FT.table1(trials)
    assert list(zip(shown.PE, shown.fusion)) == list(zip(table.pe_type, table.fusion))
    assert list(shown.columns) == ["PE", "fusion", "≤ 512 tokens, test accuracy (%)",
                                   "513–1024 tokens, test accuracy (%)", "> 1024 tokens, test accuracy (%)"]


def _gaps(per_seed: dict[float, list[float]], omega: float = 0.2) -> pd.DataFrame:
    """A student_deltas frame of made-up per-seed Δε_t: {α: [seed 0's gap, seed 1's, ...]}."""
    return pd.DataFrame([{"source": ST.SOURCE_PHASE, R.ALPHA: a, R.OMEGA: omega, R.SIGMA: 0.5, R.D: 1000.0,
                          ST.LAM_FIXED: 0.01, R.SEED: s, "delta_eps_t": g, "delta_eps_g": 0.0}
                         for a, gaps in per_seed.items() for s, g in enumerate(gaps)])


def test_points_called_from_their_seeds_by_a_t_test_and_every_crossing_listed():
    per_seed = {0.8: [-4.0, -3.0, -2.0], 1.0: [-2.0, 0.5, 3.0], 1.2: [1.5, 2.0, 2.5], 1.4: [-5.0, -6.0, -7.0],
                1.6: [2.0, 2.0, 2.0 + 1e-6]}
    summary = ST.student_delta_summary(_gaps(per_seed)).set_index(R.ALPHA)
    assert summary["delta_eps_t_se"].to_dict() == pytest.approx(
        {a: statistics.stdev(g) / len(g) ** 0.5 for a, g in per_seed.items()}, rel=1e-6)
    # each point's call is scipy's one-sample t-test of its three gaps at 5 %, two-sided, with the mean's sign
    expected = {a: "undecided" if stats.ttest_1samp(g, 0).pvalue >= 0.05 else
                "semantic" if np.mean(g) > 0 else "positional" for a, g in per_seed.items()}
    assert expected == {0.8: "positional", 1.0: "undecided", 1.2: "semantic", 1.4: "positional",
                        1.6: "semantic"}
    assert summary[ST.CALL].to_dict() == expected
    # 2 SE is not a 5 % test with 3 seeds: mean 2, SE 0.58 is 3.5 SE from 0 but under t_2 = 4.30 SE; one seed is
    # never decided
    edge = ST.student_delta_summary(_gaps({1.0: [1.0, 2.0, 3.0], 1.5: [1.0, 2.0, 3.0, 2.0, 1.5], 2.0: [5.0]}))
    edge = edge.set_index(R.ALPHA)[ST.CALL].to_dict()
    assert edge == {1.0: "undecided", 1.5: "semantic", 2.0: "undecided"}
    # two seeds can decide a point (t_1 = 12.7 SE); one cannot, whatever its SE says
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        two = ST.call_points([10.0, -10.0, 10.0, 1.0], [0.1, 0.1, 0.1, 0.1], [2, 2, 1, 2])
    assert list(two) == ["semantic", "positional", "undecided", "undecided"]
    assert list(ST.call_points([0.5, -0.5], [0.01, 0.01], [4, 4])) == ["semantic", "positional"]
    row = ST.crossing_alphas(_gaps(per_seed), {0.2: 0.928}).iloc[0]
    # the means -3, 0.5, 2, -6, 2: − → + at 0.8 + 0.2·3/3.5, + → − at 1.2 + 0.2·2/8, − → + at 1.4 + 0.2·6/8
    first, second, third = 0.8 + 0.2 * 3 / 3.5, 1.2 + 0.2 * 2 / 8, 1.4 + 0.2 * 6 / 8
    assert row.sign_changes == f"{first:.3f}(−+);{second:.3f}(+−);{third:.3f}(−+)" and row.n_sign_changes == 3
    assert row.alpha_c_estimate == pytest.approx(first) and row.alpha_c_published == 0.928
    assert row.n_call_changes == 3  # positional, [undecided], semantic, positional, semantic


def _t_bounds(gaps: dict[float, list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """α and each point's 95 % t-interval of its seed mean, from scipy."""
    alpha = np.array(sorted(gaps))
    ends = np.array([stats.t.interval(0.95, len(gaps[a]) - 1, loc=np.mean(gaps[a]), scale=stats.sem(gaps[a]))
                     for a in alpha])
    return alpha, ends[:, 0], ends[:, 1]


def _zero(x0: float, x1: float, y0: float, y1: float) -> float:
    return x0 + (x1 - x0) * y0 / (y0 - y1)


def test_alpha_c_interval_inverts_each_points_t_test_with_the_interpolation_error_inside():
    """The last point whose 95 % t-interval lies below 0 and the first above it after it bracket α_c; the ends
    are where the intervals' upper / lower ends cross 0, on the line and on the parabolas through a neighbour,
    the outermost."""
    gaps = {0.5: [-3.0, -2.5, -3.5], 0.75: [-1.5, -1.0, -2.0], 1.0: [-0.6, 0.4, 0.1], 1.25: [0.9, 1.2, 1.0],
            1.5: [2.5, 3.0, 3.3]}
    alpha, lower, upper = _t_bounds(gaps)
    assert list(upper < 0) == [True, True, False, False, False] and list(lower > 0) == [False] * 3 + [True] * 2
    lows = [_zero(0.75, 1.0, upper[1], upper[2])]  # upper end's zeros between 0.75 and 1.0
    highs = [_zero(1.0, 1.25, lower[2], lower[3])]
    for first, ends, out, lo in ((0, upper, lows, 0.75), (1, upper, lows, 0.75), (1, lower, highs, 1.0),
                                 (2, lower, highs, 1.0)):
        parabola = np.polynomial.Polynomial.fit(alpha[first:first + 3], ends[first:first + 3], 2)
        out += [r.real for r in parabola.roots() if abs(r.imag) < 1e-9 and lo <= r.real <= lo + 0.25]
    per_seed = np.array([gaps[a] for a in alpha]).T  # (S, A)
    low, high, why = ST.alpha_c_interval(per_seed, alpha)
    assert (low, high) == (pytest.approx(min(lows), abs=1e-9), pytest.approx(max(highs), abs=1e-9))
    assert min(lows) < lows[0] and max(highs) > highs[0] and why == ""  # the parabolas widened both ends
    # at 80 % the ends move in: a 50 % or 80 % interval is not a 95 % one
    narrower = ST.alpha_c_interval(per_seed, alpha, level=0.8)
    assert low < narrower.low and narrower.high < high
    # the same through the report's table, with the column saying both sides are closed
    row = ST.crossing_alphas(_gaps(gaps)).iloc[0]
    assert (row.alpha_c_low, row.alpha_c_high, row.alpha_c_open) == (low, high, "")


def test_alpha_c_interval_is_open_where_the_crossing_may_lie_beyond_the_grid_and_nan_only_without_seeds():
    alpha = np.array([0.5, 0.75, 1.0])
    rising = np.array([[-2.0, -0.5, 1.0], [-2.5, 0.3, 1.2], [-1.5, -0.2, 0.9]])  # (S, A)
    closed = ST.alpha_c_interval(rising, alpha)
    assert np.isfinite([closed.low, closed.high]).all() and 0.5 < closed.low < closed.high <= 1.0
    # every point confidently positive: α_c lies below the grid, at most its first α
    below = ST.alpha_c_interval(rising + 5, alpha)
    assert below.low == -math.inf and below.high == 0.5 and below.why.startswith("open below")
    # every point confidently negative: above the grid, at least its last α
    above = ST.alpha_c_interval(rising - 5, alpha)
    assert above.low == 1.0 and above.high == math.inf and above.why.startswith("open above")
    # a first point still negative but not confidently: open below, closed above
    loose = rising.copy()
    loose[:, 0] = [-3.0, 1.0, -1.0]
    half_open = ST.alpha_c_interval(loose, alpha)
    assert half_open.low == -math.inf and half_open.high == closed.high
    # one seed, or a single α with two seeds: no interval at all
    assert all(math.isnan(x) for x in ST.alpha_c_interval(rising[:1], alpha)[:2])
    sparse = rising.copy()
    sparse[1:, 1:] = np.nan
    assert all(math.isnan(x) for x in ST.alpha_c_interval(sparse, alpha)[:2])


def test_sign_changes_count_a_zero_with_the_side_it_joins_and_alpha_c_of_is_nan_without_a_rise():
    alpha = np.array([1.0, 2.0, 3.0])
    assert ST.sign_changes(alpha, np.array([0.0, 1.0, 2.0])) == []  # starts at 0 and rises: no change
    assert ST.sign_changes(alpha, np.array([2.0, 1.0, 0.0])) == []  # falls to 0: 0 joins the + side
    assert ST.sign_changes(alpha, np.array([-1.0, 0.0, 1.0])) == [(2.0, "-+")]  # 0 joins the + side
    assert ST.sign_changes(alpha, np.array([0.0, -1.0, -2.0])) == [(1.0, "+-")]
    assert ST.sign_changes(alpha, np.array([0.5, -1.5, -2.0])) == [(1.25, "+-")]
    assert ST.sign_changes(alpha, np.array([-2.0, 1.0, -1.0])) == [(pytest.approx(5 / 3), "-+"), (2.5, "+-")]
    assert ST.sign_changes(alpha, np.array([-1.0, np.nan, 1.0])) == [(2.0, "-+")]  # NaN points skipped
    assert math.isnan(ST.alpha_c_of(alpha, np.array([1.0, -1.0, -2.0])))
    assert ST.alpha_c_of(alpha, np.array([1.0, -1.0, 1.0])) == 2.5


def test_interpolate_curve_between_and_outside_the_table():
    curve = {0.1: 1.0, 0.3: 3.0, 0.2: 1.5}
    assert ST.interpolate_curve(curve, 0.25) == pytest.approx(2.25) and ST.interpolate_curve(curve, 0.1) == 1.0
    assert math.isnan(ST.interpolate_curve(curve, 0.05)) and math.isnan(ST.interpolate_curve(curve, 0.35))


def test_delta_summary_sorted_keeps_points_without_sigma_and_names_a_tie():
    gaps = _gaps({1.2: [1.0, 3.0], 0.8: [-1.0, 1.0]})
    gaps["delta_eps_g"] = [0.1, 0.4, 0.0, 0.2]
    other = _gaps({1.0: [-2.0, -4.0]}).assign(**{R.SIGMA: np.nan})  # another tool's runs, without σ
    summary = ST.student_delta_summary(pd.concat([gaps, other], ignore_index=True))
    assert list(summary[R.ALPHA]) == [0.8, 1.0, 1.2] and math.isnan(summary.loc[1, R.SIGMA])
    assert list(summary.lower_train_loss) == ["tie", "positional", "semantic"]
    small = ST.student_delta_summary(_gaps({1.0: [0.4, 0.6], 1.5: [-0.4, -0.6]}))
    assert list(small.lower_train_loss) == ["semantic", "positional"]
    assert summary.loc[2, "delta_eps_g_std"] == pytest.approx(statistics.stdev([0.1, 0.4]))
    empty = ST.student_delta_summary(gaps.iloc[:0])
    assert empty.empty and list(empty.columns)[-2:] == ["lower_train_loss", ST.CALL]
    crossing = ST.crossing_alphas(pd.concat([other, gaps.assign(**{R.OMEGA: 0.1})], ignore_index=True))
    assert list(crossing[R.OMEGA]) == [0.1, 0.2] and crossing[R.SIGMA].isna().tolist() == [False, True]
    assert list(crossing.columns) == [k for k in ST.DELTA_GROUP if k != R.ALPHA] + ST.CROSSING_COLUMNS
    assert crossing.n_alpha.tolist() == [2, 1] and crossing.n_seeds.tolist() == [2, 2]
    # the theory's α_c beside each row of the same σ, λ and ω (a left join: a row without one keeps NaN)
    theory = pd.DataFrame({R.SIGMA: [0.5, 0.5], ST.LAM_FIXED: [0.01, 0.01], R.OMEGA: [0.1, 0.3],
                           ST.ALPHA_C_THEORY: [0.75, 1.25]})
    beside = ST.crossing_alphas(gaps.assign(**{R.OMEGA: 0.1}), theory=theory)
    assert len(beside) == 1 and beside[ST.ALPHA_C_THEORY].tolist() == [0.75]
    missing = ST.crossing_alphas(gaps, theory=theory)
    assert len(missing) == 1 and missing[ST.ALPHA_C_THEORY].isna().all()


def test_for_runs_finds_the_table_by_preset_else_by_an_arxiv_dataset_name():
    assert PB.for_runs("imdb", "anything") is PB.TABLE1_IMDB and PB.for_runs("demo", "arxiv") is None
    assert PB.for_runs(None, "ccdv/ArXiv-classification") is PB.TABLE3_ARXIV
    assert PB.for_runs(None, "stanfordnlp/imdb") is None and PB.for_runs("", "ARXIV") is PB.TABLE3_ARXIV


def test_alpha_c_interval_at_the_grids_edges_with_two_seeds_and_two_alphas():
    """The outermost zero over every line and parabola that exists at the grid's first and last segments; two
    seeds and two α suffice; no interval says why, and so does one open on both sides."""
    alpha = np.array([0.5, 1.0, 1.5, 2.0])
    per_seed = np.array([[-4.0, 1.0, 1.5, 7.0], [-3.0, 1.6, 1.9, 8.0], [-3.6, 1.3, 1.7, 7.5]])  # (S, A)
    gaps = {a: list(per_seed[:, i]) for i, a in enumerate(alpha)}
    _, lower, upper = _t_bounds(gaps)
    assert list(upper < 0) == [True, False, False, False] and list(lower > 0) == [False, True, True, True]

    def zeros(ends, left):  # the line's zero, and each parabola's through the segment and a neighbour
        out = [_zero(alpha[left], alpha[left + 1], ends[left], ends[left + 1])]
        for first in (left - 1, left):
            if 0 <= first <= len(alpha) - 3:
                parabola = np.polynomial.Polynomial.fit(alpha[first:first + 3], ends[first:first + 3], 2)
                out += [r.real for r in parabola.roots()
                        if abs(r.imag) < 1e-9 and alpha[left] <= r.real <= alpha[left + 1]]
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no parabola fitted through fewer than three points
        got, last = ST.alpha_c_interval(per_seed, alpha), ST.alpha_c_interval(-per_seed[:, ::-1], alpha)
    assert (got.low, got.high) == (pytest.approx(min(zeros(upper, 0))), pytest.approx(max(zeros(lower, 0))))
    assert min(zeros(upper, 0)) < zeros(upper, 0)[0]  # the parabola from the grid's first point moved it
    # the last segment: mirrored data, the crossing between 1.5 and 2.0
    mirrored = -per_seed[:, ::-1]
    _, lower_m, upper_m = _t_bounds({a: list(mirrored[:, i]) for i, a in enumerate(alpha)})
    assert (last.low, last.high) == (pytest.approx(min(zeros(upper_m, 2))), pytest.approx(max(zeros(lower_m, 2))))
    assert max(zeros(lower_m, 2)) > zeros(lower_m, 2)[0]  # the parabola to the grid's last point moved it
    # two seeds, two α: still an interval
    two = ST.alpha_c_interval(np.array([[-3.0, 2.0], [-2.9, 2.2]]), np.array([1.0, 1.5]))
    assert 1.0 < two.low < two.high < 1.5 and two.why == ""
    assert ST.alpha_c_interval(np.array([[-3.0, 2.0]]), np.array([1.0, 1.5])).why == (
        "fewer than two α with two seeds or more: no interval")
    flat = ST.alpha_c_interval(np.array([[-1.0, 1.0], [1.0, -1.0]]), np.array([1.0, 1.5]))
    assert (flat.low, flat.high) == (-math.inf, math.inf) and flat.why == (
        "open below: the gap is not confidently negative at any α before it; "
        "open above: the gap is not confidently positive at any α after it")


def test_the_phase_map_draws_each_alpha_c_interval_with_an_arrow_where_it_is_open():
    from pefusion.analysis.figures.phase_map import phase_diagram_figure

    rising = {0.5: [-3.0, -2.5, -3.5], 0.75: [-1.5, -1.0, -2.0], 1.0: [-0.6, 0.4, 0.1], 1.25: [0.9, 1.2, 1.0],
              1.5: [2.5, 3.0, 3.3]}
    negative = {a: [g - 10.0 for g in gaps] for a, gaps in rising.items()}  # ω 0.3: α_c above the grid
    deltas = pd.concat([_gaps(rising, 0.2), _gaps(negative, 0.3)], ignore_index=True)
    crossings = ST.crossing_alphas(deltas).set_index(R.OMEGA)
    assert crossings.loc[0.3, "alpha_c_high"] == math.inf
    assert crossings.loc[0.3, "alpha_c_open"].startswith("open above")
    fig = phase_diagram_figure(ST.student_delta_summary(deltas), crossings=crossings.reset_index())
    ends = {(round(float(line.get_ydata()[0]), 6), line.get_marker()): float(line.get_xdata()[0])
            for line in fig.axes[0].lines if line.get_color() == "tab:purple" and len(line.get_xdata()) == 1}
    low, high = crossings.loc[0.2, ["alpha_c_low", "alpha_c_high"]]
    assert ends[(0.2, "|")] in (pytest.approx(low), pytest.approx(high))
    assert ends[(0.3, ">")] == pytest.approx(1.6) and (0.3, "<") not in ends  # open above: to the edge, arrowed
    assert "α_c here, 95 % interval (arrow: open beyond the grid)" in fig.axes[0].get_legend_handles_labels()[1]


def test_lambda_cv_phase_figure_labels_lambda_star_and_a_small_d_says_it_cannot_place_the_transition(store):
    from pefusion.analysis.figures.phase_map import phase_diagram_figure

    student = ST.student_frame(RU.load_trial_runs(store["uri"], "student-attention", store["cv"]))
    summary = ST.student_delta_summary(ST.student_deltas(student))
    fig = phase_diagram_figure(summary, ALPHA_C, ALPHA_L, student=student)
    ax = fig.axes[0]
    labels = {round(t.xy[0], 6): t.get_text() for t in ax.texts}
    assert labels == {a: f"sem {0.01 * (1 + a):g}\npos {0.01 * (1 + a):g}" for a in ALPHAS_CV}  # the runs' λ*
    assert "α_c(ω), paper: d → ∞, λ = 0.01" in ax.get_legend_handles_labels()[1]
    assert fig._supxlabel is not None and fig._supxlabel.get_text().startswith(
        f"d = 100 (n = α·d = {min(ALPHAS_CV) * 100:.0f}–{max(ALPHAS_CV) * 100:.0f} samples), below the paper's "
        f"d = 1000: too small to place the transition")
    decided = summary[summary.n_pairs == 2].assign(**{R.D: 1000.0})  # α 1.6 has one seed: undecided
    at_paper_d = phase_diagram_figure(decided, ALPHA_C, ALPHA_L)
    assert at_paper_d._supxlabel is None and not at_paper_d.axes[0].texts  # no λ* without the student frame
    one_seed = phase_diagram_figure(summary.assign(**{R.D: 1000.0}), ALPHA_C, ALPHA_L)
    assert one_seed._supxlabel.get_text().startswith("1 seed(s) leave 1 point(s) more than 0.1 from α_c undecided")


# ---------------------------------------------------------------------------------------------------------
# Our seeds against the published numbers: the verdict, the protocol
# ---------------------------------------------------------------------------------------------------------


def _paper_sample(mean: float, sd: float, n: int) -> np.ndarray:
    """n values with exactly this mean and sample SD: the paper's seeds as scipy's two-sample test reads them."""
    z = np.random.default_rng(n).normal(size=n)
    return mean + sd * (z - z.mean()) / z.std(ddof=1)


@pytest.mark.parametrize("ours,paper", [
    ([83.1, 83.5, 83.2, 83.6, 83.3], (83.28, 0.15)),  # the paper's mean inside our one-sample interval: consistent
    ([84.0, 84.2, 84.1], (83.28, 0.15)),  # above
    ([82.0, 82.9, 81.7, 82.4], (83.28, 0.15)),  # below
    ([83.0, 83.0], (82.9, 0.13)),  # no spread on our side: a one-sample interval would be the point, 0.1 above
    ([62.1, 66.3], (59.22, 1.07)),  # two seeds 4.9 pp above a wide cell: the difference's interval holds 0
    ([60.0, 60.5, 60.2, 60.4, 60.1], (59.22, 1.07)),  # the paper's mean outside our one-sample interval, yet
])                                                      # its own spread over five seeds keeps the Welch interval
def test_verdict_is_welchs_two_sample_test_against_scipy_on_the_papers_seeds(ours, paper):
    """The difference ours − paper, its 95 % interval and p-value as scipy's Welch test computes them on a
    sample with the paper's mean and SD, the verdict from them, and `detectable` from the non-central t."""
    mean, sd = paper
    test = stats.ttest_ind(ours, _paper_sample(mean, sd, 5), equal_var=False)
    low, high = test.confidence_interval(0.95)
    expected = "above" if low > 0 else "below" if high < 0 else "consistent"
    got = PB.verdict(ours, mean, sd, 5)
    assert got["verdict"] == expected and got["n"] == len(ours)
    assert got["delta"] == pytest.approx(np.mean(ours) - mean, abs=1e-12)
    assert (got["ci95_low"], got["ci95_high"]) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
    assert got["p_value"] == pytest.approx(test.pvalue, rel=1e-9)
    se = math.sqrt(np.var(ours, ddof=1) / len(ours) + sd ** 2 / 5)
    critical, shift = stats.t.ppf(0.975, test.df), got["detectable"] / se  # either tail rejects
    power = stats.nct.sf(critical, test.df, shift) + stats.nct.sf(critical, test.df, -shift)
    assert power == pytest.approx(0.8, abs=1e-6)


def test_the_two_last_verdicts_are_the_ones_a_one_sample_interval_gets_wrong():
    assert PB.verdict([83.0, 83.0], 82.9, 0.13, 5)["verdict"] == PB.CONSISTENT
    assert PB.verdict([60.0, 60.5, 60.2, 60.4, 60.1], 59.22, 1.07, 5)["verdict"] == PB.CONSISTENT
    assert PB.verdict([62.1, 66.3], 59.22, 1.07, 5)["detectable"] > 10  # two seeds could miss 10 pp


def test_verdict_of_one_seed_has_no_interval():
    nan = math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no mean of an empty array
        one, none = PB.verdict([84.0], 83.28, 0.15, 5), PB.verdict([], 83.28, 0.15, 5)
    assert one == pytest.approx({"n": 1, "mean": 84.0, "sd": nan, "delta": 0.72, "ci95_low": nan, "ci95_high": nan,
                                 "p_value": nan, "detectable": nan, "verdict": "one seed: no verdict"}, nan_ok=True)
    assert none == pytest.approx({"n": 0, "mean": nan, "sd": nan, "delta": nan, "ci95_low": nan, "ci95_high": nan,
                                  "p_value": nan, "detectable": nan, "verdict": PB.NO_RUN}, nan_ok=True)


def test_verdict_without_spread_on_either_side_and_exactly_equal_means():
    """Both SDs 0: the difference is known exactly, its interval the point; a difference of exactly 0 is neither
    above nor below."""
    above = PB.verdict([83.5, 83.5], 83.0, 0.0, 5)
    assert (above["ci95_low"], above["ci95_high"], above["verdict"]) == (pytest.approx(0.5), pytest.approx(0.5),
                                                                           "above")
    assert PB.verdict([83.0, 83.0], 83.0, 0.0, 5)["verdict"] == "consistent"
    got = PB.verdict([83.0, 84.0, 85.0], 84.0, 0.5, 5)
    assert got["sd"] == 1.0 and got["mean"] == 84.0 and got["verdict"] == "consistent"


def test_welch_from_summaries_elementwise_and_detectable_where_defined():
    """`welch` over arrays equals scipy's Welch test on samples with those summaries; `detectable` grows with
    the power asked for and is NaN where there is no spread or no degree of freedom."""
    a, b = [61.0, 63.5, 60.2, 62.0], _paper_sample(59.22, 1.07, 5)
    w = PB.welch(np.array([np.mean(a), 1.0]), np.array([np.std(a, ddof=1), 0.5]), np.array([4, 3]),
                 np.array([59.22, 0.0]), np.array([1.07, 0.5]), np.array([5, 3]))
    test = stats.ttest_ind(a, b, equal_var=False)
    assert (w["diff"][0], w["df"][0], w["p_value"][0]) == (pytest.approx(np.mean(a) - 59.22), pytest.approx(test.df),
                                                            pytest.approx(test.pvalue))
    assert w["se"][0] == pytest.approx(math.sqrt(np.var(a, ddof=1) / 4 + 1.07 ** 2 / 5))
    assert (w["low"][0], w["high"][0]) == pytest.approx(tuple(test.confidence_interval(0.95)))
    assert w["diff"][1] == 1.0 and w["df"][1] == pytest.approx(4.0)
    more = PB.welch(1.0, 1.0, 5, 0.0, 1.0, 5, power=0.9)["detectable"]
    assert more > PB.welch(1.0, 1.0, 5, 0.0, 1.0, 5)["detectable"]
    assert PB.detectable_difference(1.0, 1.0) == pytest.approx(16.334, abs=1e-3)  # the non-central t, 1 df
    for se, df in ((0.0, 4.0), (1.0, 0.0), (1.0, math.nan), (math.nan, 4.0)):
        assert math.isnan(PB.detectable_difference(se, df)), (se, df)


def table1_runs(preset: str, dataset: str, accs: dict[str, list[float]], **params) -> pd.DataFrame:
    """Made-up ok runs of the sinusoidal Table 1 cells, recording `preset`'s settings overridden by `params`."""
    from pefusion.fusion.config import PRESETS, flat_config

    base = PRESETS[preset]
    config = {**flat_config(base.model, base.train), **params}
    rows = [{**config, R.DATASET: dataset, R.PRESET: preset, R.PE_TYPE: "sinusoidal", R.FUSION: fu, R.SEED: seed,
             R.STATUS: R.STATUS_OK, R.TEST_ACC: acc / 100, RU.RUN_ID: f"{fu}{seed}", RU.START_TIME: seed}
            for fu, values in accs.items() for seed, acc in enumerate(values)]
    return pd.DataFrame(rows)


def test_imdb_runs_are_compared_with_table1_whatever_their_data_folder_is_called():
    accs = {"add": [83.1, 83.5, 83.2, 83.6, 83.3], "concat": [82.0, 82.1, 82.2, 81.9, 82.0], "gate_vector": [84.9]}
    table = FT.table1(table1_runs("imdb", "stanfordnlp/imdb", accs)).set_index("fusion")
    assert table.attrs["published"] == "Table 1, IMDB"
    for fu, values in accs.items():
        row, paper = table.loc[fu], PB.TABLE1_IMDB.cells[("sinusoidal", fu)]
        assert (row.published_mean, row.published_std) == paper
        assert row.delta_vs_paper == pytest.approx(np.mean(values) - paper[0])
        judged = PB.verdict(values, *paper, 5)
        assert row.verdict == judged["verdict"]
        assert [row.delta_ci95_low, row.delta_ci95_high, row.detectable] == pytest.approx(
            [judged["ci95_low"], judged["ci95_high"], judged["detectable"]], nan_ok=True)
        assert row.protocol == "as published"
    assert list(table.verdict) == ["consistent", "below", "one seed: no verdict"]
    # A --data-dir folder named `small`, one epoch at 128 tokens: still IMDB's row, marked as a changed protocol.
    changed = FT.table1(table1_runs("imdb", "small", {"add": [70.0]}, max_len=128, max_epochs=1))
    row = changed.iloc[0]
    assert (row.published_mean, row.verdict) == (83.28, "one seed: no verdict")
    assert row.protocol.startswith("changed: ") and "max_len 512→128" in row.protocol
    assert "max_epochs 20→1" in row.protocol and "data small (not stanfordnlp/imdb)" in row.protocol
    shown = FM.to_markdown(FT.table1_display(changed, digits=2))
    assert "83.28 ± 0.15" in shown and "| one seed: no verdict |" in shown and "-13.28" in shown


def test_agnews_and_arxiv_runs_find_their_tables_and_other_presets_none():
    agnews = FT.table1(table1_runs("agnews", "ag_news", {"add": [91.0, 91.2]}))
    assert agnews.attrs["published"] == "Table 1, AG News" and agnews.published_mean.tolist() == [91.15]
    arxiv = FT.table1(table1_runs("arxiv", "anything", {"concat": [63.0, 64.0]}))
    assert arxiv.attrs["published"] == "Table 3, ArXiv-11" and arxiv.published_std.tolist() == [2.27]
    assert "published_mean" not in FT.table1(table1_runs("demo", "synthetic-spread", {"add": [60.0, 61.0]}))


def test_table1s_latency_column_names_how_latency_was_timed(trials):
    """The runs under test recorded no `latency` param (as before it existed): 'method not recorded'; all runs of
    one method name it; runs of two methods name both."""
    def header(frame) -> str:
        return [c for c in FT.table1_display(FT.table1(frame)).columns if c.startswith("latency")][0]

    assert header(trials) == "latency (ms / sample, method not recorded)"
    assert header(trials.assign(**{R.LATENCY: R.LATENCY_SYNTHETIC_BATCH})) == \
        "latency (ms / sample, one synthetic batch)"
    mixed = trials.assign(**{R.LATENCY: [R.LATENCY_TEST_PASSES if i % 2 else R.LATENCY_TEST_SAMPLE
                                         for i in range(len(trials))]})
    assert header(mixed) == "latency (ms / sample, full test passes / a sample of test batches)"
