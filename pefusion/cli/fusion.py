"""The PE-fusion study's command lines, the library half: `pefusion-grid` and `pefusion-search` (`sweeps/arxiv_grid.py`,
`sweeps/lr_batch_asha.py`) parse their flags in `cli/commands.py` and call `run_arxiv_grid` or `run_lr_batch_asha`
here, which turn the flags into a preset and a search space, hand study A's sweep (`pefusion.fusion.study`) to the
engine with the end-of-sweep summary the analysis makes of its rows (`summarised`), and print what the user reads at
the end (Table 1, or the best configuration and ASHA's epoch budget)."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from pefusion import record as R
from pefusion.cli.flags import search_plan
from pefusion.errors import ConfigError
from pefusion.fusion.config import PRESETS, RULES, Preset, check_pe_fusion_pairs, smoke_budget
from pefusion.sweep.console import counted
from pefusion.sweep.options import SweepOptions
from pefusion.sweep.space import SearchSpace, Stack, load_search_space

if TYPE_CHECKING:  # torch and Ray load when a sweep runs, after its inputs are checked (`--help` needs neither)
    import pandas as pd

    from pefusion.sweep.study import StudySweep


def resolve_preset(args: argparse.Namespace) -> Preset:
    """The preset, shrunk by --smoke, then the command line's data, length and epoch flags (validated)."""
    preset = PRESETS[args.preset]
    data_over: dict = {}
    if args.synthetic or args.synthetic_task:
        data_over["synthetic"] = True
    if args.synthetic_task:
        if args.data_dir or args.dataset:
            raise ConfigError("--synthetic-task picks a bundled synthetic corpus: drop it, or drop --data-dir/--dataset")
        data_over["synthetic_task"] = args.synthetic_task
    if args.data_dir:
        if not Path(args.data_dir).is_dir():
            raise ConfigError(f"--data-dir {args.data_dir} is not a directory; it must hold train and test files "
                              f"(JSONL, CSV or Parquet), and a validation file or 10 % of train is held out "
                              f"(`pefusion-data fetch` makes one)")
        data_over.update(data_dir=args.data_dir, synthetic=False)
    if args.dataset:
        data_over.update(dataset=args.dataset, dataset_config=args.dataset_config, data_dir=None, synthetic=False)
    elif args.dataset_config:
        data_over["dataset_config"] = args.dataset_config
    for key in ("text_column", "label_column", "cache_dir"):
        if getattr(args, key):
            data_over[key] = getattr(args, key)
    preset = dataclasses.replace(preset, data=dataclasses.replace(preset.data, **data_over))
    if args.smoke:
        preset = smoke_budget(preset)
    model, train, data = preset.model, preset.train, preset.data
    if args.max_len:
        data = dataclasses.replace(data, max_len=args.max_len)
        model = dataclasses.replace(model, max_len=args.max_len)
    if getattr(args, "epochs", None):
        train = dataclasses.replace(train, max_epochs=args.epochs)
    return dataclasses.replace(preset, model=model, train=train, data=data)


def _load_space(args: argparse.Namespace, opts: SweepOptions, preset: Preset) -> SearchSpace:
    space = load_search_space(opts.search_space, RULES)
    for key, flag in ((R.PE_TYPE, "--pe-types"), (R.FUSION, "--fusions"), (R.SEED, "--seeds")):
        values = getattr(args, flag[2:].replace("-", "_"), None)
        if values:
            space = space.override_values(key, values, flag)
    check_pe_fusion_pairs(space, preset.model)
    return space


def run_arxiv_grid(args: argparse.Namespace, opts: SweepOptions) -> int:
    """The PE × fusion × seed grid: every trial to its own early stop, then Table 1."""
    preset = resolve_preset(args)
    space = _load_space(args, opts, preset)
    if preset.data.split_per_seed and (opts.stack or isinstance(space.get(R.SEED), Stack)):
        raise ConfigError(f"--preset {args.preset} draws each seed's own train/validation split and vocabulary, so "
                          f"its seeds share no data to train as one batched model: drop --stack-seeds (and any "
                          f"'stack' of seed in the search space)")
    from pefusion.fusion.study import pefusion_study
    from pefusion.sweep.driver import run_settled
    from pefusion.sweep.settle import settle

    study = pefusion_study("arxiv_grid", args.preset, preset, space, opts.cpus_per_trial, describe=True)
    settled = settle(summarised(study), opts)  # with --plan: the plan printed, and nothing run
    if opts.plan:
        return 0
    result = run_settled(settled, args.out)
    print(summary_table(result.rows))
    print(f"results: {', '.join(map(str, result.paths))}\nRay experiment: {result.experiment_path}")
    return 0


