"""Benchmark the sweep engine: a grid on Ray Tune with N concurrent one-CPU trials against the same trials run one
after another in one process (the naive way), and Ray's per-trial scheduling overhead.

    python scripts/bench_sweep.py --preset demo                         # the whole demo grid (60 trials)
    python scripts/bench_sweep.py --preset demo --seeds 0 --json        # 20 trials, one JSON line

Prints wall-clock seconds of both, their ratio (sequential / Ray), and the overhead per trial:
(Ray wall × concurrency − Σ time inside the trials) / trials, i.e. what scheduling, process start-up, result
reporting, checkpointing and MLflow logging add to each trial; and where it goes: how long after the sweep's start
the first trial runs, the overhead between trials, and how long the sweep takes after its last trial ends. Then the
floor: the same number of trials on bare Ray Tune in the same cluster (each trial process imports what ours do and
reports once per epoch, nothing else), its overhead by the same formula, and ours above it.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from typing import Sequence

import pandas as pd
import torch

from pefusion import record as R
from pefusion.cli.flags import SEARCH_SPACES, add_grid_flags, add_preset_flag, print_result
from pefusion.fusion.config import PRESETS, split_trial_config
from pefusion.fusion.config import RULES as PEFUSION_RULES
from pefusion.sweep.space import load_search_space
from pefusion.data.corpus import load_corpus
from pefusion.fusion.training import train_and_evaluate

SPACE = SEARCH_SPACES / "arxiv_grid_demo.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_flag(parser, default="demo", presets=PRESETS)
    add_grid_flags(parser)  # default: the demo grid's
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once on Ray, one CPU each")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args(argv)

    space = load_search_space(SPACE, PEFUSION_RULES)
    for key, values in ((R.PE_TYPE, args.pe_types), (R.FUSION, args.fusions), (R.SEED, args.seeds)):
        if values:
            space = space.override_values(key, values)
    configs = space.points()
    preset = PRESETS[args.preset]
    corpus = load_corpus(preset.data)

    torch.set_num_threads(1)
    start = time.perf_counter()
    for config in configs:  # the naive way: one after another, one process, one thread
        model_cfg, train_cfg = split_trial_config(config, preset)
        train_and_evaluate(model_cfg, train_cfg, corpus, length_edges=preset.data.length_edges)
    sequential_s = time.perf_counter() - start

    from pefusion.cli.fusion import pefusion_study
    from pefusion.sweep.driver import run_sweep
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.tuner import start_ray

    with tempfile.TemporaryDirectory() as tmp:
        opts = SweepOptions(sweep="bench", experiment="bench", storage_path=f"{tmp}/ray", cpus_per_trial=1.0,
                            num_cpus=args.concurrency, max_concurrent=args.concurrency, dashboard=False,
                            verbose=0, tracking_uri=f"sqlite:///{tmp}/mlflow.db")
        start = time.perf_counter()
        start_ray(opts)
        cluster_s = time.perf_counter() - start
        start, wall_start = time.perf_counter(), time.time()  # trials stamp wall-clock times
        study = pefusion_study("bench", args.preset, preset, space, 1.0, corpus=corpus)
        rows = run_sweep(study, opts, f"{tmp}/results").rows
        ray_s = time.perf_counter() - start
        bare = _bare_tune(len(configs), args.concurrency, preset.train.max_epochs, f"{tmp}/bare")
    inside_s = _inside_s(rows)
    overhead_s = _overhead_per_trial(ray_s, args.concurrency, inside_s, len(configs))
    first_s = float(rows["started_at"].min() - wall_start)  # the sweep's start-up, before any trial runs
    last_s = float(wall_start + ray_s - rows["ended_at"].max())  # its end: results, parent run
    span_s = ray_s - first_s - last_s
    result = {
        "trials": len(configs), "concurrency": args.concurrency, "sequential_s": round(sequential_s, 2),
        "ray_s": round(ray_s, 2), "ray_cluster_start_s": round(cluster_s, 2),
        "speedup": round(sequential_s / ray_s, 3), "speedup_with_cluster_start": round(sequential_s / (ray_s + cluster_s), 3),
        "mean_trial_s_sequential": round(sequential_s / len(configs), 3),
        "mean_trial_s_inside_ray": round(inside_s / len(configs), 3),
        "overhead_per_trial_s": round(overhead_s, 3),
        # Where the overhead goes: start-up until the first trial runs, between trials, after the last one.
        "first_trial_starts_after_s": round(first_s, 2),
        "overhead_between_trials_per_trial_s": round(
            _overhead_per_trial(span_s, args.concurrency, inside_s, len(configs)), 3),
        "after_last_trial_s": round(last_s, 2),
        # The floor: the same number of trials on bare Ray Tune in the same cluster (reused actors, the same
        # imports in each trial process, one report per epoch; no checkpoints, no MLflow, no callbacks).
        "bare_tune_s": round(bare["wall_s"], 2),
        "bare_tune_first_trial_starts_after_s": round(bare["first_s"], 2),
        "bare_tune_overhead_per_trial_s": round(bare["overhead_per_trial_s"], 3),
        "engine_overhead_above_bare_tune_per_trial_s": round(overhead_s - bare["overhead_per_trial_s"], 3),
        "failed": int((rows[R.STATUS] != R.STATUS_OK).sum()),
    }
    print_result(result, args.json)
    return 0


def _bare_tune(trials: int, concurrency: int, epochs: int, storage: str, epoch_s: float = 0.1) -> dict[str, float]:
    """Ray Tune's own cost per trial on this cluster: `trials` trials that import what a pefusion trial process
    imports (torch, Ray Tune, the trainable's modules) and report `epochs` times, `epoch_s` apart; the same
    formula as the sweep's overhead."""
    from ray import tune

    def bare_trial(config: dict) -> None:  # nested, so Ray pickles it by value: benchmarks/ is not installed
        import pefusion.fusion.trainable  # noqa: F401

        started = time.time()
        for epoch in range(1, config["epochs"] + 1):
            time.sleep(config["epoch_s"])
            tune.report({"epoch": epoch, "started_at": started, "ended_at": time.time()})

    start, wall_start = time.perf_counter(), time.time()
    grid = tune.Tuner(
        tune.with_resources(bare_trial, {"cpu": 1}),
        param_space={"i": tune.grid_search(list(range(trials))), "epochs": epochs, "epoch_s": epoch_s},
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrency, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=storage, verbose=0)).fit()
    wall_s = time.perf_counter() - start
    frame = grid.get_dataframe()
    return {"wall_s": wall_s, "first_s": float(frame["started_at"].min() - wall_start),
            "overhead_per_trial_s": _overhead_per_trial(wall_s, concurrency, _inside_s(frame), trials)}


def _inside_s(trials: pd.DataFrame) -> float:
    """Σ seconds inside the trials, from the wall-clock times each stamps at its start and end."""
    return float((trials["ended_at"] - trials["started_at"]).sum())


def _overhead_per_trial(wall_s: float, concurrency: int, inside_s: float, trials: int) -> float:
    """What running on Ray adds to each trial: (wall × concurrency − Σ seconds inside the trials) / trials."""
    return (wall_s * concurrency - inside_s) / trials
