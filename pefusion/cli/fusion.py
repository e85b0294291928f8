"""The PE-fusion study's command lines, the library half: `pefusion-grid` and `pefusion-search` (`sweeps/arxiv_grid.py`,
`sweeps/lr_batch_asha.py`) parse their flags in `cli/commands.py` and call `run_arxiv_grid` or `run_lr_batch_asha`
here, which wire study A into the sweep engine and print what the user reads at the end (Table 1, or the best
configuration and ASHA's epoch budget)."""
from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pefusion import record as R
from pefusion.cli.flags import search_plan, search_space_path, sweep_options
from pefusion.data.config import TOKENIZER_KEYS, DataConfig
from pefusion.data.encoded import EncodedCorpus
from pefusion.data.corpus import load_corpus
from pefusion.errors import ConfigError
from pefusion.fusion.config import (PRESETS, RULES, Preset, check_pe_fusion_pairs, flat_config, smoke_budget,
                                    trial_data)
from pefusion.sweep.console import counted
from pefusion.sweep.space import (Choice, Constant, Grid, SearchSpace, SearchSpaceError, grid_size,
                                  load_search_space)

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
            raise ConfigError(f"--data-dir {args.data_dir} is not a directory; it must hold train, validation and "
                              f"test files (JSONL, CSV or Parquet)")
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


def pefusion_study(sweep: str, preset_name: str, preset: Preset, space: SearchSpace, cpus: float, *,
                   corpus: EncodedCorpus | None = None, trainable: Callable[..., None] | None = None,
                   describe: bool = False, **search: Any) -> StudySweep:
    """Study A as the engine sees it: trials of `space` over `preset` (by `trainable`, default
    `pefusion_trainable`), on `corpus` (default: the preset's data, loaded after validation). `search`:
    StudySweep's metric, mode, scheduler, search_alg, num_samples; a stopped trial's best validation accuracy is
    its `best_val_acc`."""
    from pefusion.analysis.formats import csv_ready
    from pefusion.fusion.probe import largest_trial_peak
    from pefusion.fusion.trainable import check_trial_config, pefusion_trainable, trial_run_name
    from pefusion.sweep.study import StudySweep

    settings = corpus_settings(space, preset)

    def ship() -> dict[str, Any]:
        given = {preset.data.tokenizer_setting: corpus} if corpus is not None else {}
        return {"corpora": {key: given.get(key) or load_corpus(cfg) for key, cfg in settings.items()},
                "base": preset, "cpus": cpus, "length_edges": preset.data.length_edges}

    def line(shipped: dict[str, Any]) -> str:
        corpora = shipped["corpora"]
        c = next(iter(corpora.values()))
        vocab = (f"vocabulary {c.vocab_size}" if len(corpora) == 1 else "vocabularies "
                 + ", ".join(f"{v.vocab_size} ({key})" for key, v in corpora.items()))
        return (f"{counted(n_trials, 'trial')} on {c.name}: {len(c.train)} train / {len(c.validation)} validation / "
                f"{len(c.test)} test documents, {vocab}") if describe else ""

    n_trials = grid_size(space) * search.get("num_samples", 1)  # a search samples num_samples per grid point
    dataset = preset.data.source_name
    return StudySweep(
        sweep=sweep, preset=preset_name, experiment=R.PEFUSION_EXPERIMENT, space=space,
        trainable=trainable or pefusion_trainable, ship=ship, csv=csv_ready,
        check_point=lambda point: check_trial_config(point, preset),
        static_params={R.DATASET: dataset, **flat_config(preset.model, preset.train),
                       **{k: getattr(preset.data, k) for k in TOKENIZER_KEYS}},
        identity={R.PE_TYPE: preset.model.pe_type, R.FUSION: preset.model.fusion, R.SEED: preset.train.seed,
                  R.DATASET: dataset},
        sort_keys=(R.PE_TYPE, R.FUSION, R.SEED, "lr", "batch_size"), run_name=trial_run_name,
        shown={R.TEST_ACC: lambda v: f"test {100 * v:.1f} %", R.VAL_ACC: lambda v: f"val {100 * v:.1f} %"},
        labels={"batch_size": "batch"}, best_metric=R.BEST_VAL_ACC, describe=line,
        planned_epochs=lambda config: int(config.get("max_epochs", preset.train.max_epochs)),
        may_end_early=lambda config: bool(config.get("early_stopping", preset.train.early_stopping)),
        results_file="results_by_seed", tables=lambda rows: {"results_aggregated": aggregate_rows(rows)},
        gpu_probe=functools.partial(largest_trial_peak, base=preset),
        resolved_keys=(R.DEVICE, R.PRECISION, R.PAD_MULTIPLE),
        stackable=None if search.get("metric") else R.SEED,  # a search judges each trial by one metric
        **search)


def corpus_settings(space: SearchSpace, preset: Preset) -> dict[str, DataConfig]:
    """The data config of each distinct tokeniser setting the space's trials can have, by
    DataConfig.tokenizer_setting: each is one corpus, tokenised before Ray starts."""
    for key in TOKENIZER_KEYS:
        if key in space and not isinstance(space[key], (Grid, Choice, Constant)):
            raise SearchSpaceError(f"{space.source}: {key}: each value is a corpus tokenised before the sweep starts, "
                                   f"so it takes a constant, grid or choice, not a range")
    configs: dict[str, DataConfig] = {}
    for point in space.points():
        cfg = trial_data(point, preset)
        configs.setdefault(cfg.tokenizer_setting, cfg)
    return configs


