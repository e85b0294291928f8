"""The PE-fusion study's timing for `--plan`: how long each trial of a sweep will take, from a few training steps
of each kind of its trials on throwaway models (the engine's side, trials at once and the wall time, is
`pefusion.sweep.plan`).

Time, unlike memory, depends on the text: a batch is as wide as its longest document, so the steps are timed on
documents drawn from the sweep's own tokenised training split (`sample_corpus`), as many as `STEPS` batches of the
trial's batch size, through the trial's `Trainer` (or `StackedTrainer`), one warm-up step first. A trial is then
    build + epochs × (steps per epoch × step + validation + checkpoint) + its last phase,
the last phase being the final validation and test passes and its latency method's forwards (`testing_seconds`).
Evaluation runs on batches sorted by length, so it is timed so: `EVAL_BATCHES` batches of validation documents,
sorted as evaluation sorts them, give the seconds per token of a batch's width (padding included), which the real
splits' own sorted batches multiply. The trials that differ in what is computed (pe_type, fusion, sizes, batch size,
precision, ...) are timed once each (`timed_kinds`); trials that differ only in the seed (AG News's seeds, whose
corpora differ only in the documents drawn for validation, among them), the learning rate or the epoch budget share
a timing.
"""
from __future__ import annotations

import dataclasses
import functools
import io
import math
import statistics
import time
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from pefusion import record as R
from pefusion.data.batching import batch_order, batch_widths
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.data.profile import DataProfile
from pefusion.fusion.config import Preset, flat_config, split_trial_config, trial_data
from pefusion.fusion.device import bf16_supported, device_name, resolve_precision
from pefusion.fusion.probe import SHAPELESS_KEYS, in_words
from pefusion.fusion.stacked import StackedTrainer
from pefusion.fusion.training import Trainer, latency_sample
from pefusion.sweep.study import Timing

STEPS = 3  # timed training steps per kind of trial, after one warm-up step
EVAL_BATCHES = 2  # evaluation batches timed per kind, after one warm-up pass: a shorter and a longer width


def _kind(point: Mapping[str, Any], base: Preset) -> tuple:
    """What decides a trial's step time: every flat config value but the probe's `SHAPELESS_KEYS` (the seed, the
    optimiser's numbers, the epoch budget: `trial_seconds` counts a point's epochs), how many seeds it stacks and
    which corpus it reads."""
    seeds = point.get(R.SEED)
    single = _single(point)
    flat = flat_config(*split_trial_config(single, base))
    data = trial_data(single, base)  # a seed's own validation split is only other documents: one kind
    return (*((k, v) for k, v in flat.items() if k not in SHAPELESS_KEYS),
            ("stacked", len(seeds) if isinstance(seeds, list) else 1),
            ("data", dataclasses.replace(data, split_seed=base.data.split_seed).tokenizer_setting))


def timed_kinds(points: Sequence[dict[str, Any]], base: Preset) -> tuple[list[dict[str, Any]], list[int]]:
    """The points to time, one per kind of trial (`_kind`), and for each of `points` the index of its kind's."""
    kinds: dict[tuple, int] = {}
    which = [kinds.setdefault(_kind(p, base), len(kinds)) for p in points]
    firsts = {k: next(p for p, w in zip(points, which) if w == k) for k in set(which)}
    return [firsts[k] for k in range(len(kinds))], which


def take(split: EncodedSplit, index: np.ndarray) -> EncodedSplit:
    """The documents `index` of `split`, as a split of their own."""
    docs = [split.doc(int(i)) for i in index]
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    return EncodedSplit(ids=np.concatenate(docs) if docs else np.zeros(0, np.int32),
                        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                        labels=split.labels[index], raw_lengths=split.raw_lengths[index])


def sample_corpus(corpus: EncodedCorpus, batch_size: int, seed: int = 0) -> EncodedCorpus:
    """A small corpus of the real one's documents to time on: (1 + STEPS) training batches of random documents and
    EVAL_BATCHES batches of validation ones (drawn again where a split has fewer)."""
    rng = np.random.default_rng(seed)

    def draw(split: EncodedSplit, n: int) -> EncodedSplit:
        return take(split, rng.choice(len(split), n, replace=len(split) < n))

    validation = draw(corpus.validation, EVAL_BATCHES * batch_size)
    return dataclasses.replace(corpus, train=draw(corpus.train, (1 + STEPS) * batch_size), validation=validation,
                               test=validation, meta={})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def eval_tokens(lengths: np.ndarray, batch_size: int, pad_multiple: int, max_width: int) -> np.ndarray:
    """The padded tokens (size × width) of each evaluation batch of a split of documents of `lengths`, in the
    order evaluation makes them (sorted by length): (batches,) int64."""
    order = batch_order(lengths, batch_size, shuffle=False)
    return np.array([len(b) * int(batch_widths(lengths[b], pad_multiple, max_width).max()) for b in order],
                    dtype=np.int64)


