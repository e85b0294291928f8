"""Does every model the PE-fusion study can build train and evaluate on a device: the cases of `gpu_check`.

A case is one model size (a preset's model and training protocol), one (PE, fusion) pair, one precision, trained
separately or as S = 2 stacked seeds: a few optimiser steps on random token ids whose lengths reach the model's
max_len, then the trial's own evaluation (validation, the best state restored, test, latency). What fails is
reported as the error's last line, never raised, so one broken case does not hide the others.

The sizes are the two paper presets (every pair `check_pe_fusion` allows) and the `text` preset (its options:
pre-LN, a final LayerNorm, embedding dropout, AdamW with cosine decay and warm-up), on pairs that cover every PE
type and every fusion once. `tiny` shrinks each as `--smoke` does, for a CPU.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from pefusion import record as R
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.errors import ConfigError
from pefusion.fusion.config import FUSIONS, PE_TYPES, PRESETS, Preset, check_pe_fusion, smoke_budget
from pefusion.fusion.device import bf16_supported, resolve_precision
from pefusion.fusion.stacked import StackedTrainer
from pefusion.fusion.training import train_and_evaluate

PAPER_SIZES = ("arxiv", "agnews_imdb")
OPTION_SIZES = ("text",)
PRECISIONS = ("auto", "fp32")
STACKED_SEEDS = (0, 1)
STEPS = 2  # optimiser steps per case (per seed)
TINY_BATCH, TINY_VOCAB = 4, 100
CLASSES = {"arxiv": 11, "agnews_imdb": 4, "text": 2}  # ArXiv-11's, AG News's, IMDB's


def allowed_pairs() -> list[tuple[str, str]]:
    """Every (pe_type, fusion) that `check_pe_fusion` accepts."""
    pairs = []
    for pe in PE_TYPES:
        for fusion in FUSIONS:
            try:
                check_pe_fusion(pe, fusion)
            except ConfigError:
                continue
            pairs.append((pe, fusion))
    return pairs


def covering_pairs() -> list[tuple[str, str]]:
    """Allowed pairs in which every PE type and every fusion appear at least once: each PE with its first fusion,
    then each fusion not yet seen with its first PE."""
    pairs = allowed_pairs()
    chosen = [next(p for p in pairs if p[0] == pe) for pe in PE_TYPES]
    seen = {f for _, f in chosen}
    chosen += [next(p for p in pairs if p[1] == f) for f in FUSIONS if f not in seen]
    return chosen


@dataclass(frozen=True)
class Case:
    size: str  # the preset whose model and training protocol it runs
    pe_type: str
    fusion: str
    precision: str
    stacked: bool

    @property
    def name(self) -> str:
        return (f"{self.size:<11} {self.pe_type + '+' + self.fusion:<21} {self.precision:<4} "
                f"{'stacked' if self.stacked else 'separate'}")


def precisions(device: torch.device) -> list[str]:
    """The PRECISIONS that run differently on `device`: auto and fp32 on a bf16 GPU; auto alone where it resolves
    to fp32 (a CPU), as the fp32 case would run the same computation again."""
    resolved: dict[str, str] = {}
    for precision in PRECISIONS:
        resolved.setdefault(resolve_precision(precision, device.type, bf16_supported(device)), precision)
    return list(resolved.values())


def cases(device: torch.device) -> list[Case]:
    """Every case on `device`, grouped by size: pairs × precisions × separate / stacked."""
    sizes = [(size, allowed_pairs()) for size in PAPER_SIZES] + [(size, covering_pairs()) for size in OPTION_SIZES]
    return [Case(size, pe, fusion, precision, stacked) for size, pairs in sizes for pe, fusion in pairs
            for precision in precisions(device) for stacked in (False, True)]


def check_preset(size: str, tiny: bool) -> Preset:
    """The size's preset, shrunk for a CPU (`smoke_budget`) when `tiny`; batches of TINY_BATCH there, and a
    smaller batch than the preset's on a GPU (a few steps, not a measurement)."""
    preset = smoke_budget(PRESETS[size]) if tiny else PRESETS[size]
    batch = TINY_BATCH if tiny else max(4, preset.train.batch_size * 128 // preset.model.max_len)
    train = dataclasses.replace(preset.train, batch_size=min(batch, preset.train.batch_size), max_epochs=1,
                                timing_repeats=1, timing_warmup=0)
    return dataclasses.replace(preset, train=train)


def check_corpus(preset: Preset, num_classes: int, vocab_size: int, seed: int = 0) -> EncodedCorpus:
    """STEPS batches of random token ids, lengths from 1 to the model's max_len (the longest always there), the
    same split for training, validation and test."""
    rng = np.random.default_rng(seed)
    max_len, n = preset.model.max_len, STEPS * preset.train.batch_size
    kept = np.concatenate([[max_len], rng.integers(1, max_len + 1, n - 1)])
    split = EncodedSplit.random(kept, kept, vocab_size, num_classes, rng)
    return EncodedCorpus(split, split, split, vocab_size=vocab_size, num_classes=num_classes, max_len=max_len,
                         name=f"check-{preset.model.max_len}", cache_key="")


def run_case(case: Case, preset: Preset, corpus: EncodedCorpus, device: torch.device) -> None:
    """Train and evaluate one case; raises what it raised, or a RuntimeError naming a run that did not end ok."""
    model = dataclasses.replace(preset.model, pe_type=case.pe_type, fusion=case.fusion)
    train = dataclasses.replace(preset.train, precision=case.precision, device=device.type)
    edges = preset.data.length_edges
    if case.stacked:
        stacked = StackedTrainer(model, train, corpus, list(STACKED_SEEDS), device)
        while not stacked.finished:
            stacked.train_epoch()
        records = list(stacked.final_records(edges).values())
    else:
        records = [train_and_evaluate(model, train, corpus, length_edges=edges)]
    for record in records:
        if record[R.STATUS] != R.STATUS_OK:
            raise RuntimeError(f"status {record[R.STATUS]}: {record[R.ERROR]}")


def last_line(exc: BaseException) -> str:
    """An error as one line: the last non-empty line of its message, after its type."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__


def run_cases(device: torch.device, tiny: bool) -> Iterator[tuple[Case, str, float]]:
    """Each case's (case, 'ok' or its error's last line, seconds), as it finishes."""
    corpora: dict[str, tuple[Preset, EncodedCorpus]] = {}
    for case in cases(device):
        if case.size not in corpora:
            preset = check_preset(case.size, tiny)
            vocab = TINY_VOCAB if tiny else preset.data.max_vocab
            corpora[case.size] = preset, check_corpus(preset, CLASSES[case.size], vocab)
        start = time.perf_counter()
        try:
            run_case(case, *corpora[case.size], device)
            outcome = "ok"
        except Exception as exc:  # reported in its line: one broken case must not stop the others
            outcome = last_line(exc)
        yield case, outcome, time.perf_counter() - start
