"""The PE-fusion study on Ray Tune: the trainable and the two sweeps (the PE × fusion × seed grid, the lr × batch ASHA).

The trainable follows Ray Tune's own examples: build (model from the trial config), restore
(`tune.get_checkpoint()`), step (one epoch), report (`tune.report(metrics, checkpoint=...)`), and a final report
carrying the SPEC §3 record. The tokenised corpus arrives once per node through the object store
(`tune.with_parameters`), never re-read per trial.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch
from ray import tune

from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.fusion.config import ModelConfig, Preset, flat_config, split_trial_config
from pefusion.fusion.model import build_model_from_config
from pefusion.sweep.space import Choice, Constant, Grid, RandInt, SearchSpace
from pefusion.data.corpus import EncodedCorpus
from pefusion.fusion.training import Diverged, Trainer
from pefusion.sweep.driver import SweepOptions, result_rows, run_tune

TRAINER_STATE = "trainer.pt"
FINAL_RECORD = "record.json"
MODEL_WEIGHTS = "model.pt"
MODEL_CONFIG = "model_config.json"
# Columns of the by-seed CSV that vary between identical runs (left out when comparing two sweeps).
TIMING_COLUMNS = (R.LAT_MS_MEAN, R.LAT_MS_STD, R.TRAIN_TIME_S, "trial_id", "visible_devices", "started_at",
                  "ended_at")


def _report_with_files(metrics: dict[str, Any], files: Callable[[Path], None]) -> None:
    """tune.report with a checkpoint directory that `files` fills."""
    with tempfile.TemporaryDirectory() as tmp:
        files(Path(tmp))
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def _write_final(folder: Path, trainer: Trainer, record: dict[str, Any]) -> None:
    """The best model (weights_only-loadable state_dict + config JSON), the bucket accuracies and the record."""
    (folder / R.ARTIFACT_CHECKPOINT_DIR).mkdir()
    torch.save(trainer.model.state_dict(), folder / R.ARTIFACT_CHECKPOINT_DIR / MODEL_WEIGHTS)
    (folder / R.ARTIFACT_CHECKPOINT_DIR / MODEL_CONFIG).write_text(json.dumps(trainer.best_model_config(), indent=1))
    buckets = {k: v for k, v in record.items() if k.startswith((R.LENGTH_METRIC_PREFIX, R.LENGTH_COUNT_PREFIX))}
    (folder / R.ARTIFACT_LENGTH_BUCKETS).write_text(json.dumps(buckets, indent=1))
    (folder / FINAL_RECORD).write_text(json.dumps(record, indent=1))


def load_checkpoint(folder: str | Path) -> torch.nn.Module:
    """Rebuild a saved best model from its checkpoint folder (`model.pt` + `model_config.json`), in eval mode."""
    folder = Path(folder)
    cfg = json.loads((folder / MODEL_CONFIG).read_text())
    model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
    model = build_model_from_config(ModelConfig(**{k: v for k, v in cfg.items() if k in model_keys}),
                                    cfg["vocab_size"], cfg["num_classes"])
    model.load_state_dict(torch.load(folder / MODEL_WEIGHTS, weights_only=True, map_location="cpu"))
    return model.eval()


def pefusion_trainable(config: dict[str, Any], *, corpus: EncodedCorpus, base: Preset, cpus: float,
                       length_edges: tuple[int, ...]) -> None:
    """One PE-fusion trial under Tune: per-epoch reports with a resumable checkpoint, then the final record."""
    torch.set_num_threads(max(1, int(cpus)))
    started = time.time()
    model_cfg, train_cfg = split_trial_config(config, base)
    trainer = Trainer(model_cfg, train_cfg, corpus)
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            if (Path(folder) / FINAL_RECORD).exists():  # finished before the driver died: report, don't rerun
                tune.report(json.loads((Path(folder) / FINAL_RECORD).read_text()))
                return
            trainer.load_state_dict(torch.load(Path(folder) / TRAINER_STATE, weights_only=False))

    while not trainer.finished:
        try:
            metrics = trainer.train_epoch()
        except Diverged as exc:
            tune.report({**trainer.failure_record(R.STATUS_DIVERGED, str(exc)), R.VAL_ACC: float("nan")})
            return
        _report_with_files(metrics, lambda folder: torch.save(trainer.state_dict(), folder / TRAINER_STATE))

    final = trainer.final_record(length_edges)
    final.update(visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""), device=str(trainer.device),
                 started_at=started, ended_at=time.time(), **{R.EPOCH: trainer.epoch})
    _report_with_files(final, lambda folder: _write_final(folder, trainer, final))


def trial_run_name(config: dict[str, Any]) -> str:
    return f"{config.get(R.PE_TYPE, '?')}-{config.get(R.FUSION, '?')}-s{config.get(R.SEED, '?')}"


def run_pefusion_sweep(corpus: EncodedCorpus, base: Preset, preset_name: str, param_space: dict[str, Any],
                       opts: SweepOptions, *, trainable: Callable = pefusion_trainable, **tune_kwargs: Any):
    """Run the trials of `param_space` on `corpus`; returns (rows DataFrame, recorder, experiment path)."""
    fn = tune.with_parameters(trainable, corpus=corpus, base=base, cpus=opts.cpus_per_trial,
                              length_edges=base.data.length_edges)
    results, recorder, exp_path, _ = run_tune(
        fn, param_space, opts, preset=preset_name,
        static_params={R.DATASET: corpus.name, **flat_config(base.model, base.train)},
        run_name=trial_run_name, **tune_kwargs)
    rows = pd.DataFrame(result_rows(results))
    fixed = {R.PE_TYPE: base.model.pe_type, R.FUSION: base.model.fusion, R.SEED: base.train.seed,
             R.DATASET: corpus.name}
    for key, value in fixed.items():  # identity of trials whose axis the space did not vary (or that failed)
        rows[key] = rows[key].fillna(value) if key in rows else value
    sort_keys = [k for k in (R.PE_TYPE, R.FUSION, R.SEED, "lr", "batch_size") if k in rows.columns]
    rows = rows.sort_values(sort_keys, kind="stable").reset_index(drop=True)
    return rows, recorder, exp_path


# ---------------------------------------------------------------------------------------------------------
# Before Ray: every trial config must build; after Ray: CSVs and a compact table
# ---------------------------------------------------------------------------------------------------------


def validate_trial_configs(space: SearchSpace, base: Preset) -> int:
    """Build the ModelConfig/TrainConfig of every grid point (ranges at both ends), so that a bad combination
    fails in one line before Ray starts. Returns the number of combinations checked."""
    axes = []
    for key, dim in space.items():
        if isinstance(dim, (Grid, Choice)):
            axes.append([(key, v) for v in dim.values])
        elif isinstance(dim, Constant):
            axes.append([(key, dim.value)])
        else:  # Uniform / LogUniform / RandInt: both ends
            hi = dim.hi - 1 if isinstance(dim, RandInt) else dim.hi
            axes.append([(key, dim.lo), (key, hi)])
    n = 0
    for combo in itertools.product(*axes):
        model_cfg, _ = split_trial_config(dict(combo), base)
        if base.data.max_len > model_cfg.max_len:
            raise ConfigError(f"max_len={model_cfg.max_len} is shorter than the data's {base.data.max_len} "
                              f"tokens per document: raise max_len or pass --max-len {model_cfg.max_len}")
        n += 1
    return n


def _as_trial_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """The sweep's rows in the shape `pefusion.analysis` reads from MLflow (one implementation of the tables)."""
    from pefusion.analysis.runs import RUN_ID, START_TIME

    return rows.assign(**{RUN_ID: rows["trial_id"].astype(str),
                          START_TIME: rows["started_at"] if "started_at" in rows else 0.0})