def time_kind(point: dict[str, Any], base: Preset, corpus: EncodedCorpus, device: torch.device,
              steps: int = STEPS, synthetic: bool = False) -> dict[str, float]:
    """Seconds to build the trial of `point` on `corpus` (a `sample_corpus`), per training step (the median of
    `steps` after a warm-up one), per padded token of length-sorted evaluation batches (all of a stacked trial's
    seeds), with `synthetic` per synthetic latency batch (one forward), and per checkpoint; and the pad multiple
    and width limit its batches have on `device`."""
    seeds = point.get(R.SEED)
    stacked = len(seeds) if isinstance(seeds, list) else 1
    model_cfg, train_cfg = split_trial_config(_single(point), base)
    start = time.perf_counter()
    trainer = StackedTrainer(model_cfg, train_cfg, corpus, list(range(stacked)), device) if stacked > 1 \
        else Trainer(model_cfg, train_cfg, corpus, device)
    build = time.perf_counter() - start
    stepping = trainer.train_steps()
    next(stepping)
    _sync(device)
    took = []
    for _ in range(steps):  # each step on its own clock: the median leaves out a step another process slowed
        start = time.perf_counter()
        next(stepping)
        _sync(device)
        took.append(time.perf_counter() - start)
    step = statistics.median(took)
    lead = trainer.lead if stacked > 1 else trainer
    lead.evaluate(corpus.validation)  # warm-up
    start = time.perf_counter()
    lead.evaluate(corpus.validation)
    multiple, limit = lead.placement.pad_multiple, model_cfg.max_len
    tokens = eval_tokens(corpus.validation.lengths, train_cfg.batch_size, multiple, limit).sum()
    per_token = stacked * (time.perf_counter() - start) / max(int(tokens), 1)
    synthetic_s = math.nan
    if synthetic:
        batch = lead.synthetic_batch()
        with torch.no_grad(), lead.autocast():
            start = time.perf_counter()
            lead.model(batch.tokens)
            _sync(device)
        synthetic_s = stacked * (time.perf_counter() - start)
    start = time.perf_counter()
    torch.save(trainer.state_dict(), io.BytesIO())
    return {"build": build, "step": step, "eval_token": per_token, "synthetic": synthetic_s,
            "checkpoint": time.perf_counter() - start, "pad_multiple": multiple, "max_width": limit}


def testing_seconds(train_cfg: Any, splits: tuple[np.ndarray, np.ndarray, np.ndarray],
                    t: Mapping[str, float]) -> float:
    """A trial's last phase from its kind's timings `t`: the final validation and test passes, then its latency
    method's forwards (`Trainer.measure_latency`): the test split's batches, a sample of them, or the synthetic
    batch, `timing_warmup + timing_repeats` times."""
    _, val, test = (eval_tokens(lengths, train_cfg.batch_size, int(t["pad_multiple"]), int(t["max_width"]))
                    for lengths in splits)
    passes = train_cfg.timing_warmup + train_cfg.timing_repeats
    if train_cfg.latency == R.LATENCY_SYNTHETIC_BATCH:
        latency = passes * t["synthetic"]
    else:
        timed = test if train_cfg.latency == R.LATENCY_TEST_PASSES else test[latency_sample(len(test))]
        latency = passes * timed.sum() * t["eval_token"]
    return (val.sum() + test.sum()) * t["eval_token"] + latency


def trial_seconds(point: dict[str, Any], base: Preset, splits: tuple[np.ndarray, np.ndarray, np.ndarray],
                  t: Mapping[str, float]) -> tuple[float, float]:
    """A trial's seconds at its whole epoch budget, and of them its last phase (`testing_seconds`), on a corpus
    whose (train, validation, test) documents have `splits` lengths, from its kind's timings `t` (`time_kind`)."""
    train_cfg = split_trial_config(_single(point), base)[1]
    val = eval_tokens(splits[1], train_cfg.batch_size, int(t["pad_multiple"]), int(t["max_width"])).sum()
    epoch = math.ceil(len(splits[0]) / train_cfg.batch_size) * t["step"] + val * t["eval_token"] + t["checkpoint"]
    testing = testing_seconds(train_cfg, splits, t)
    return t["build"] + train_cfg.max_epochs * epoch + testing, testing


