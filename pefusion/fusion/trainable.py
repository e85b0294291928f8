"""The PE-fusion study's Ray Tune trainable, the files of its checkpoints, and the check every trial config passes.

The trainable follows Ray Tune's own examples: build (model from the trial config), restore (`tune.get_checkpoint()`),
step (one epoch), report (`tune.report(metrics, checkpoint=...)`), and a final report carrying the trial's record
(docs/operations.md). The tokenised corpora, one per distinct tokeniser setting of the search space, arrive once per
node through the object store (`tune.with_parameters`), never re-read per trial; their arrays are read in place from
shared memory, so a trial touches only the corpus of its own setting.
"""
from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

import ray
import torch
from ray import tune

from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.fusion.config import Preset, split_trial_config, trial_data
from pefusion.fusion.model import MODEL_CONFIG, MODEL_WEIGHTS
from pefusion.data.encoded import EncodedCorpus
from pefusion.fusion.stacked import StackedTrainer
from pefusion.fusion.training import Trainer, train_and_evaluate

TRAINER_STATE = "trainer.pt"
FINAL_RECORD = "record.json"


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


def pefusion_trainable(config: dict[str, Any], *, corpora: Mapping[str, EncodedCorpus], base: Preset, cpus: float,
                       length_edges: tuple[int, ...]) -> None:
    """One PE-fusion trial under Tune: per-epoch reports with a resumable checkpoint, then the final record.
    `corpora`: the encoded corpus of each tokeniser setting (DataConfig.tokenizer_setting) the space uses. A
    config whose seed is a list (a stacked space) trains those seeds together (`stacked_trial`)."""
    torch.set_num_threads(max(1, int(cpus)))
    if isinstance(config.get(R.SEED), list):
        return stacked_trial(config, corpora=corpora, base=base, length_edges=length_edges)
    model_cfg, train_cfg = split_trial_config(config, base)
    trainer = Trainer(model_cfg, train_cfg, corpora[trial_data(config, base).tokenizer_setting])
    about = _about(trainer)
    if _finished_or_restored(trainer):
        return

    def report_epoch(metrics: dict[str, Any], trainer: Trainer) -> None:
        phase = {R.PHASE: R.PHASE_TESTING} if trainer.finished else {}
        _report_with_files({**metrics, **about, **phase},
                           lambda folder: torch.save(trainer.state_dict(), folder / TRAINER_STATE))

    final = train_and_evaluate(model_cfg, train_cfg, trainer.corpus, length_edges=length_edges,
                               on_epoch=report_epoch, trainer=trainer)
    if final[R.STATUS] == R.STATUS_DIVERGED:  # the optimised metric too, as a search needs it in every result
        tune.report({**final, **about, R.VAL_ACC: float("nan")})
        return
    final.update({R.EPOCH: trainer.epoch}, **about)
    _report_with_files(final, lambda folder: _write_final(folder, trainer, final))


def stacked_trial(config: dict[str, Any], *, corpora: Mapping[str, EncodedCorpus], base: Preset,
                  length_edges: tuple[int, ...]) -> None:
    """The seeds of `config[seed]` trained together (`pefusion.fusion.stacked`), one run each: every report
    carries each seed's part under `record.RUNS` (an epoch: the seeds still training; the end: every seed's
    record), the checkpoint holds them all, and the final one a folder per seed with its best model."""
    seeds = [int(s) for s in config[R.SEED]]
    model_cfg, train_cfg = split_trial_config({**config, R.SEED: seeds[0]}, base)
    stacked = StackedTrainer(model_cfg, train_cfg, corpora[trial_data(config, base).tokenizer_setting], seeds)
    about = {seed: _about(trainer, runs=len(seeds)) for seed, trainer in stacked.trainers.items()}
    node = about[seeds[0]][R.NODE]
    if _finished_or_restored(stacked):
        return
    while not stacked.finished:
        metrics = stacked.train_epoch()
        epoch = max(t.epoch for t in stacked.trainers.values())
        runs = {str(seed): {**m, R.TRIAL_INFO: about[seed][R.TRIAL_INFO]} for seed, m in metrics.items()}
        phase = {R.PHASE: R.PHASE_TESTING} if stacked.finished else {}
        _report_with_files({R.EPOCH: epoch, R.NODE: node, R.RUNS: runs, **phase},
                           lambda folder: torch.save(stacked.state_dict(), folder / TRAINER_STATE))
    records = stacked.final_records(length_edges)
    # Every run's clock is the trial's (its first seed built first, the last seed tested last): each held its share
    # of the trial's resources from the trial's start to its end.
    clock = stacked.lead.clock()
    final = {R.STATUS: R.STATUS_OK, R.ERROR: "", R.EPOCH: max(t.epoch for t in stacked.trainers.values()),
             R.NODE: node, R.RUNS: {str(seed): {**record, **clock, R.TRIAL_INFO: about[seed][R.TRIAL_INFO]}
                                    for seed, record in records.items()}}

    def files(folder: Path) -> None:
        for seed, record in records.items():
            if record[R.STATUS] == R.STATUS_OK:
                (folder / str(seed)).mkdir()
                _write_final(folder / str(seed), stacked.trainers[seed], record)
        (folder / FINAL_RECORD).write_text(json.dumps(final, indent=1))

    _report_with_files(final, files)


