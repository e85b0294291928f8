"""Learning-rate × batch-size search for one PE-fusion model, with ASHA early stopping over epochs.

    python sweeps/lr_batch_asha.py --preset demo                    # random search, 16 samples, ASHA
    python sweeps/lr_batch_asha.py --preset demo --search optuna    # Optuna TPE with a fixed sampler seed
    python sweeps/lr_batch_asha.py --preset demo --scheduler fifo   # same samples, full budget (the reference)

The optimised metric is `pefusion.record.OPTIMISED_METRIC` (validation accuracy, maximised), set once in
TuneConfig and used by both ASHA and Optuna. ASHA is the only early stopping here (the paper's in-trial patience
is switched off) so that the epoch accounting is exact.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Sequence

from pefusion import record as R
from pefusion.cli.flags import (add_data_flags, add_preset_flag, add_sweep_flags, resolve_preset, run_main,
                                search_space_path, sweep_options)
from pefusion.errors import ConfigError
from pefusion.sweep.space import PEFUSION_RULES, check_pe_fusion_pairs, load_search_space, require_no_grid, to_tune
from pefusion.data.corpus import load_corpus
from pefusion.sweep.tracking import PEFUSION_EXPERIMENT


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_flag(parser, default="arxiv")
    parser.add_argument("--search", choices=("random", "optuna"), default="random",
                        help="search algorithm (default: random)")
    parser.add_argument("--scheduler", choices=("asha", "fifo"), default="asha",
                        help="asha: early stopping over epochs; fifo: every sample runs --max-t epochs")
    parser.add_argument("--num-samples", type=int, default=16, help="configurations to try (default: 16)")
    parser.add_argument("--max-t", type=int, default=None, help="maximum epochs per trial (default: the preset's)")
    parser.add_argument("--grace-period", type=int, default=1, help="ASHA: epochs before a trial can be stopped")
    parser.add_argument("--reduction-factor", type=float, default=3.0, help="ASHA: keep 1/η of trials per rung")
    parser.add_argument("--sampler-seed", type=int, default=0, help="Optuna TPE sampler seed (default: 0)")
    add_data_flags(parser)
    add_sweep_flags(parser, experiment=PEFUSION_EXPERIMENT, search_space="lr_batch.yaml")
    args = parser.parse_args(argv)
    if args.num_samples < 1:
        raise ConfigError(f"--num-samples={args.num_samples} must be >= 1")
    if args.grace_period < 1 or args.reduction_factor <= 1:
        raise ConfigError("--grace-period must be >= 1 and --reduction-factor > 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    preset = resolve_preset(args)
    max_t = args.max_t or preset.train.max_epochs
    if args.max_t is not None and args.max_t < 1:
        raise ConfigError(f"--max-t={args.max_t} must be >= 1")
    preset = dataclasses.replace(preset, train=dataclasses.replace(preset.train, max_epochs=max_t,
                                                                   early_stopping=False))
    space = load_search_space(search_space_path(args), PEFUSION_RULES)
    check_pe_fusion_pairs(space, preset.model)
    if args.search == "optuna":
        require_no_grid(space, "Optuna samples its own points")

    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from pefusion.fusion.trainable import budget_summary, run_pefusion_sweep, validate_trial_configs, write_results

    validate_trial_configs(space, preset)
    opts = sweep_options(args, "lr_batch_asha", argv)
    corpus = load_corpus(preset.data)
    # ASHA stops any trial whose report reaches max_t; one epoch of headroom lets a trial that trained the whole
    # budget deliver its final (test) record, which follows its last epoch report.
    scheduler = (ASHAScheduler(time_attr=R.EPOCH, max_t=max_t + 1, grace_period=min(args.grace_period, max_t),
                               reduction_factor=args.reduction_factor)
                 if args.scheduler == "asha" else FIFOScheduler())
    search_alg = None
    if args.search == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch(sampler=optuna.samplers.TPESampler(seed=args.sampler_seed))
    rows, recorder, exp_path = run_pefusion_sweep(
        corpus, preset, args.preset, to_tune(space), opts, metric=R.OPTIMISED_METRIC, mode=R.OPTIMISED_MODE,
        scheduler=scheduler, search_alg=search_alg, num_samples=args.num_samples)

    name = exp_path.rstrip("/").split("/")[-1]
    paths = write_results(rows, name, args.out)
    recorder.log_parent_artifacts(paths)
    summary = budget_summary(rows, max_t)
    recorder.finish_sweep(summary)
    ok = rows[rows[R.STATUS].isin(R.SUCCESS_STATUSES)].dropna(subset=[R.VAL_ACC])
    if len(ok):
        best = ok.loc[ok[R.VAL_ACC].idxmax()]
        keys = [k for k in space if k in rows.columns]
        print("best configuration: " + ", ".join(f"{k}={best[k]}" for k in keys)
              + f"  ({R.VAL_ACC}={best[R.VAL_ACC]:.4f}, {int(best[R.EPOCHS_RUN])} epochs)")
    print(f"epochs trained: {summary['epochs_trained']:.0f} of {summary['epochs_full_budget']:.0f} without early "
          f"stopping ({100 * summary['budget_fraction']:.1f}%); {summary['n_stopped']:.0f} trials stopped by ASHA, "
          f"{summary['n_failed']:.0f} failed")
    print(f"results: {', '.join(map(str, paths))}\nRay experiment: {exp_path}")
    return 0


if __name__ == "__main__":
    run_main(main)
