"""Benchmark the sweep engine: a grid on Ray Tune with N concurrent one-CPU trials against the same trials run one
after another in one process (the naive way), and Ray's per-trial scheduling overhead.

    python scripts/bench_sweep.py --preset demo                         # the whole demo grid (60 trials)
    python scripts/bench_sweep.py --preset demo --seeds 0 --json        # 20 trials, one JSON line
    python scripts/bench_sweep.py --preset demo --against-plan          # --plan's estimate against the sweep

Prints wall-clock seconds of both, their ratio (sequential / Ray), and the overhead per trial:
(Ray wall × concurrency − Σ time inside the trials) / trials, i.e. the time a trial slot holds no trial, per
trial; and where it goes, slot by slot: before each slot's first trial (the sweep's start-up), between two trials
of a slot (result reporting, the final checkpoint, the actor's reset for the next trial), and after a slot's last
trial while others still run (the end of the grid: trials of unequal length leave a slot idle). The sweep runs as
a user runs it after `--plan` (the plan first, before Ray starts, its seconds printed apart: the sweep takes the
timing of its trials that the plan made); `--cold` runs it as a first sweep without `--plan`, timing its trials
itself before Ray starts.

Then the floor: bare Ray Tune in the same cluster running trials of the same lengths, in the same order (each
imports what ours import, then sleeps through as many epochs as ours ran for as long as ours took and reports
once per epoch; no checkpoints, no MLflow, no callbacks), its overhead by the same formula, and ours above it:
what the engine adds. A floor of equal trials would have no idle end of grid, and would count ours against the
engine although bare Tune pays it too.

`--against-plan` instead runs the grid once as `sweeps/arxiv_grid.py` runs it, with early stopping off so that
every trial trains its whole epoch budget, as the estimate counts: the wall time its `--plan` lines estimated
before Ray started, the wall time it took (the command's, and the trials' own span), and their ratio.
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from typing import Any, Sequence

import pandas as pd
import torch

from pefusion import record as R
from pefusion.cli.flags import SEARCH_SPACES, add_grid_flags, add_preset_flag, print_result
from pefusion.fusion.config import PRESETS, split_trial_config
from pefusion.fusion.config import RULES as PEFUSION_RULES
from pefusion.sweep.space import Constant, load_search_space
from pefusion.data.corpus import load_corpus
from pefusion.fusion.training import train_and_evaluate

SPACE = SEARCH_SPACES / "arxiv_grid_demo.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_flag(parser, default="demo", presets=PRESETS)
    add_grid_flags(parser)  # default: the demo grid's
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once on Ray, one CPU each")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    parser.add_argument("--cold", action="store_true",
                        help="the sweep times its trials itself, as one run without --plan first does (default: "
                             "--plan first, whose timing the sweep takes, as the docs suggest running it)")
    parser.add_argument("--against-plan", action="store_true",
                        help="instead: the grid with early stopping off (every trial its whole epoch budget), its "
                             "--plan estimate beside the wall time it took on Ray")
    args = parser.parse_args(argv)

    space = load_search_space(SPACE, PEFUSION_RULES)
    for key, values in ((R.PE_TYPE, args.pe_types), (R.FUSION, args.fusions), (R.SEED, args.seeds)):
        if values:
            space = space.override_values(key, values)
    configs = space.points()
    preset = PRESETS[args.preset]
    corpus = load_corpus(preset.data)
    if args.against_plan:
        print_result(_against_plan(args, preset, space.override("early_stopping", Constant(False)), corpus), args.json)
        return 0

    torch.set_num_threads(1)
    start = time.perf_counter()
    for config in configs:  # the naive way: one after another, one process, one thread
        model_cfg, train_cfg = split_trial_config(config, preset)
        train_and_evaluate(model_cfg, train_cfg, corpus, length_edges=preset.data.length_edges)
    sequential_s = time.perf_counter() - start

    from pefusion.fusion.study import pefusion_study
    from pefusion.sweep.driver import run_sweep
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.cluster import start_ray
    from pefusion.sweep.plan import kept_timing
    from pefusion.sweep.settle import settle

    with tempfile.TemporaryDirectory() as tmp:
        opts = SweepOptions(sweep="bench", experiment="bench", storage_path=f"{tmp}/ray", cpus_per_trial=1.0,
                            gpus_per_trial=0.0, num_cpus=args.concurrency, max_concurrent=args.concurrency, dashboard=False,
                            verbose=0, tracking_uri=f"sqlite:///{tmp}/mlflow.db")
        study = pefusion_study("bench", args.preset, preset, space, 1.0, corpus=corpus)
        start = time.perf_counter()
        if args.cold:
            kept_timing(study, opts, study.ship()).unlink(missing_ok=True)
        else:
            settle(study, dataclasses.replace(opts, plan=True))  # before Ray starts, as `--plan` runs
        plan_s = time.perf_counter() - start
        start = time.perf_counter()
        start_ray(opts)
        cluster_s = time.perf_counter() - start
        start, wall_start = time.perf_counter(), time.time()  # trials stamp wall-clock times
        rows = run_sweep(study, opts, f"{tmp}/results").rows
        ray_s = time.perf_counter() - start
        bare = _bare_tune(rows, args.concurrency, f"{tmp}/bare")
    inside_s = _inside_s(rows)
    overhead_s = _overhead_per_trial(ray_s, args.concurrency, inside_s, len(configs))
    idle = _slot_idle(rows, wall_start, ray_s, args.concurrency)
    result = {
        "trials": len(configs), "concurrency": args.concurrency, "sequential_s": round(sequential_s, 2),
        "ray_s": round(ray_s, 2), "ray_cluster_start_s": round(cluster_s, 2),
        # the sweep's timing of its trials: made by `--plan` first (its seconds here) and taken, or its own
        "plan_first_s": None if args.cold else round(plan_s, 2), "sweep_times_its_trials": args.cold,
        "speedup": round(sequential_s / ray_s, 3), "speedup_with_cluster_start": round(sequential_s / (ray_s + cluster_s), 3),
        "mean_trial_s_sequential": round(sequential_s / len(configs), 3),
        "mean_trial_s_inside_ray": round(inside_s / len(configs), 3),
        "overhead_per_trial_s": round(overhead_s, 3),
        # Where it goes, per trial: slots waiting for their first trial, between trials, idle at the grid's end.
        **{f"overhead_{part}_per_trial_s": round(s, 3) for part, s in idle.items()},
        "bare_tune_s": round(bare["wall_s"], 2),
        "bare_tune_overhead_per_trial_s": round(bare["overhead_per_trial_s"], 3),
        **{f"bare_tune_overhead_{part}_per_trial_s": round(s, 3) for part, s in bare["idle"].items()},
        "engine_overhead_above_bare_tune_per_trial_s": round(overhead_s - bare["overhead_per_trial_s"], 3),
        "failed": int((rows[R.STATUS] != R.STATUS_OK).sum()),
    }
    print_result(result, args.json)
    return 0


def _against_plan(args: argparse.Namespace, preset, space, corpus) -> dict[str, Any]:
    """The sweep as `sweeps/arxiv_grid.py` runs it (a local cluster of `--concurrency` CPUs, one per trial): the
    estimate it printed and recorded before Ray started, and what it measured, both from its MLflow parent run:
    the command's wall seconds (the timing, Ray's start and every trial) and the trials' own span; and the estimate
    made again after the sweep."""
    from mlflow.tracking import MlflowClient

    from pefusion.fusion.study import pefusion_study
    from pefusion.sweep.driver import run_sweep
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.plan import make_plan, time_trials

    with tempfile.TemporaryDirectory() as tmp:
        opts = SweepOptions(sweep="arxiv_grid", experiment="bench", storage_path=f"{tmp}/ray", cpus_per_trial=1.0,
                            gpus_per_trial=0.0, num_cpus=args.concurrency, dashboard=False, verbose=0,
                            tracking_uri=f"sqlite:///{tmp}/mlflow.db")
        study = pefusion_study("arxiv_grid", args.preset, preset, space, 1.0, corpus=corpus)
        result = run_sweep(study, opts, f"{tmp}/results")
        metrics = MlflowClient(opts.tracking_uri).get_run(result.parent_run_id).data.metrics
        # The same estimate again, after the sweep: on a machine other work loads, how far the load drifted
        after = make_plan(study, opts, time_trials(study, opts, study.ship())).wall_s
    rows = result.rows
    estimate, took = metrics[R.PLAN_WALL_S], metrics[R.SWEEP_WALL_S]
    trials_s = float(rows["ended_at"].max() - rows["started_at"].min())
    return {"trials": len(rows), "concurrency": args.concurrency, "epochs_run": int(rows[R.EPOCHS_RUN].sum()),
            "plan_wall_s": round(estimate, 1), "plan_wall_s_after": round(after, 1), "sweep_wall_s": round(took, 1),
            "trials_span_s": round(trials_s, 1),
            "measured_over_plan": round(took / estimate, 3), "trials_span_over_plan": round(trials_s / estimate, 3),
            "plan_core_hours": round(metrics[R.PLAN_DEVICE_HOURS], 4),
            "failed": int((rows[R.STATUS] != R.STATUS_OK).sum())}


def _bare_tune(trials: pd.DataFrame, concurrency: int, storage: str) -> dict[str, Any]:
    """Ray Tune's own cost per trial on this cluster, for trials as long as `trials` (the sweep's rows, in the
    order Tune ran them): each imports what a pefusion trial process imports (torch, Ray Tune, the trainable's
    modules), then sleeps through its epochs and reports after each; the same formulas as the sweep's."""
    from ray import tune

    def bare_trial(config: dict) -> None:  # nested, so Ray pickles it by value: benchmarks/ is not installed
        import pefusion.fusion.trainable  # noqa: F401

        started, length = time.time(), config["length"]
        for epoch in range(1, length["epochs"] + 1):
            time.sleep(length["seconds"] / length["epochs"])
            tune.report({"epoch": epoch, "started_at": started, "ended_at": time.time()})

    order = trials.sort_values("trial_id")  # the grid's order, as Tune made and ran the trials
    lengths = [{"seconds": float(row.ended_at - row.started_at), "epochs": max(1, int(row[R.EPOCHS_RUN]))}
               for _, row in order.iterrows()]
    start, wall_start = time.perf_counter(), time.time()
    grid = tune.Tuner(
        tune.with_resources(bare_trial, {"cpu": 1}),
        param_space={"length": tune.grid_search(lengths)},
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrency, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=storage, verbose=0)).fit()
    wall_s = time.perf_counter() - start
    frame = grid.get_dataframe()
    return {"wall_s": wall_s, "idle": _slot_idle(frame, wall_start, wall_s, concurrency),
            "overhead_per_trial_s": _overhead_per_trial(wall_s, concurrency, _inside_s(frame), len(frame))}


