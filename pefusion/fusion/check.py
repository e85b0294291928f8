"""Does every model the PE-fusion study can build train and evaluate on a device: the cases of `gpu_check`.

A case is one model size (a preset's model and training protocol), one (PE, fusion) pair, one precision, trained
separately or as S = 2 stacked seeds: a few optimiser steps on random token ids whose lengths reach the model's
max_len, then the trial's own evaluation (validation, the best state restored, test, latency), then its values:
every run ok, every weight and the last validation loss finite, and that loss below the loss before training (the
validation split is the training split). Each size's wide stack also checks values against references
(`reference_checks`): a stacked seed against the separate trial of the same seed and data order, and on a card
the card's fp32 run against the CPU's. Each size adds one case of S = 5 stacked seeds
and one ALiBi case whose widest batch is ≡ 64 (mod 128) tokens wide with long padding (the shape on which some
cuDNN builds return NaN gradients). What fails is reported as the error's last line, never raised, so one broken
case does not hide the others. The training steps run watched for host-device synchronisations (`SyncCount`).

The sizes are the two paper presets (every pair `check_pe_fusion` allows) and the `text` preset (its options:
pre-LN, a final LayerNorm, embedding dropout, AdamW with cosine decay and warm-up), on pairs that cover every PE
type and every fusion once. `tiny` shrinks each as `--smoke` does, for a CPU.
"""
from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from pefusion import record as R
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.errors import ConfigError
from pefusion.fusion.config import FUSIONS, PE_TYPES, PRESETS, Preset, check_pe_fusion, smoke_budget
from pefusion.fusion.device import attention_kernels, bf16_supported, resolve_precision
from pefusion.fusion.stacked import StackedTrainer
from pefusion.fusion.training import Trainer, nonfinite_parameter, train_and_evaluate

PAPER_SIZES = ("arxiv", "agnews_imdb")
OPTION_SIZES = ("text",)
PRECISIONS = ("auto", "fp32")
STACKED = 2  # seeds of every stacked case
WIDE_STACK = 5  # seeds of one stacked case per size
STEPS = 2  # optimiser steps per case (per seed)
TINY_BATCH, TINY_VOCAB = 4, 100
BATCH_TOKENS = 64 * 512  # a card's batch at most (the agnews_imdb preset's): the arxiv model's 4 096 tokens take 8
LONG_PADDING_SHORT = 16  # the other documents' longest, in the ALiBi case of long padding
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
    seeds: int = 1  # 1: a separate trial; more: that many stacked seeds
    long_padding: bool = False  # one document a width ≡ 64 (mod 128) wide, the others short, widths rounded to 64

    @property
    def stacked(self) -> bool:
        return self.seeds > 1

    @property
    def name(self) -> str:
        how = f"{self.seeds} stacked" if self.stacked else "separate"
        return (f"{self.size:<11} {self.pe_type + '+' + self.fusion:<21} {self.precision:<4} {how:<9}"
                f"{'long padding' if self.long_padding else ''}")


def precisions(device: torch.device) -> list[str]:
    """The PRECISIONS that run differently on `device`: auto and fp32 on a bf16 GPU; auto alone where it resolves
    to fp32 (a CPU), as the fp32 case would run the same computation again."""
    resolved: dict[str, str] = {}
    for precision in PRECISIONS:
        resolved.setdefault(resolve_precision(precision, device.type, bf16_supported(device)), precision)
    return list(resolved.values())


def cases(device: torch.device) -> list[Case]:
    """Every case on `device`, grouped by size: pairs × precisions × separate / stacked, then the size's first
    pair as WIDE_STACK stacked seeds and ALiBi with long padding, at precision auto."""
    sizes = [(size, allowed_pairs()) for size in PAPER_SIZES] + [(size, covering_pairs()) for size in OPTION_SIZES]
    return [case for size, pairs in sizes for case in (
        [Case(size, pe, fusion, precision, seeds) for pe, fusion in pairs for precision in precisions(device)
         for seeds in (1, STACKED)]
        + [Case(size, *pairs[0], "auto", WIDE_STACK), Case(size, "alibi", "none", "auto", long_padding=True)])]


