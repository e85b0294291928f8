"""The report of a hyperparameter search (sweeps/lr_batch_asha.py): parameter importances that follow what the
score depends on, figures that tell stopped trials from complete ones, and the epoch-budget line. (Reading a
search from MLflow is tested with the other loaders in test_analysis.py.)"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pefusion import record as R
from pefusion.analysis import runs as RU
from pefusion.analysis import search as SE
from pefusion.analysis.figures.search import search_parallel_figure, search_score_figure
from pefusion.analysis.report.page import build_report
from pefusion.analysis.report.search import budget_line

from conftest import REPO

BATCH_SIZES = (16, 32, 64)


def search_frame(n: int, score, seed: int = 0, stopped: tuple[int, ...] = ()) -> pd.DataFrame:
    """n trials with lr log-uniform in [1e-4, 3e-3] and a random batch size, scored by score(lr, batch_size) (a
    fraction, as MLflow holds it); the trials at the `stopped` positions were stopped early."""
    rng = np.random.default_rng(seed)
    lr = np.exp(rng.uniform(np.log(1e-4), np.log(3e-3), n))
    batch = rng.choice(BATCH_SIZES, n)
    return pd.DataFrame({
        RU.TRIAL_ID: [f"t{i:02d}" for i in range(n)], RU.RUN_ID: [f"run{i:02d}" for i in range(n)],
        RU.START_TIME: range(n), "lr": lr, "batch_size": pd.array(batch, dtype="Int64"),
        R.DATASET: "synthetic", R.PE_TYPE: "sinusoidal", R.FUSION: "gate_scalar",
        R.SEED: pd.array([0] * n, dtype="Int64"),
        R.STATUS: [R.STATUS_STOPPED if i in stopped else R.STATUS_OK for i in range(n)], R.ERROR: "",
        R.BEST_VAL_ACC: [score(a, b) for a, b in zip(lr, batch)]})


def lr_only(lr: float, batch: int) -> float:
    return 0.5 + 0.1 * np.log10(lr)


def batch_only(lr: float, batch: int) -> float:
    return {16: 0.3, 32: 0.5, 64: 0.4}[batch]


# ---------------------------------------------------------------------------------------------------------
# Parameter importances
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("score, dominant", [(lr_only, "lr"), (batch_only, "batch_size")])
def test_importances_follow_the_key_the_score_depends_on(score, dominant):
    points = SE.search_points(search_frame(30, score))
    table, why_not = SE.param_importances(points)
    assert why_not == ""
    importance = dict(zip(table["param"], table["importance"]))
    assert set(importance) == {"lr", "batch_size"} and sum(importance.values()) == pytest.approx(1.0)
    assert importance[dominant] > 0.8 and table["param"].iloc[0] == dominant
    again, _ = SE.param_importances(SE.search_points(search_frame(30, score)))
    pd.testing.assert_frame_equal(table, again)  # a fixed forest seed: the same report every time


def test_distributions_from_the_search_space_file_else_inferred():
    trials = search_frame(8, lr_only)
    space_file = str(REPO / "search_spaces" / "lr_batch.yaml")
    points = SE.search_points(trials, SE.recorded_space(space_file), space_file)
    assert SE.describe(points.distributions["lr"]) == "log-uniform [0.0001, 0.003]"
    assert SE.describe(points.distributions["batch_size"]) == "categorical {16, 32, 64}"
    assert points.origin["lr"] == f"search space {space_file}"
    assert SE.recorded_space("/nonexistent/lr_batch.yaml") == {}
    # The file no longer holds a value the sweep sampled (edited since): that key's distribution is inferred.
    wider = trials.assign(lr=trials["lr"].where(trials.index != 0, 5e-3))
    points = SE.search_points(wider, SE.recorded_space(space_file), space_file)
    lo, hi = float(wider["lr"].min()), 5e-3
    assert (points.distributions["lr"].low, points.distributions["lr"].high) == (lo, hi)
    assert points.distributions["lr"].log == (hi / lo > 10) and points.origin["lr"] == "inferred from the values"
    assert SE.describe(points.distributions["batch_size"]).startswith("categorical")  # integers are choices


def test_no_importances_is_one_line_not_a_crash():
    one_key = search_frame(8, lr_only).assign(batch_size=pd.array([32] * 8, dtype="Int64"))
    few, same = search_frame(4, lr_only), search_frame(8, lambda lr, b: 0.4)
    for trials, reason in ((one_key, "only lr varies among the 8 scored trials"),
                           (few, "4 scored trials, fewer than the 5"), (same, "all 8 scored trials have the same")):
        table, why_not = SE.param_importances(SE.search_points(trials))
        assert table.empty and reason in why_not and "\n" not in why_not


# ---------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------


def _hollow(collection) -> bool:
    face = collection.get_facecolor()
    return len(face) == 0 or bool(np.all(face[:, 3] == 0))


def test_figures_mark_stopped_trials():
    stopped = (1, 4, 6)
    trials = search_frame(9, lr_only, stopped=stopped)
    points = SE.search_points(trials)
    fig = search_score_figure(points)
    lr_panel = fig.axes[0]
    assert lr_panel.get_xscale() == "log" and lr_panel.get_xlabel().startswith("lr")
    drawn = {True: [], False: []}
    for coll in lr_panel.collections:
        drawn[_hollow(coll)] += [tuple(xy) for xy in coll.get_offsets()]
    expect = {hollow: sorted((a, 100 * s) for i, (a, s) in enumerate(zip(trials["lr"], trials[R.BEST_VAL_ACC]))
                             if (i in stopped) == hollow) for hollow in (True, False)}
    for hollow in (True, False):
        # (lr, accuracy) pairs as an (n, 2) array: pytest.approx takes no nested lists
        assert np.array(sorted(drawn[hollow])).reshape(-1, 2) == pytest.approx(np.array(expect[hollow]).reshape(-1, 2))
    # One marker shape per batch size in the lr panel.
    shapes = {}
    for coll in lr_panel.collections:
        colour = tuple(np.round(coll.get_edgecolor()[0], 3))
        shapes.setdefault(colour, set()).add(coll.get_paths()[0].vertices.tobytes())
    present = trials["batch_size"].nunique()
    assert len(shapes) == present and all(len(s) == 1 for s in shapes.values())
    assert len({next(iter(s)) for s in shapes.values()}) == present

    lines = search_parallel_figure(points).axes[0].get_lines()
    trial_lines = [ln for ln in lines if len(ln.get_xdata()) == len(points.keys) + 1]
    assert len(trial_lines) == len(trials)
    assert sum(ln.get_linestyle() == "--" for ln in trial_lines) == len(stopped)


# ---------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------

MAX_T = 4
EPOCHS = (4, 4, 1, 1, 3, 4, 1, 4)  # per trial; trials 2, 3 and 6 stopped by ASHA, trial 4 diverged


def _search_sweep(parent_metrics: dict) -> RU.Sweep:
    trials = search_frame(len(EPOCHS), lr_only, seed=3, stopped=(2, 3, 6))
    # A diverged trial keeps the best epoch it reached before the loss blew up: still not a search result.
    trials.loc[4, [R.STATUS, R.ERROR, R.BEST_VAL_ACC]] = [R.STATUS_DIVERGED, "non-finite loss at epoch 3", 0.99]
    trials = trials.assign(**{R.EPOCHS_RUN: [float(e) for e in EPOCHS], SE.MAX_EPOCHS: MAX_T})
    return RU.Sweep("sqlite:///unused.db", "pe-fusion", trials, "a" * 32,
                    {R.TAG_SWEEP: "lr_batch_asha", R.TAG_SCHEDULER: "asha",
                     R.TAG_SEARCH_SPACE: str(REPO / "search_spaces" / "lr_batch.yaml")},
                    parent_metrics=parent_metrics)


def test_search_report_writes_figures_importances_and_the_budget_line(tmp_path):
    trained, full = 4 + 4 + 1 + 1 + 3 + 4 + 1 + 4, 8 * MAX_T  # 22 of 32
    recorded = {R.EPOCHS_TRAINED: trained, R.EPOCHS_FULL_BUDGET: full, R.BUDGET_FRACTION: trained / full}
    page, written = build_report(_search_sweep(recorded), tmp_path / "parent", log_to_mlflow=False)
    text = page.read_text()
    assert f"ASHA trained 22 of 32 epochs (68.8 %): 8 trials × max_t = {MAX_T} epochs without early stopping, " \
           f"3 trials stopped early; as the sweep&#x27;s parent run recorded them" in text
    out = tmp_path / "parent"
    figures = [out / "figures" / f"search_{name}.png" for name in ("scores", "parallel_coordinates", "budget")]
    assert set(written) == {out / "search_trials.csv", out / "search_importance.csv", *figures}
    for png in figures:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.with_suffix(".pdf").exists()
    assert text.count("<figcaption") == 3 and "7 finished trials" in text  # the diverged one is left out
    importance = pd.read_csv(out / "search_importance.csv")
    assert set(importance["param"]) == {"lr", "batch_size"} and importance["importance"].sum() == pytest.approx(1)
    assert "non-finite loss at epoch 3" in text  # listed with the failed trials
    assert "repeat the cell" not in text  # a search's trials share their identity on purpose

    # A sweep that never finished has no budget on its parent run: the same totals, summed from the trials.
    unfinished = budget_line(SE.search_budget(_search_sweep({}).trials, {}), "asha")
    assert unfinished.startswith("ASHA trained 22 of 32 epochs (68.8 %)") and "summed from the trial runs" in unfinished
