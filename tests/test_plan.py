"""`--plan`: every sweep command prints its trials and an estimate of its cost and stops before Ray starts, with
nothing written; the estimate's arithmetic (trials at once, wall time of trials in order) checked by hand; the
report puts the estimate beside the measured time."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import load_script, write_synthetic_corpus
from pefusion import record as R
from pefusion.analysis import compute as CO
from pefusion.analysis.report.compute import plan_line
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


def _grid_study(values: dict, may_end_early: bool = False):
    """What `make_plan` reads of a study: a grid space of `values`."""
    from types import SimpleNamespace

    from pefusion.sweep.space import Grid, SearchSpace

    space = SearchSpace({k: Grid(tuple(v)) for k, v in values.items()}, {})
    return SimpleNamespace(space=space, num_samples=1, search_alg=None, preset="demo",
                           may_end_early=lambda point: may_end_early)


def test_the_plans_wall_is_the_command_so_far_rays_start_the_trials_with_rays_share_and_the_end():
    """By hand: 4 trials of 10, 20, 30, 40 s on 2 one-CPU slots, each slot's first trial process 3 s, 0.5 s of
    Ray's per trial (gap 0.4 + report 0.1), Ray's start 5 s, the end 2 s of which Ray's shutdown 1.5 s, 7 s already
    run, 4 s of the process before the sweep: slots free at 3 s; 10.5 -> 13.5, 20.5 -> 23.5, 30.5 -> 44,
    40.5 -> 64: the sweep 7 + 5 + 64 + 0.5 = 76.5 s, the command 4 + 76.5 + 1.5 = 82 s. Resumed with the 10 and 30 s
    trials finished: 20.5 -> 23.5, 40.5 -> 43.5: 7 + 5 + 43.5 + 0.5."""
    from pefusion.sweep.enginecost import EngineCost
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.plan import make_plan
    from pefusion.sweep.study import Timing

    study = _grid_study({"seed": [0, 1, 2, 3]})
    timing = Timing(seconds=(10.0, 20.0, 30.0, 40.0), device="cpu (test)", trial="t", budget="1 epoch per trial",
                    testing_s=(1.0, 2.0, 3.0, 4.0))
    cost = EngineCost(ray_start_s=5.0, first_trial_s=3.0, between_s=0.4, report_s=0.1, end_s=2.0, measured_at=0.0,
                      shutdown_s=1.5)
    opts = SweepOptions(sweep="arxiv_grid", cpus_per_trial=1.0, gpus_per_trial=0.0, num_cpus=2, num_gpus=0)
    plan = make_plan(study, opts, timing, cost=cost, so_far=7.0, before=4.0)
    assert plan.wall_s == pytest.approx(76.5) and plan.command_s == pytest.approx(82.0)
    assert plan.testing_s == pytest.approx(2.5)
    assert "wall 1 min 22 s for the command, of which the sweep 1 min 16 s" in plan.lines[2]
    assert all(part in plan.lines[-1] for part in ("this process's start 4.0 s", "the sweep so far 7.0 s",
                                                   "Ray's start 5.0 s", "the sweep's end 0.5 s",
                                                   "Ray's shutdown 1.5 s"))
    resumed = make_plan(study, dataclasses.replace(opts, resume=True), timing, cost=cost, so_far=7.0,
                        finished=[{"seed": 0}, {"seed": 2, "lr": 0.1}])
    assert resumed.wall_s == pytest.approx(7 + 5 + 43.5 + 0.5) and resumed.testing_s == pytest.approx(3.0)
    assert "2 left to run" in resumed.lines[0]


def test_trials_packed_on_a_card_are_planned_as_an_upper_bound_that_says_why():
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.plan import make_plan
    from pefusion.sweep.study import Timing

    study = _grid_study({"seed": [0, 1, 2, 3]})
    timing = Timing(seconds=(10.0,) * 4, device="cuda (test)", trial="t", budget="1 epoch per trial")
    packed = make_plan(study, SweepOptions(sweep="s", cpus_per_trial=1.0, gpus_per_trial=0.25, num_cpus=8,
                                           num_gpus=1), timing)
    assert packed.at_most and "at most" in packed.lines[2] and "1.65x" in packed.lines[0]
    alone = make_plan(study, SweepOptions(sweep="s", cpus_per_trial=1.0, gpus_per_trial=1.0, num_cpus=8,
                                          num_gpus=4), timing)
    assert not alone.at_most


def test_a_resumed_sweep_reads_its_finished_trials_from_tunes_folders(tmp_path):
    import json

    from pefusion.sweep.plan import finished_configs

    for name, config, results in (("a", {"seed": 0}, [{"epoch": 1}, {R.STATUS: R.STATUS_OK}]),
                                  ("b", {"seed": 1}, [{"epoch": 1}]),  # interrupted
                                  ("c", {"seed": 2}, [{R.STATUS: R.STATUS_DIVERGED}])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "params.json").write_text(json.dumps(config))
        (tmp_path / name / "result.json").write_text("\n".join(map(json.dumps, results)) + "\n")
    assert sorted(c["seed"] for c in finished_configs(str(tmp_path))) == [0, 2]


def test_ag_news_seeds_are_one_kind_of_trial():
    """AG News draws its validation split per seed (a corpus per seed) but its seeds compute the same: 2 fusions x
    5 seeds are 2 kinds to time, not 10."""
    from pefusion.fusion.config import PRESETS
    from pefusion.fusion.timing import timed_kinds

    points = [{"pe_type": "sinusoidal", "fusion": f, "seed": s} for f in ("add", "concat") for s in range(5)]
    kinds, which = timed_kinds(points, PRESETS["agnews"])
    assert len(kinds) == 2 and which == [0] * 5 + [1] * 5


@pytest.mark.parametrize("multiple,limit", [(1, 64), (16, 40)])
def test_evaluation_is_planned_on_its_own_length_sorted_batches(multiple, limit):
    """The padded tokens `eval_tokens` counts are those of the batches evaluation makes (iter_batches, unshuffled),
    far fewer than random batches of the same documents would have."""
    from pefusion.data.batching import iter_batches
    from pefusion.data.encoded import EncodedSplit
    from pefusion.fusion.timing import eval_tokens

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, limit + 1, 300)
    split = EncodedSplit.random(lengths, lengths, 50, 2, rng)
    real = sum(b.tokens.numel() for b in iter_batches(split, 32, shuffle=False, pad_multiple=multiple,
                                                       max_width=limit))
    assert eval_tokens(lengths, 32, multiple, limit).sum() == real
    shuffled = rng.permutation(300)
    random = sum(len(b) * min(-(-lengths[b].max() // multiple) * multiple, limit)
                 for b in np.array_split(shuffled, 10))
    assert real < 0.8 * random


def test_rays_figures_are_measured_once_a_day_and_kept(tmp_path, monkeypatch):
    """The tiny sweep runs when nothing is kept or what is kept is older than a day, and its figures are kept,
    one set per cluster size and kind of start (with the dashboard or not)."""
    import time

    from pefusion.sweep import enginecost as EC
    from pefusion.sweep import gpus

    runs = []

    def tiny_sweep(fn, slots, env, module, start_ray):
        runs.append((slots, env, start_ray))
        assert module == "pefusion.fusion.trainable"
        return EC.EngineCost(1.0, 2.0, 0.1, 0.01, 0.5, measured_at=time.time(), shutdown_s=0.3)

    monkeypatch.setattr(gpus, "in_fresh_process", tiny_sweep)
    module = "pefusion.fusion.trainable"

    def cost(slots, env=None, kind="", measure_now=True):
        return EC.engine_cost(slots, env or {}, module, print, kind, cache=tmp_path, measure_now=measure_now)

    assert cost(2, {"A": "1"}, measure_now=False) is None  # a sweep never measures
    assert runs == []
    first = cost(2, {"A": "1"})
    assert runs == [(2, {"A": "1"}, print)] and first.ray_start_s == 1.0
    assert cost(2) == first and len(runs) == 1  # kept
    assert cost(2, measure_now=False) == first  # and a sweep takes them
    cost(4)  # another cluster size: its own figures
    cost(2, kind="dashboard")  # Ray started with its dashboard: its own
    assert len(runs) == 3
    kept, = tmp_path.glob("engine_cost/*-2cpu-pefusion*.json")
    kept.write_text(kept.read_text().replace(str(first.measured_at), str(first.measured_at - EC.MAX_AGE_S - 1)))
    cost(2)
    assert len(runs) == 4


TIMER_CALLS: list = []


def _counted_timer(device: str, *, points: list, seconds: float) -> object:
    """A study's timer for `test_a_sweep_takes_the_timing_its_plan_made`: it records each call."""
    from pefusion.sweep.plan import Timing

    TIMER_CALLS.append(device)
    return Timing(seconds=(seconds,) * len(points), device=f"{device} (test)", trial="t", budget="1 epoch per trial")


