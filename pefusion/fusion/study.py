"""Study A as the sweep engine sees it: the `StudySweep` of a PE × fusion × seed grid (`pefusion_study`) or of a
learning-rate × batch-size search under a scheduler (`lr_batch_study`).

The study's wiring, above the engine and below the analysis: it says what its trials are; the command lines
(`pefusion.cli.fusion`) parse the flags into a preset, a search space and a plan, add the end-of-sweep summary the
analysis makes of the rows (Table 1, or a search's trials best first; the CSVs' paper form), and print it. The
trainable and the GPU probe (torch, Ray) are imported as a study is made, so that a search plan is checked before
they load.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable

from pefusion import record as R
from pefusion.data.cache import cache_root, tokenizer_files
from pefusion.data.config import SPLIT_PER_SEED, TOKENIZER_KEYS, DataConfig
from pefusion.data.corpus import load_corpus
from pefusion.data.encoded import EncodedCorpus
from pefusion.data.profile import assumed_profile
from pefusion.data.readers import DataError
from pefusion.fusion.config import Preset, flat_config, trial_data
from pefusion.sweep.console import counted
from pefusion.sweep.search import EARLY_STOPPING, Objective, SearchPlan, build, check
from pefusion.sweep.space import Choice, Constant, Grid, SearchSpace, SearchSpaceError, grid_size
from pefusion.sweep.study import StudySweep

# What PBT may mutate in a running trial: the trainer restores from its per-epoch checkpoint and then runs its new
# config's optimiser and batch settings; the model's shape and the data are fixed by the restored weights.
PERTURBABLE = ("lr", "weight_decay", "batch_size", "dropout", "label_smoothing", "grad_clip")


def pefusion_study(sweep: str, preset_name: str, preset: Preset, space: SearchSpace, cpus: float, *,
                   corpus: EncodedCorpus | None = None, trainable: Callable[..., None] | None = None,
                   describe: bool = False, **search: Any) -> StudySweep:
    """Study A as the engine sees it: trials of `space` over `preset` (by `trainable`, default
    `pefusion_trainable`), on `corpus` (default: the preset's data, loaded after validation). `search`:
    StudySweep's metric, mode, scheduler, search_alg, num_samples; a stopped trial's best validation accuracy is
    its `best_val_acc`."""
    from pefusion.fusion.probe import largest_trial_peak
    from pefusion.fusion.timing import plan_timer
    from pefusion.fusion.trainable import check_trial_config, pefusion_trainable, trial_run_name

    settings = corpus_settings(space, preset)

    def ship() -> dict[str, Any]:
        given = {preset.data.tokenizer_setting: corpus} if corpus is not None else {}
        return {"corpora": {key: given.get(key) or load_corpus(cfg) for key, cfg in settings.items()},
                "base": preset, "cpus": cpus, "length_edges": preset.data.length_edges}

    def plan_ship() -> dict[str, Any]:
        """`ship`, or where the data is a paper dataset not downloaded yet, its published profile's stand-in
        (`pefusion.data.profile`): the plan is then assumed, and says so."""
        try:
            return ship()
        except DataError as missing:
            profiles = {key: None if cfg.data_dir or cfg.synthetic else assumed_profile(cfg.dataset)
                        for key, cfg in settings.items()}
            if corpus is not None or None in profiles.values():
                raise
            reason = str(missing).split(";")[0]
            return {"corpora": {key: p.stand_in(settings[key].max_len, settings[key].max_vocab)
                                for key, p in profiles.items()},
                    "profiles": profiles, "missing": reason, "base": preset, "cpus": cpus,
                    "length_edges": preset.data.length_edges}

    def line(shipped: dict[str, Any]) -> str:
        corpora = shipped["corpora"]
        c = next(iter(corpora.values()))
        if describe and shipped.get("profiles"):
            p = next(iter(shipped["profiles"].values()))
            return (f"{counted(n_trials, 'trial')} on {p.name}, ASSUMED: no data here yet ({shipped['missing']}); "
                    f"{p.sizes[0]} train / {p.sizes[1]} validation / {p.sizes[2]} test documents and their lengths "
                    f"assumed: {p.assumed}; vocabulary assumed {c.vocab_size} (the preset's cap). Exact once the data "
                    f"is here: pefusion-data fetch, then --data-dir")
        vocab = (f"vocabulary {c.vocab_size}" if len(corpora) == 1 else "vocabularies "
                 + ", ".join(f"{v.vocab_size} ({key})" for key, v in corpora.items()))
        held = c.meta.get("source", {}).get("held_out")  # a folder without a validation file
        drawn = "" if not held else (f" (validation: {100 * held[1]:.0f} % of train held out, "
                                     + ("with seed 0, as the hub path does" if held[0] is None else "per seed")
                                     + ": the folder has no validation file)")
        return (f"{counted(n_trials, 'trial')} on {c.name}: {len(c.train)} train / {len(c.validation)} validation / "
                f"{len(c.test)} test documents{drawn}, {vocab}") if describe else ""

    def tokenizers(shipped: dict[str, Any]) -> dict[str, list[Path]]:
        return {f"{R.ARTIFACT_TOKENIZER_DIR}/{key}": tokenizer_files(cache_root(settings[key]) / c.cache_key)
                for key, c in shipped["corpora"].items()}

    n_trials = grid_size(space) * search.get("num_samples", 1)  # a search samples num_samples per grid point
    dataset = preset.data.source_name
    return StudySweep(
        sweep=sweep, preset=preset_name, experiment=R.PEFUSION_EXPERIMENT, space=space,
        trainable=trainable or pefusion_trainable, ship=ship,
        check_point=lambda point: check_trial_config(point, preset),
        static_params={R.DATASET: dataset, R.PRESET: preset_name, **flat_config(preset.model, preset.train),
                       **{k: getattr(preset.data, k) for k in (*TOKENIZER_KEYS, SPLIT_PER_SEED)}},
        identity={R.PE_TYPE: preset.model.pe_type, R.FUSION: preset.model.fusion, R.SEED: preset.train.seed,
                  R.DATASET: dataset},
        sort_keys=(R.PE_TYPE, R.FUSION, R.SEED, "lr", "batch_size"), run_name=trial_run_name,
        shown={R.TEST_ACC: lambda v: f"test {100 * v:.1f} %", R.VAL_ACC: lambda v: f"val {100 * v:.1f} %"},
        labels={"batch_size": "batch"}, best_metric=R.BEST_VAL_ACC, describe=line,
        planned_epochs=lambda config: int(config.get("max_epochs", preset.train.max_epochs)),
        may_end_early=lambda config: bool(config.get("early_stopping", preset.train.early_stopping)),
        results_file="results_by_seed",
        gpu_probe=functools.partial(largest_trial_peak, base=preset),
        resolved_keys=(R.DEVICE, R.PRECISION, R.PAD_MULTIPLE),
        stackable=None if search.get("metric") else R.SEED,  # a search judges each trial by one metric
        parent_files=tokenizers, timer=functools.partial(plan_timer, base=preset, cpus=cpus), plan_ship=plan_ship,
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


def lr_batch_study(preset_name: str, preset: Preset, space: SearchSpace, plan: SearchPlan, cpus: float) -> StudySweep:
    """A learning-rate × batch-size search over `space` under `plan`'s scheduler and search algorithm, each trial
    for at most `plan.max_t` epochs with ASHA-style schedulers the only early stopping (the paper's in-trial
    patience off, so that the epoch accounting is exact)."""
    preset = dataclasses.replace(preset, train=dataclasses.replace(preset.train, max_epochs=plan.max_t,
                                                                   early_stopping=False))
    objective = Objective(metric=R.OPTIMISED_METRIC, mode=R.OPTIMISED_MODE, time_attr=R.EPOCH, checkpoints=True,
                          perturbable=PERTURBABLE)
    check(plan, objective, space)
    study = pefusion_study("lr_batch_asha", preset_name, preset, space, cpus, describe=True,
                           **build(plan, objective, space))
    stops, early_stopping = plan.scheduler in EARLY_STOPPING, study.may_end_early  # ASHA, HyperBand stop trials
    return dataclasses.replace(study, may_end_early=lambda config: stops or early_stopping(config))