def _about(trainer: Trainer, runs: int = 1) -> dict[str, Any]:
    """What every report of a trial (or a stacked seed) carries: which node ran it (a tag of its MLflow run), and
    what only this process knows about itself (params of its run, columns of the results CSV), among it its share
    of the GPUs and CPUs Ray gave the trial: all of them, or for one of the `runs` seeds a stacked trial carries,
    1/runs of them. A trial that trains on the CPU holds no GPU, whatever Ray scheduled (a CPU machine's logical
    GPUs)."""
    given = tune.get_context().get_trial_resources().required_resources  # e.g. {"CPU": 1.0, "GPU": 0.25}
    gpus = given.get("GPU", 0.0) if trainer.device.type == "cuda" else 0.0
    return {R.NODE: ray.get_runtime_context().get_node_id(),
            R.TRIAL_INFO: {**trainer.placement.info(), R.VISIBLE_DEVICES: os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                           R.GPU_SHARE: gpus / runs, R.CPU_SHARE: given.get("CPU", 0.0) / runs}}


def _finished_or_restored(trainer: Trainer | StackedTrainer) -> bool:
    """Restart from the trial's checkpoint, if Tune has one: True when the trial had finished (before its driver
    died) and its final record is reported again; else `trainer` continues from the last epoch's state."""
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return False
    with checkpoint.as_directory() as folder:
        if (Path(folder) / FINAL_RECORD).exists():
            tune.report(json.loads((Path(folder) / FINAL_RECORD).read_text()))
            return True
        trainer.load_state_dict(load_trainer_state(Path(folder) / TRAINER_STATE))
    return False


class UnsafeCheckpoint(Exception):
    """A trial's checkpoint holds more than tensors and plain values (a pickle that would import or run code)."""


def load_trainer_state(path: Path) -> dict[str, Any]:
    """A trainer's resume state (`Trainer.state_dict`, `StackedTrainer.state_dict`) as data: tensors and plain
    Python values only (`weights_only=True`), so that a checkpoint written by whoever can write the storage runs
    no code in the trial; anything else is refused in one line."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        what = next((ln.strip() for ln in str(exc).splitlines() if "Unsupported global" in ln or "GLOBAL" in ln),
                    str(exc).strip().splitlines()[0] if str(exc).strip() else "")
        raise UnsafeCheckpoint(f"checkpoint {path.name} refused: it holds more than tensors and plain values, "
                               f"which only code could rebuild ({what[:200]}); nothing of it was run. Whoever "
                               f"can write the sweep's storage wrote it: see docs/clusters.md") from None


def trial_run_name(config: dict[str, Any]) -> str:
    return f"{config.get(R.PE_TYPE, '?')}-{config.get(R.FUSION, '?')}-s{config.get(R.SEED, '?')}"


def check_trial_config(config: dict[str, Any], base: Preset) -> None:
    """A ConfigError unless `config` over `base` builds a model and a training protocol for the base's data."""
    model_cfg, _ = split_trial_config(config, base)
    trial_data(config, base)  # the tokeniser keys build a DataConfig
    if base.data.max_len > model_cfg.max_len:
        raise ConfigError(f"max_len={model_cfg.max_len} is shorter than the data's {base.data.max_len} "
                          f"tokens per document: raise max_len or pass --max-len {model_cfg.max_len}")