def time_trials(device_type: str, *, points: Sequence[dict[str, Any]], base: Preset,
                samples: Mapping[str, EncodedCorpus], lengths: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                threads: int) -> Timing:
    """Every point's seconds (`trial_seconds`), its kind timed on `samples` (per tokeniser setting: a
    `sample_corpus` for each timed kind's batch size, by `_sample_key`) on `device_type` with `threads` torch
    threads; `lengths`: each setting's real (train, validation, test) document lengths."""
    device = torch.device(device_type)
    torch.set_num_threads(threads)  # (the engine restores the driver's)
    kinds, which = timed_kinds(points, base)
    # The process's first model, step and evaluation pay its one-time costs (lazy imports, the allocator's
    # first blocks, kernel selection), which a trial process pays once for all its trials: not timed.
    time_kind(kinds[0], base, samples[_sample_key(kinds[0], base)], device, steps=1)
    synthetic = [any(split_trial_config(_single(p), base)[1].latency == R.LATENCY_SYNTHETIC_BATCH
                     for p, k in zip(points, which) if k == kind) for kind in range(len(kinds))]
    timings = [time_kind(p, base, samples[_sample_key(p, base)], device, synthetic=synth)
               for p, synth in zip(kinds, synthetic)]
    both = [trial_seconds(p, base, lengths[trial_data(_single(p), base).tokenizer_setting], timings[k])
            for p, k in zip(points, which)]
    seconds = [s for s, _ in both]
    point = points[int(np.argmax(seconds))]
    model, train = split_trial_config(_single(point), base)
    seeds = point.get(R.SEED)
    precision = resolve_precision(train.precision, device.type, bf16_supported(device))
    trial = in_words(model, train, base.data.max_len, precision, len(seeds) if isinstance(seeds, list) else 1)
    where = device_name(device) + ("" if device.type == "cuda" else f", {threads} thread{'s' if threads > 1 else ''}")
    epochs = max(split_trial_config(_single(p), base)[1].max_epochs for p in points)
    return Timing(seconds=tuple(seconds), device=f"{device.type} ({where})", trial=trial,
                  budget=f"{epochs} epoch{'s' if epochs > 1 else ''} per trial",
                  testing_s=tuple(t for _, t in both), kinds=len(kinds))


def _single(point: dict[str, Any]) -> dict[str, Any]:
    seeds = point.get(R.SEED)
    return {**point, R.SEED: seeds[0]} if isinstance(seeds, list) else point


def _sample_key(point: dict[str, Any], base: Preset) -> str:
    single = _single(point)
    return f"{trial_data(single, base).tokenizer_setting}@{split_trial_config(single, base)[1].batch_size}"


def _profile_lengths(profile: DataProfile, max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, validation, test) document lengths in tokens, truncated at `max_len`, drawn from `profile` at its
    published split sizes with a fixed seed (the plan of the same sweep is the same every time)."""
    rng = np.random.default_rng(0)
    return tuple(np.minimum(profile.lengths(n, rng), max_len) for n in profile.sizes)


def plan_timer(points: Sequence[dict[str, Any]], shipped: Mapping[str, Any], *, base: Preset, cpus: float):
    """What the engine runs to time the sweep (`StudySweep.timer`): `time_trials` with the samples of the shipped
    corpora it needs, small enough to send to a fresh process."""
    corpora: Mapping[str, EncodedCorpus] = shipped["corpora"]
    samples = {}
    for point in timed_kinds(points, base)[0]:
        key = _sample_key(point, base)
        if key not in samples:
            single = _single(point)
            setting = trial_data(single, base).tokenizer_setting
            samples[key] = sample_corpus(corpora[setting], split_trial_config(single, base)[1].batch_size)
    # A dataset not downloaded yet is a `DataProfile`'s stand-in corpus: its published split sizes and length profile,
    # not the stand-in's few documents.
    profiles = shipped.get("profiles", {})
    lengths = {key: _profile_lengths(profiles[key], c.max_len) if key in profiles
               else (c.train.lengths, c.validation.lengths, c.test.lengths) for key, c in corpora.items()}
    return functools.partial(time_trials, points=list(points), base=base, samples=samples, lengths=lengths,
                             threads=max(1, int(cpus)))