def aggregate_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Table 1 of the sweep (accuracies in %), or for a search the trials best first."""
    from pefusion.analysis.fusion_tables import search_table, table1

    frame = _as_trial_frame(rows)
    if (frame[R.STATUS] == R.STATUS_OK).any() and frame[[R.PE_TYPE, R.FUSION]].drop_duplicates().shape[0] > 1:
        return table1(frame)
    return search_table(frame)


def write_results(rows: pd.DataFrame, name: str, out_dir: str | Path) -> list[Path]:
    """`<name>_results_by_seed.csv` (every trial, failed ones with their error; raw fractions) and
    `<name>_results_aggregated.csv` (Table 1 in %, or the search's trials best first)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_seed, agg = out / f"{name}_results_by_seed.csv", out / f"{name}_results_aggregated.csv"
    rows.to_csv(by_seed, index=False)
    aggregate_rows(rows).to_csv(agg, index=False)
    return [by_seed, agg]


def summary_table(rows: pd.DataFrame) -> str:
    """Table 1 as text, then every failed trial with its reason."""
    from pefusion.analysis.fusion_tables import table1, table1_display

    frame = _as_trial_frame(rows)
    n_failed = int((~rows[R.STATUS].isin(R.SUCCESS_STATUSES)).sum())
    lines = []
    if (frame[R.STATUS] == R.STATUS_OK).any():
        lines.append(table1_display(table1(frame)).to_string(index=False))
    lines.append(f"{len(rows)} trials, {len(rows) - n_failed} ok, {n_failed} failed")
    for _, r in rows[~rows[R.STATUS].isin(R.SUCCESS_STATUSES)].iterrows():
        lines.append(f"  failed: {trial_run_name(r.to_dict())} [{r[R.STATUS]}] {r.get(R.ERROR, '')}")
    return "\n".join(lines)


def budget_summary(rows: pd.DataFrame, max_t: int) -> dict[str, float]:
    """Epochs actually trained against the epochs of the same samples run to max_t."""
    trained = float(rows[R.EPOCHS_RUN].fillna(0).sum())
    full = float(len(rows) * max_t)
    return {"epochs_trained": trained, "epochs_full_budget": full, "budget_fraction": trained / full if full else 0.0,
            "n_stopped": float((rows[R.STATUS] == R.STATUS_STOPPED).sum()),
            "n_failed": float((~rows[R.STATUS].isin(R.SUCCESS_STATUSES)).sum()),
            "best_val_acc": float(rows[R.VAL_ACC].max()) if R.VAL_ACC in rows and rows[R.VAL_ACC].notna().any()
            else float("nan")}
