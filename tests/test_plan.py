"""`--plan`: every sweep command prints its trials and an estimate of its cost and stops before Ray starts, with
nothing written; the estimate's arithmetic (trials at once, wall time of trials in order) checked by hand; the
report puts the estimate beside the measured time."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import load_script, write_synthetic_corpus
from pefusion import record as R
from pefusion.analysis import compute as CO
from pefusion.analysis.report import plan_line
from pefusion.sweep.plan import makespan, trials_at_once

NOTHING_WRITTEN = ("ray_results", "mlflow.db", "mlartifacts", "results")


@pytest.mark.parametrize("script,argv,trials,at_most", [
    # a local data folder, as the paper's presets run on their files: 2 fusions x 2 seeds, no early stopping
    ("sweeps/arxiv_grid.py", ["--preset", "agnews_imdb", "--pe-types", "sinusoidal", "--fusions", "add,concat",
                              "--seeds", "0,1"], 4, False),
    # x 2 inits; fits by GD, which ends a fit at its fixed point: "at most"
    ("sweeps/lambda_cv.py", ["--alphas", "0.5,1.5", "--seeds", "0"], 4, True),
], ids=["arxiv_grid", "lambda_cv"])
def test_plan_prints_the_trials_and_an_estimate_and_starts_nothing(in_tmp, cache_dir, capsys, script, argv, trials,
                                                                   at_most):
    import ray

    data = in_tmp.parent / f"{in_tmp.name}-data"
    write_synthetic_corpus(data, n_train=64, n_val=32, n_test=32)
    extra = ["--data-dir", str(data), "--cache-dir", str(cache_dir)] if "arxiv" in script else []
    np.random.seed(7)  # the plan's throwaway models seed; Ray's random search samples from this global state
    threads = torch.get_num_threads()
    code = load_script(script).main([*argv, *extra, "--smoke", "--plan"])
    drawn = np.random.random()
    np.random.seed(7)
    assert drawn == np.random.random() and torch.get_num_threads() == threads  # the driver left as it was
    out = capsys.readouterr().out
    assert code == 0
    assert f"plan: {trials} trials of " in out
    assert "plan: timed on cpu" in out and " at once (1 CPU per trial" in out and "core-hours" in out
    assert ("at most " in out) == at_most
    assert not ray.is_initialized()
    assert [p for p in NOTHING_WRITTEN if (in_tmp / p).exists()] == []


def test_trials_at_once_by_hand():
    node = {"CPU": 16.0, "GPU": 2.0}
    assert trials_at_once(1.0, 0.0, {"CPU": 2.0}, 0, 60) == (2, 0)  # two one-CPU trials on 2 cores
    assert trials_at_once(3.0, 0.0, {"CPU": 8.0}, 0, 60) == (2, 0)  # 8 // 3
    assert trials_at_once(1.0, 0.0, {"CPU": 8.0}, 3, 60) == (3, 0)  # --max-concurrent
    assert trials_at_once(1.0, 0.0, {"CPU": 8.0}, 0, 5) == (5, 0)  # no more than the trials
    assert trials_at_once(1.0, 0.25, node, 0, 60) == (8, 2)  # 2 / 0.25 = 8 trials on both cards
    assert trials_at_once(4.0, 0.25, node, 0, 60) == (4, 1)  # the CPUs hold 4: one card's worth
    assert trials_at_once(1.0, 1.0, node, 0, 60) == (2, 2)


def test_makespan_runs_trials_in_order_in_the_first_free_slot():
    # slot 1 takes the 3 s trial; slot 2 the three 1 s ones, free at 1, 2, 3; the last (2 s) starts at 3: 5 s
    assert makespan([3, 1, 1, 1, 2], 2) == 5
    assert makespan([2.0] * 7, 3) == 6.0  # ceil(7 / 3) rounds of 2 s
    assert makespan([4, 1], 1) == 5


def test_the_report_puts_the_estimate_beside_the_measured_time():
    totals = CO.Totals(runs=4, wall_s=100.0, gpu_hours=0.0, cpu_hours=0.05, unpriced=0, devices=("cpu",),
                       sweep_wall_s=120.0, cluster_gpus=0.0, card_hours=0.0, plan_wall_s=100.0,
                       plan_device_hours=0.05, plan_at_most=True)
    line = plan_line(totals)
    assert "wall at most 100 s, at most 0.05 core-hours" in line and "120 s the sweep command took (1.20x" in line
    assert plan_line(CO.totals(*_no_runs(), {R.SWEEP_WALL_S: 9.0})) == ""  # a parent run without an estimate


def _no_runs():
    import pandas as pd

    trials = pd.DataFrame({R.STARTED_AT: [0.0], R.ENDED_AT: [1.0]})
    return trials, pd.DataFrame(columns=[R.WALL_S, CO.GPU_HOURS, CO.CPU_HOURS])


def test_a_student_points_steps_are_timed_without_the_processs_first_run_costs(monkeypatch):
    """The first fit in a process pays one-time costs (imports, allocator): timed, it made the 2-step run slower
    than the 22-step one and every fit's steps cost nothing (the paper's λ-CV planned at 53 s, against the
    12.5–14 min it takes). A stand-in point that costs 0.3 s once, then 2 ms a step, must plan at 2 ms a step."""
    import time

    from pefusion.student import timing as TI
    from pefusion.student.config import STUDENT_PRESETS

    ran = []

    def point(sweep, config, grid, folds):
        time.sleep((0.3 if not ran else 0.0) + 0.002 * config.iters)
        ran.append(config.iters)

    monkeypatch.setattr(TI, "run_point", point)
    preset = STUDENT_PRESETS["demo"]
    timing = TI.time_points("cpu", sweep="phase_diagram", points=[{"alpha": 1.0, "omega": 0.3, "seed": 0}],
                            preset=preset, threads=1)
    (config, _, _), = [TI.point_config({"alpha": 1.0, "omega": 0.3, "seed": 0}, preset)]
    assert timing.seconds[0] == pytest.approx(0.002 * config.iters, rel=0.2)