def _inside_s(trials: pd.DataFrame) -> float:
    """Σ seconds inside the trials, from the wall-clock times each stamps at its start and end."""
    return float((trials["ended_at"] - trials["started_at"]).sum())


def _overhead_per_trial(wall_s: float, concurrency: int, inside_s: float, trials: int) -> float:
    """What running on Ray adds to each trial: (wall × concurrency − Σ seconds inside the trials) / trials."""
    return (wall_s * concurrency - inside_s) / trials


def _slot_idle(trials: pd.DataFrame, wall_start: float, wall_s: float, concurrency: int) -> dict[str, float]:
    """The seconds per trial that the `concurrency` slots hold no trial, split into before each slot's first trial
    (`start`), between two trials of a slot (`between`) and after its last one until the sweep ends (`end`);
    their sum is `_overhead_per_trial`. A trial takes the slot that has been free the longest (the slots are
    alike, so which one it really ran in changes nothing)."""
    free_at = [wall_start] * concurrency  # when each slot's last trial ended
    used = [False] * concurrency
    idle = {"start": 0.0, "between": 0.0, "end": 0.0}
    for _, trial in trials.sort_values("started_at").iterrows():
        slot = min(range(concurrency), key=lambda i: free_at[i])
        idle["between" if used[slot] else "start"] += trial.started_at - free_at[slot]
        free_at[slot], used[slot] = trial.ended_at, True
    idle["end"] = sum(wall_start + wall_s - t for t in free_at)
    return {part: s / len(trials) for part, s in idle.items()}