def test_a_sweep_takes_the_timing_its_plan_made_within_a_day_and_plan_times_again(tmp_path):
    """`--plan` (fresh) times and keeps; a sweep of the same trials takes what was kept (said in the lines), a sweep
    of other trials or after a day times again."""
    import functools
    import json

    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.enginecost import MAX_AGE_S
    from pefusion.sweep.plan import make_plan, time_trials

    calls = TIMER_CALLS
    calls.clear()
    opts = SweepOptions(sweep="s", cpus_per_trial=1.0, gpus_per_trial=0.0, num_cpus=2, num_gpus=0)

    def study(seeds, seconds=5.0):
        grid = _grid_study({"seed": seeds})
        grid.timer = lambda points, shipped: functools.partial(_counted_timer, points=list(points), seconds=seconds)
        return grid

    planned = time_trials(study([0, 1]), opts, {}, fresh=True, cache=tmp_path)
    assert len(calls) == 1 and planned.kept_from == 0.0
    kept = time_trials(study([0, 1]), opts, {}, fresh=False, cache=tmp_path)
    assert len(calls) == 1 and kept.seconds == planned.seconds and kept.kept_from > 0
    assert "(the same trials' timing, kept a day)" in make_plan(study([0, 1]), opts, kept).lines[1]
    time_trials(study([0, 1]), opts, {}, fresh=True, cache=tmp_path)  # --plan always times
    assert len(calls) == 2
    time_trials(study([0, 2]), opts, {}, fresh=False, cache=tmp_path)  # other trials
    time_trials(study([0, 1], seconds=6.0), opts, {}, fresh=False, cache=tmp_path)  # a timer given other data
    assert len(calls) == 4
    for path in (tmp_path / "plan_timing").glob("*.json"):
        saved = json.loads(path.read_text())
        path.write_text(json.dumps({**saved, "measured_at": saved["measured_at"] - MAX_AGE_S - 1}))
    time_trials(study([0, 1]), opts, {}, fresh=False, cache=tmp_path)
    assert len(calls) == 5


def test_the_timings_key_is_the_same_in_another_process_and_follows_the_data():
    """Two processes (string hashing differs between them) give a fusion sweep's timer the same key; another
    sample of the data gives another."""
    import os
    import subprocess
    import sys

    script = """
import dataclasses
import numpy as np
from pefusion.data.corpus import load_corpus
from pefusion.fusion.config import PRESETS, trial_data
from pefusion.fusion.timing import plan_timer, take
from pefusion.sweep.plan import timing_key
base = PRESETS["demo"]
corpus = load_corpus(base.data)
points = [{"pe_type": "sinusoidal", "fusion": f, "seed": 0} for f in ("add", "concat")]
setting = trial_data(points[0], base).tokenizer_setting
fewer = dataclasses.replace(corpus, train=take(corpus.train, np.arange(len(corpus.train) - 1)))  # other documents
for data in (corpus, fewer):
    print(timing_key(plan_timer(points, {"corpora": {setting: data}}, base=base, cpus=1), "cpu"))
"""
    keys = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": hashseed}).stdout.split()
            for hashseed in ("1", "2")]
    assert keys[0] == keys[1] and keys[0][0] != keys[0][1] and len(keys[0][0]) == 24