def _load_space(args: argparse.Namespace, preset: Preset) -> SearchSpace:
    space = load_search_space(search_space_path(args), RULES)
    for key, flag in ((R.PE_TYPE, "--pe-types"), (R.FUSION, "--fusions"), (R.SEED, "--seeds")):
        values = getattr(args, flag[2:].replace("-", "_"), None)
        if values:
            space = space.override_values(key, values, flag)
    check_pe_fusion_pairs(space, preset.model)
    return space


def run_arxiv_grid(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """The PE × fusion × seed grid: every trial to its own early stop, then Table 1."""
    preset = resolve_preset(args)
    space = _load_space(args, preset)
    study = pefusion_study("arxiv_grid", args.preset, preset, space, args.cpus_per_trial, describe=True)
    from pefusion.sweep.driver import run_sweep

    result = run_sweep(study, sweep_options(args, "arxiv_grid", argv), args.out)
    print(summary_table(result.rows))
    print(f"results: {', '.join(map(str, result.paths))}\nRay experiment: {result.experiment_path}")
    return 0


def run_lr_batch_asha(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """A learning-rate × batch-size search under a scheduler (ASHA by default) with a search algorithm (random by
    default), both by name (`pefusion.sweep.search`)."""
    from pefusion.sweep.search import EARLY_STOPPING, Objective, build, check

    preset = resolve_preset(args)
    if args.max_t is not None and args.max_t < 1:
        raise ConfigError(f"--max-t={args.max_t} must be >= 1")
    max_t = args.max_t or preset.train.max_epochs
    plan = search_plan(args, max_t)
    preset = dataclasses.replace(preset, train=dataclasses.replace(preset.train, max_epochs=max_t,
                                                                   early_stopping=False))
    space = _load_space(args, preset)
    # The trainer restores from its per-epoch checkpoint and then runs its new config's optimiser and batch
    # settings (PBT mutates them); the model's shape and the data are fixed by the restored weights.
    objective = Objective(metric=R.OPTIMISED_METRIC, mode=R.OPTIMISED_MODE, time_attr=R.EPOCH, checkpoints=True,
                          perturbable=("lr", "weight_decay", "batch_size", "dropout", "label_smoothing",
                                       "grad_clip"))
    check(plan, objective, space)

    from pefusion.analysis.search import budget_summary

    study = pefusion_study("lr_batch_asha", args.preset, preset, space, args.cpus_per_trial, describe=True,
                           **build(plan, objective, space))
    stops, early_stopping = args.scheduler in EARLY_STOPPING, study.may_end_early  # ASHA, HyperBand stop trials
    study = dataclasses.replace(study, parent_metrics=lambda rows: budget_summary(rows, max_t),
                                may_end_early=lambda config: stops or early_stopping(config))
    options = sweep_options(args, "lr_batch_asha", argv)
    options.tags[R.TAG_SCHEDULER] = args.scheduler  # the report names who spent the epoch budget
    from pefusion.sweep.driver import run_sweep

    result = run_sweep(study, options, args.out)

    rows, summary = result.rows, budget_summary(result.rows, max_t)
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


# ---------------------------------------------------------------------------------------------------------
# What a finished sweep prints and writes besides its rows
# ---------------------------------------------------------------------------------------------------------


def _as_trial_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """The sweep's rows in the shape `pefusion.analysis` reads from MLflow (one implementation of the tables)."""
    from pefusion.analysis.runs import RUN_ID, START_TIME

    return rows.assign(**{RUN_ID: rows["trial_id"].astype(str),
                          START_TIME: rows["started_at"] if "started_at" in rows else 0.0})


def aggregate_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Table 1 of the sweep (accuracies in %), or for a search the trials best first."""
    from pefusion.analysis.fusion_tables import table1
    from pefusion.analysis.search import search_table

    frame = _as_trial_frame(rows)
    if (frame[R.STATUS] == R.STATUS_OK).any() and frame[[R.PE_TYPE, R.FUSION]].drop_duplicates().shape[0] > 1:
        return table1(frame)
    return search_table(frame)


def summary_table(rows: pd.DataFrame) -> str:
    """Table 1 as text, then every failed trial with its reason."""
    from pefusion.analysis.fusion_tables import table1, table1_display
    from pefusion.fusion.trainable import trial_run_name

    frame = _as_trial_frame(rows)
    n_failed = int((~rows[R.STATUS].isin(R.SUCCESS_STATUSES)).sum())
    lines = []
    if (frame[R.STATUS] == R.STATUS_OK).any():
        lines.append(table1_display(table1(frame)).to_string(index=False))
    lines.append(f"{counted(len(rows), 'trial')}, {len(rows) - n_failed} ok, {n_failed} failed")
    for _, r in rows[~rows[R.STATUS].isin(R.SUCCESS_STATUSES)].iterrows():
        lines.append(f"  failed: {trial_run_name(r.to_dict())} [{r[R.STATUS]}] {r.get(R.ERROR, '')}")
    return "\n".join(lines)
