"""The PE-fusion study's GPU probe for `--gpus-per-trial auto`: the peak GPU memory of the sweep's largest trial.

Memory depends on shapes, not on the text, so the probe needs no dataset: random token ids, every document of the
data's full `max_len` (batches are padded to their longest document, so no trial sees a longer batch), a
vocabulary of the data config's `max_vocab` words (the most the data can give; the real one is usually smaller),
two optimiser steps (the second is the steady state: the first step's gradients and Adam's moments are still
held during its forward pass) and a validation pass (which keeps a copy of the best weights), through the same
`Trainer` as a trial.

Which trial is largest is decided without measuring where it can be (`largest_trials`), and measured where it
cannot: a larger batch, sequence, width or depth never needs less memory, but whether `concat` or `gate_cnn`,
`alibi` or `rope`, fp32 or bf16 needs more depends on the shapes, so each such combination is measured once.
"""
from __future__ import annotations

import gc
from typing import Any, Sequence

import numpy as np
import torch

from pefusion import record as R
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.fusion.config import ModelConfig, Preset, TrainConfig, flat_config, split_trial_config, trial_data
from pefusion.fusion.device import bf16_supported, resolve_precision
from pefusion.fusion.stacked import StackedTrainer
from pefusion.fusion.training import Trainer

# Trial keys whose larger values never need less memory: of each, a sweep's largest trial takes the largest value.
SIZE_KEYS = ("batch_size", "max_len", "d_model", "nhead", "num_layers", "dim_ff", "gate_kernel")
# Trial keys that change no tensor's shape or number (the optimiser's hyperparameters, the budget, the seed, the
# timing protocol), or none of the probe's (its batches are max_len wide whatever the pad multiple): trials that
# differ only in these need the same memory.
SHAPELESS_KEYS = ("lr", "weight_decay", "max_epochs", "early_stopping", "patience", "min_delta", "seed",
                  "timing_repeats", "timing_warmup", "latency", "device", "pad_multiple")
# The head is (d_model, C) and the logits (B, C): a few KiB either way, so the probe need not know the classes.
PROBE_CLASSES = 2


def largest_trials(points: Sequence[dict[str, Any]],
                   base: Preset) -> list[tuple[ModelConfig, TrainConfig, int]]:
    """The trials among `points` (over `base`) of which one needs the most memory, with how many seeds each
    stacks (a point whose seed is a list trains them as one model: that many models' memory): for each
    combination of the keys that change what is computed (pe_type, fusion, precision, activation, dropout, ...),
    the largest value of every `SIZE_KEYS` key and the most stacked seeds. A point of the space, not an
    extrapolation: the points are a product over keys, so the largest values within a combination are one of its
    points (and validated with the rest)."""
    largest: dict[tuple, tuple[dict[str, Any], int]] = {}
    for point in points:
        seeds = point.get(R.SEED)
        stacked = len(seeds) if isinstance(seeds, list) else 1
        if isinstance(seeds, list):
            point = {**point, R.SEED: seeds[0]}
        flat = flat_config(*split_trial_config(point, base))
        kind = tuple((k, v) for k, v in flat.items() if k not in SIZE_KEYS and k not in SHAPELESS_KEYS)
        seen, most = largest.setdefault(kind, (flat, stacked))
        seen.update({k: max(seen[k], flat[k]) for k in SIZE_KEYS})
        largest[kind] = (seen, max(most, stacked))
    return [(*split_trial_config(flat, base), stacked) for flat, stacked in largest.values()]


def probe_corpus(batch_size: int, tokens: int, vocab_size: int) -> EncodedCorpus:
    """Random documents of up to `tokens` ids: two training batches of `batch_size` and one of validation (also
    the test split, which the probe never reads). Every document but one per split is a token short of `tokens`:
    with the widths rounded up to a pad multiple (64 on a GPU) every batch is (batch_size, tokens) and has padding,
    as real batches do; with ALiBi a padded batch builds a (B, H, T, T) logit bias that an unpadded one does not."""
    rng = np.random.default_rng(0)

    def split(n: int) -> EncodedSplit:
        lengths = np.full(n, max(tokens - 1, 1), dtype=np.int64)
        lengths[0] = tokens
        return EncodedSplit.random(lengths, lengths, vocab_size, PROBE_CLASSES, rng)

    validation = split(batch_size)
    return EncodedCorpus(train=split(2 * batch_size), validation=validation, test=validation,
                         vocab_size=vocab_size, num_classes=PROBE_CLASSES, max_len=tokens, name="gpu-probe",
                         cache_key="")


def in_words(model: ModelConfig, train: TrainConfig, tokens: int, precision: str, stacked: int = 1) -> str:
    """A trial in the words of the `auto` line, e.g. 'the rope/concat trial (batch 64 x 4096 tokens, d_model 128,
    2 layers, bf16, 3 seeds stacked)', with the precision it resolved to on the card."""
    seeds = f", {stacked} seeds stacked" if stacked > 1 else ""
    return (f"the {model.pe_type}/{model.fusion} trial (batch {train.batch_size} x {tokens} tokens, d_model "
            f"{model.d_model}, {model.num_layers} layer{'s' if model.num_layers > 1 else ''}, {precision}{seeds})")


def largest_trial_peak(points: Sequence[dict[str, Any]], base: Preset) -> tuple[int, str]:
    """The most GPU memory (bytes torch reserves on the current CUDA device) any trial of `points` needs, and
    which trial, in words. Reserved rather than allocated memory: the allocator keeps what it reserved at the
    peak for the trial's whole life, fragmentation included, and that is what the next trial on the card cannot
    have. Raises torch.cuda.OutOfMemoryError naming the trial if one does not fit on the card alone."""
    device = torch.device("cuda")
    tokens, vocab_size = base.data.max_len, max(trial_data(p, base).max_vocab for p in points)
    peaks = []
    for model, train, stacked in largest_trials(points, base):
        what = in_words(model, train, tokens, resolve_precision(train.precision, "cuda", bf16_supported(device)),
                        stacked)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        corpus = probe_corpus(train.batch_size, tokens, vocab_size)
        try:
            if stacked > 1:
                StackedTrainer(model, train, corpus, list(range(stacked)), device).train_epoch()
            else:
                Trainer(model, train, corpus, device).train_epoch()
        except torch.cuda.OutOfMemoryError:
            raise torch.cuda.OutOfMemoryError(f"{what} runs out of GPU memory alone on the card") from None
        gc.collect()  # the trainer's tensors, before the next trial's statistics start
        peaks.append((torch.cuda.max_memory_reserved(device), what))
    return max(peaks)