def check_batch(size: str, tiny: bool) -> int:
    """A case's batch size: TINY_BATCH on a CPU, else the preset's where a batch has at most BATCH_TOKENS tokens,
    as many documents as fit in them where it would have more."""
    preset = PRESETS[size]
    return TINY_BATCH if tiny else min(preset.train.batch_size, max(4, BATCH_TOKENS // preset.model.max_len))


def batch_note(tiny: bool) -> str:
    """What the cases' batches are, against the presets' (printed before the cases)."""
    parts = [f"{size} {check_batch(size, tiny)}" + ("" if check_batch(size, tiny) == PRESETS[size].train.batch_size
                                                     else f" (the preset's {PRESETS[size].train.batch_size})")
             for size in PAPER_SIZES + OPTION_SIZES]
    why = "models shrunk" if tiny else f"at most {BATCH_TOKENS} tokens a batch"
    return f"batch sizes: {', '.join(parts)}; {why}"


def check_preset(size: str, tiny: bool) -> Preset:
    """The size's preset, shrunk for a CPU (`smoke_budget`) when `tiny`, one epoch of `check_batch`'s batches."""
    preset = smoke_budget(PRESETS[size]) if tiny else PRESETS[size]
    train = dataclasses.replace(preset.train, batch_size=check_batch(size, tiny), max_epochs=1, timing_repeats=1,
                                timing_warmup=0)
    return dataclasses.replace(preset, train=train)


def long_padding_width(max_len: int) -> int:
    """The widest width up to `max_len` that is ≡ 64 (mod 128) (the model's max_len is at least 64)."""
    return (max_len - 64) // 128 * 128 + 64


def check_corpus(preset: Preset, num_classes: int, vocab_size: int, seed: int = 0,
                 long_padding: bool = False) -> EncodedCorpus:
    """STEPS batches of random token ids, the same split for training, validation and test: lengths from 1 to the
    model's max_len (the longest always there), or with `long_padding` one document `long_padding_width` long and
    the others at most LONG_PADDING_SHORT."""
    rng = np.random.default_rng(seed)
    max_len, n = preset.model.max_len, STEPS * preset.train.batch_size
    if long_padding:
        kept = np.concatenate([[long_padding_width(max_len)], rng.integers(1, LONG_PADDING_SHORT + 1, n - 1)])
    else:
        kept = np.concatenate([[max_len], rng.integers(1, max_len + 1, n - 1)])
    split = EncodedSplit.random(kept, kept, vocab_size, num_classes, rng)
    return EncodedCorpus(split, split, split, vocab_size=vocab_size, num_classes=num_classes, max_len=max_len,
                         name=f"check-{preset.model.max_len}", cache_key="")


class SyncCount:
    """Host-device synchronisations seen in training steps: each step runs under
    `torch.cuda.set_sync_debug_mode("warn")`, whose warnings are counted with where they were raised. A CPU has
    none to see; its steps are counted all the same."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.steps, self.syncs, self.where = 0, 0, {}  # where: "file:line" -> count

    def watch(self, steps: Callable[[], Iterator[Any]]) -> Callable[[], Iterator[Any]]:
        """`steps` (a trainer's `train_steps`) with each step, its batch's preparation included, watched."""
        def watched() -> Iterator[Any]:
            it = steps()
            while True:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    if self.cuda:
                        torch.cuda.set_sync_debug_mode("warn")
                    try:
                        item = next(it)
                    except StopIteration:
                        return
                    finally:
                        if self.cuda:
                            torch.cuda.set_sync_debug_mode("default")
                        for w in caught:
                            if "synchroniz" in str(w.message):
                                self.syncs += 1
                                key = f"{w.filename}:{w.lineno}"
                                self.where[key] = self.where.get(key, 0) + 1
                self.steps += 1
                yield item
        return watched

    def summary(self) -> str:
        per = self.syncs / max(self.steps, 1)
        where = ", ".join(f"{k} ({v})" for k, v in sorted(self.where.items(), key=lambda kv: -kv[1])[:3])
        seen = f"; first at {where}" if where else ("" if self.cuda else "; none to see on a CPU")
        return f"syncs per training step {per:.2f} ({self.syncs} in {self.steps} steps{seen})"


def check_values(trainer: Trainer) -> None:
    """Raise a RuntimeError unless every weight of `trainer`'s model and its last validation loss are finite."""
    bad = nonfinite_parameter(trainer.model)
    if bad is not None:
        raise RuntimeError(f"seed {trainer.train_cfg.seed}: non-finite weights in {bad}")
    if not trainer.history or not math.isfinite(trainer.history[-1][R.VAL_LOSS]):
        raise RuntimeError(f"seed {trainer.train_cfg.seed}: validation loss "
                           f"{trainer.history[-1][R.VAL_LOSS] if trainer.history else 'never computed'}")


def check_loss_fell(trainer: Trainer, before: float) -> None:
    """Raise a RuntimeError unless the trial's last validation loss is below `before`, its loss before training:
    a case's validation split is its training split, so STEPS optimiser steps must lower the loss on it."""
    after = trainer.history[-1][R.VAL_LOSS]
    if not after < before:
        raise RuntimeError(f"seed {trainer.train_cfg.seed}: the loss did not fall over {STEPS} steps on the data it "
                           f"trained on ({before:.6g} before, {after:.6g} after)")


def run_case(case: Case, preset: Preset, corpus: EncodedCorpus, device: torch.device, syncs: SyncCount) -> None:
    """Train and evaluate one case, its training steps watched by `syncs`; raises what it raised, or a
    RuntimeError naming a run that did not end ok, a non-finite value or a loss that did not fall. The wide stack
    of each size also runs `reference_checks`."""
    model = dataclasses.replace(preset.model, pe_type=case.pe_type, fusion=case.fusion)
    train = dataclasses.replace(preset.train, precision=case.precision, device=device.type,
                                pad_multiple=64 if case.long_padding else preset.train.pad_multiple)
    edges = preset.data.length_edges
    if case.stacked:
        stacked = StackedTrainer(model, train, corpus, list(range(case.seeds)), device)
        before = {seed: t.evaluate(corpus.validation)["loss"] for seed, t in stacked.trainers.items()}
        stacked.train_steps = syncs.watch(stacked.train_steps)
        while not stacked.finished:
            stacked.train_epoch()
        records, trainers = list(stacked.final_records(edges).values()), list(stacked.trainers.values())
    else:
        trainer = Trainer(model, train, corpus, device)
        before = {trainer.train_cfg.seed: trainer.evaluate(corpus.validation)["loss"]}
        trainer.train_steps = syncs.watch(trainer.train_steps)
        records, trainers = [train_and_evaluate(model, train, corpus, length_edges=edges, trainer=trainer)], [trainer]
    for record in records:
        if record[R.STATUS] != R.STATUS_OK:
            raise RuntimeError(f"status {record[R.STATUS]}: {record[R.ERROR]}")
    for trainer in trainers:
        check_values(trainer)
        check_loss_fell(trainer, before[trainer.train_cfg.seed])
    if case.seeds == WIDE_STACK:
        reference_checks(case, preset, corpus, device)


# The reference comparisons of `reference_checks`, fp32 without dropout (whose draws a stacked seed does not share
# with its trial, and which a card and a CPU draw differently): the largest relative difference of the training
# and validation losses allowed (`relative_gap`). Stacked against separate on a CPU differs by float
# rounding of batched products (tests/test_stacked.py: within 1e-4 over 50 steps); a card against the CPU by its
# kernels' summation order, a tolerance not yet measured on a card.
STACKED_TOLERANCE = 1e-4
CARD_TOLERANCE = 1e-3


def _short_run(case: Case, preset: Preset, corpus: EncodedCorpus, device: torch.device,
               seeds: list[int]) -> Trainer:
    """The trial of seeds[-1] after one epoch (STEPS steps) at fp32 without dropout: separate for one seed,
    else one of len(seeds) stacked seeds (synced back into its own model)."""
    model = dataclasses.replace(preset.model, pe_type=case.pe_type, fusion=case.fusion, dropout=0.0,
                                attn_dropout=0.0, embed_dropout=0.0, head_dropout=0.0)
    train = dataclasses.replace(preset.train, precision="fp32", device=device.type, seed=seeds[-1])
    if len(seeds) == 1:
        trainer = Trainer(model, train, corpus, device)
        trainer.train_epoch()
        return trainer
    stacked = StackedTrainer(model, train, corpus, seeds, device)
    stacked.train_epoch()  # syncs the stack back into each seed's model
    return stacked.trainers[seeds[-1]]


def relative_gap(trainer: Trainer, reference: Trainer) -> float:
    """The larger relative difference, |x − x_ref| / |x_ref|, of two trials' training loss over their epoch and
    their validation loss after it. Losses, not weights: a key projection's bias gets a gradient that is zero but
    for rounding, and Adam turns that noise into lr-sized steps that the model's outputs never see."""
    return max(abs(trainer.history[-1][key] - reference.history[-1][key]) / abs(reference.history[-1][key])
               for key in (R.TRAIN_LOSS, R.VAL_LOSS))


def reference_checks(case: Case, preset: Preset, corpus: EncodedCorpus, device: torch.device) -> None:
    """Values against a reference, fp32 without dropout: the last of `case.seeds` stacked seeds against the
    separate trial of the same seed (same initialisation and data order) within STACKED_TOLERANCE; on a card, the
    card's separate trial against the CPU's within CARD_TOLERANCE. Raises a RuntimeError naming the gap."""
    seeds = list(range(case.seeds))
    separate = _short_run(case, preset, corpus, device, seeds[-1:])
    gap = relative_gap(_short_run(case, preset, corpus, device, seeds), separate)
    if not gap <= STACKED_TOLERANCE:
        raise RuntimeError(f"stacked seed {seeds[-1]} differs from its separate trial by {gap:.2g} (relative), "
                           f"more than {STACKED_TOLERANCE:g}")
    if device.type == "cuda":
        gap = relative_gap(separate, _short_run(case, preset, corpus, torch.device("cpu"), seeds[-1:]))
        if not gap <= CARD_TOLERANCE:
            raise RuntimeError(f"fp32 on the card differs from the CPU by {gap:.2g} (relative), more than "
                               f"{CARD_TOLERANCE:g}")


def last_line(exc: BaseException) -> str:
    """An error as one line: the last non-empty line of its message, after its type."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__


class Outcome(NamedTuple):
    case: Case
    outcome: str  # 'ok' or the error's last line
    seconds: float
    kernels: dict[str, int]  # attention calls per kernel (`device.attention_kernels`), for the profiled cases


def profiled(case: Case, previous: Case | None) -> bool:
    """Whether the attention kernels of `case` are read from a profile: each size's first case, its wide stack
    and its case of long padding."""
    return previous is None or previous.size != case.size or case.seeds == WIDE_STACK or case.long_padding


def run_cases(device: torch.device, tiny: bool, syncs: SyncCount) -> Iterator[Outcome]:
    """Each case's outcome, as it finishes."""
    corpora: dict[tuple[str, bool], tuple[Preset, EncodedCorpus]] = {}
    previous = None
    for case in cases(device):
        key = case.size, case.long_padding
        if key not in corpora:
            preset = check_preset(case.size, tiny)
            vocab = TINY_VOCAB if tiny else preset.data.max_vocab
            corpora[key] = preset, check_corpus(preset, CLASSES[case.size], vocab, long_padding=case.long_padding)
        start, kernels = time.perf_counter(), {}
        try:
            if profiled(case, previous):
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                with profile(activities=activities) as prof:
                    run_case(case, *corpora[key], device, syncs)
                kernels = attention_kernels(prof.events())
            else:
                run_case(case, *corpora[key], device, syncs)
            outcome = "ok"
        except Exception as exc:  # reported in its line: one broken case must not stop the others
            outcome = last_line(exc)
        previous = case
        yield Outcome(case, outcome, time.perf_counter() - start, kernels)