def run_lr_batch_asha(args: argparse.Namespace, opts: SweepOptions) -> int:
    """A learning-rate × batch-size search under a scheduler (ASHA by default) with a search algorithm (random by
    default), both by name (`pefusion.sweep.search`)."""
    preset = resolve_preset(args)
    if args.max_t is not None and args.max_t < 1:
        raise ConfigError(f"--max-t={args.max_t} must be >= 1")
    plan = search_plan(args, args.max_t or preset.train.max_epochs)
    space = _load_space(args, opts, preset)
    from pefusion.analysis.search import budget_summary
    from pefusion.fusion.study import lr_batch_study
    from pefusion.sweep.driver import run_settled
    from pefusion.sweep.settle import settle

    study = lr_batch_study(args.preset, preset, space, plan, opts.cpus_per_trial)
    opts.tags[R.TAG_SCHEDULER] = args.scheduler  # the report names who spent the epoch budget
    settled = settle(summarised(study, max_t=plan.max_t), opts)  # with --plan: the plan printed, and nothing run
    if opts.plan:
        return 0
    result = run_settled(settled, args.out)

    rows, summary = result.rows, budget_summary(result.rows, plan.max_t)
    ok = rows[rows[R.STATUS].isin(R.SUCCESS_STATUSES)].dropna(subset=[R.VAL_ACC])
    if len(ok):
        best = ok.loc[ok[R.VAL_ACC].idxmax()]
        keys = [k for k in space if k in rows.columns]
        print("best configuration: " + ", ".join(f"{k}={best[k]}" for k in keys)
              + f"  ({R.VAL_ACC}={best[R.VAL_ACC]:.4f}, {int(best[R.EPOCHS_RUN])} epochs)")
    stopper = "HyperBand" if args.scheduler == "hyperband" else "ASHA"  # fifo and pbt stop none: the line stays
    print(f"epochs trained: {summary[R.EPOCHS_TRAINED]:.0f} of {summary[R.EPOCHS_FULL_BUDGET]:.0f} without early "
          f"stopping ({100 * summary[R.BUDGET_FRACTION]:.1f}%); {counted(int(summary[R.N_STOPPED]), 'trial')} "
          f"stopped by {stopper}, {summary['n_failed']:.0f} failed")
    print(f"results: {', '.join(map(str, result.paths))}\nRay experiment: {result.experiment_path}")
    return 0


def summary_table(rows: pd.DataFrame) -> str:
    """Table 1 as text, then every failed trial with its reason."""
    from pefusion.analysis.fusion_tables import table1, table1_display
    from pefusion.fusion.trainable import trial_run_name

    frame = as_trial_frame(rows)
    n_failed = int((~rows[R.STATUS].isin(R.SUCCESS_STATUSES)).sum())
    lines = []
    if (frame[R.STATUS] == R.STATUS_OK).any():
        lines.append(table1_display(table1(frame)).to_string(index=False))
    lines.append(f"{counted(len(rows), 'trial')}, {len(rows) - n_failed} ok, {n_failed} failed")
    for _, r in rows[~rows[R.STATUS].isin(R.SUCCESS_STATUSES)].iterrows():
        lines.append(f"  failed: {trial_run_name(r.to_dict())} [{r[R.STATUS]}] {r.get(R.ERROR, '')}")
    return "\n".join(lines)


def summarised(study: StudySweep, max_t: int | None = None) -> StudySweep:
    """`study` with the end-of-sweep summary the command writes: every CSV in its paper form (units in the headers,
    rounding), the sweep's Table 1 (or a search's trials best first) as `results_aggregated`, and for a search
    whose trials train at most `max_t` epochs, the epoch budget's summary on the parent run."""
    from pefusion.analysis.formats import csv_ready
    from pefusion.analysis.search import budget_summary

    budget = {"parent_metrics": lambda rows: budget_summary(rows, max_t)} if max_t else {}
    return dataclasses.replace(study, csv=csv_ready, tables=lambda rows: {"results_aggregated": aggregate_rows(rows)},
                               **budget)


def as_trial_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """The sweep's rows in the shape `pefusion.analysis` reads from MLflow (one implementation of the tables)."""
    from pefusion.analysis.runs import RUN_ID, START_TIME

    return rows.assign(**{RUN_ID: rows["trial_id"].astype(str),
                          START_TIME: rows["started_at"] if "started_at" in rows else 0.0})


def aggregate_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Table 1 of the sweep (accuracies in %), or for a search the trials best first."""
    from pefusion.analysis.fusion_tables import table1
    from pefusion.analysis.search import search_table

    frame = as_trial_frame(rows)
    if (frame[R.STATUS] == R.STATUS_OK).any() and frame[[R.PE_TYPE, R.FUSION]].drop_duplicates().shape[0] > 1:
        return table1(frame)
    return search_table(frame)
