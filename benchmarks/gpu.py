"""GPU training benchmark: throughput, memory, precision, attention kernel, latency and
packing of the paper's models on token ids of realistic lengths. It imports torch, numpy and this package only
(no Ray, MLflow or `datasets`), so it runs on a bare GPU machine.

    python scripts/bench_gpu.py --json-out gpu.jsonl               # both models, every fusion, auto and fp32
    python scripts/bench_gpu.py --models arxiv --fusions add,gate_scalar --precisions auto,tf32 --packing 1,4
    python scripts/bench_gpu.py --device cpu --tiny                # a smoke run of seconds, not a measurement

What runs is the library's own training step (`pefusion.fusion.training.Trainer.step`: forward under the
precision's autocast, fp32 cross-entropy, backward, clipping where the preset clips, optimiser step) on the
preset's model, optimiser and batch size, with the preset's PE (sinusoidal) and each fusion, placed as a trial is
(`pefusion.fusion.device`: the precision resolved on the device, batch widths rounded up to the pad multiple, the
attention policy). The documents are
random token ids (speed does not depend on which ids) whose lengths follow the dataset's (`LENGTHS`), truncated
to the model's max_len as training truncates them; one epoch = `--steps` batches, so every timed epoch holds the
same documents. One JSON line per configuration, on stdout and in --json-out:

- `corpus`, one per model: the length distribution (`length_dist`), every document's length in words before
  truncation (`doc_words`), `max_len`, `mean_tokens` (tokens kept per document) and `truncated_fraction`.
- `train`, per model × fusion × precision × batching × `--attention` (`attention`: `policy`, a trial's kernels,
  or `efficient`, cuDNN's attention off): `bucketed` batches are those training runs
  (`iter_batches`: documents of similar length together, padded to the longest of the batch); `padded` batches
  are random documents padded to max_len (the paper notebook's batches). The first epoch, timed as a trial's first
  epoch runs (every shape new: kernels planned per shape, the CUDA context and handles): `first_epoch_s`,
  `first_epoch_samples_per_s`; then `--warmup` untimed steps and the steady state, a second timed epoch (the first
  one's shapes, in another order): `train_samples_per_s`, `train_tokens_per_s` (tokens kept, padding not
  counted; = samples/s × mean_tokens), `train_ms_per_step`, `first_over_steady` (first_epoch_s / train_s), `padding_fraction` (padded share of the batches' cells),
  `unpadded_batch_fraction` (batches without padding); `peak_mem_alloc_mib` (what tensors held at most,
  torch.cuda.max_memory_allocated) and `peak_mem_reserved_mib` (what the allocator took from the card, which
  packing must fit), null on a CPU; `attention_kernels`: which attention kernel ran, counted over the warm-up
  steps' attention calls (from the profiler: `flash`, `efficient`, `cudnn`, `math` are PyTorch's
  scaled_dot_product_attention kernels, `chunked` is pefusion's CPU kernel for dropout on attention weights);
  `sdpa_backends_ok` / `sdpa_backends_refused`: each SDPA kernel forced in turn on one eval-mode forward of the
  first batch, with PyTorch's reason for a refusal (the model passes its key-padding mask on every batch, padded
  or not, and on a GPU PyTorch's flash kernel takes no mask);
  `latency_ms_per_sample` (eval-mode forward passes over the same batching, the GPU synchronised around each
  timed pass: `Trainer.forward_latency`, the study's latency) and `latency_attention_kernels`. A configuration
  that runs out of GPU memory is a line with `oom: true`.
- `packing`, per model × packing fusion × precision × K: K processes (spawned) train the same configuration at
  once on one device, each its own model, warm-up steps then one timed epoch of bucketed batches, started
  together: `samples_per_s` (all processes' samples over the span from the first start to the last end),
  `tokens_per_s`, `process_samples_per_s` and `process_peak_mem_alloc_mib` / `process_peak_mem_reserved_mib`
  (per process; null on a CPU), `oom` and `oom_processes` (out of memory is recorded, not raised) and `errors`.
- `shapes`, per model × precision × variant: `--shapes` training steps whose batches have as many distinct
  lengths, then the same steps again: `new_ms_per_step`, `seen_ms_per_step` and `new_over_seen` (what a kernel
  planned per shape costs the first time), `lengths` and `widths` (distinct batch widths after rounding).
  `variant` `pefusion` is a trial's way (widths rounded up to the pad multiple, the attention policy); `pytorch`
  is the naive way in the same run (every width as it comes, PyTorch's own kernel order: cuDNN's attention first on
  Hopper since torch 2.11).

- `stacked`, per model × precision × `--stacked` S: one trial (fusion add), then S seeds of it trained together
  as one stacked model (`pefusion.fusion.stacked`), each for one timed epoch after the warm-up steps:
  `trial_samples_per_s`, `samples_per_s` (all S seeds' samples), `speedup` (their ratio: what stacking gains over
  one trial on the card), and the peak memory of each (`trial_peak_mem_*_mib`, `peak_mem_*_mib`); where either
  fails, `error` (the exception's type and first line) and no rates, and the benchmark goes on.

Every `train`, `packing`, `shapes` and `stacked` line also carries the device (`device`, `device_name`, `torch`), the model
(`model`, `pe_type`, `fusion`, `d_model`, `num_layers`, `max_len`, `batch_size`, `params`), the precision asked
for (`precision`, e.g. auto) and run (`precision_resolved`), `pad_multiple`, `attention_policy`, `steps`, `warmup`
and `fp32_matmul_precision` (`torch.backends.cuda.matmul.fp32_precision`: `ieee`, fp32 products without TF32,
unless the precision is tf32).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import multiprocessing as mp
import os
import queue as queue_module
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from benchmarks.timing import emit, timed
from pefusion.cli.flags import csv_list
from pefusion.data.batching import Batch, batch_order, batch_width, iter_batches, pad_batch, to_device
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.errors import ConfigError
from pefusion.fusion.config import FUSIONS, PRECISIONS, PRESETS, Preset, smoke_budget
from pefusion.fusion.device import attention_kernels, device_name
from pefusion.fusion.stacked import StackedTrainer
from pefusion.fusion.training import Trainer


@dataclass(frozen=True)
class LengthDist:
    """Document lengths in words: log-normal with this median and log-space standard deviation."""

    median_words: float
    sigma: float
    source: str  # what the parameters were matched to

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n,) int64 lengths, at least 1 word."""
        words = np.rint(self.median_words * np.exp(self.sigma * rng.standard_normal(n)))
        return np.maximum(words, 1).astype(np.int64)

    def describe(self) -> str:
        return f"lognormal(median={self.median_words:g} words, sigma={self.sigma:g}): {self.source}"


# Log-normal, not the synthetic corpus's log-uniform: real lengths pile up around a typical length with a long
# right tail. ArXiv-11's dataset card gives 1.65 GB of text for its 28 388 training papers, ~58 KB or ~9 700
# words each at ~6 bytes a word; median 8 000 and sigma 0.6 give a mean of ~9 600 words, with 87 % of the papers
# longer than the arxiv model's 4 096 tokens (so most batches are truncated papers, whole at max_len). The
# agnews_imdb preset serves two datasets: the benchmark uses IMDB's lengths (median ~174, mean ~230 words), the
# longer of the two and the one whose reviews reach the preset's max_len of 512.
LENGTHS = {
    "arxiv": LengthDist(8000, 0.6, "ArXiv-11 papers, mean ~9 600 words, 87 % above 4 096"),
    "agnews_imdb": LengthDist(174, 0.75, "IMDB reviews, mean ~230 words, 8 % above 512"),
}
NUM_CLASSES = {"arxiv": 11, "agnews_imdb": 2}
BATCHINGS = ("bucketed", "padded")
ATTENTIONS = ("policy", "efficient")  # a train line's kernels: the trial's policy, or cuDNN's attention off
INPUT_FUSIONS = tuple(f for f in FUSIONS if f != "none")  # the preset's PE is fused at the input

SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
BARRIER_TIMEOUT_S = 900.0  # a packing worker waits this long for the others before giving up


# --------------------------------------------------------------------------------------------------------------
# What is measured
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Settings shared by every configuration of a run (what a packing worker needs to rebuild one)."""

    tiny: bool  # also: one CPU thread per process, so that a smoke run on a busy machine stays a matter of seconds
    steps: int
    warmup: int
    latency_repeats: int
    seed: int
    device: str

    def preset(self, model: str) -> Preset:
        """The model's preset; --tiny shrinks it as `--smoke` does (one layer, d <= 32, max_len <= 128)."""
        return smoke_budget(PRESETS[model]) if self.tiny else PRESETS[model]

    def batch_size(self, model: str) -> int:
        return 4 if self.tiny else self.preset(model).train.batch_size


def make_corpus(plan: Plan, model: str) -> EncodedCorpus:
    """`plan.steps` batches of random token ids with `LENGTHS[model]` lengths, truncated to the model's max_len;
    the same split stands for train, validation and test (only speed is measured)."""
    preset = plan.preset(model)
    rng = np.random.default_rng(plan.seed)
    n = plan.steps * plan.batch_size(model)
    raw = LENGTHS[model].sample(n, rng)
    kept = np.minimum(raw, preset.model.max_len)
    vocab = preset.data.max_vocab
    split = EncodedSplit.random(kept, raw, vocab, NUM_CLASSES[model], rng)
    return EncodedCorpus(train=split, validation=split, test=split, vocab_size=vocab,
                         num_classes=NUM_CLASSES[model], max_len=preset.model.max_len, name=f"bench-{model}",
                         cache_key="")


def batch_indices(split: EncodedSplit, batch_size: int, batching: str, *, train: bool, seed: int, epoch: int,
                  pad_multiple: int, max_len: int) -> list[np.ndarray]:
    """Document indices of each batch: `bucketed` = what `iter_batches` gives (shuffled for training, sorted by
    length for evaluation), `padded` = a random permutation cut into batches."""
    if batching == "bucketed":
        return batch_order(split.lengths, batch_size, shuffle=train, seed=seed, epoch=epoch,
                           pad_multiple=pad_multiple, max_width=max_len)
    perm = np.random.default_rng([seed, epoch]).permutation(len(split))
    return [perm[i:i + batch_size] for i in range(0, len(perm), batch_size)]


def epoch_batches(split: EncodedSplit, batch_size: int, batching: str, *, train: bool, seed: int, epoch: int,
                  max_len: int, device: torch.device, pad_multiple: int) -> Iterator[Batch]:
    """One epoch of batches on `device`: `bucketed` through `iter_batches` itself (training's own path, widths
    rounded up to `pad_multiple`), `padded` as (B, max_len) batches."""
    if batching == "bucketed":
        yield from iter_batches(split, batch_size, shuffle=train, seed=seed, epoch=epoch, device=device,
                                pad_multiple=pad_multiple, max_width=max_len)
        return
    for index in batch_indices(split, batch_size, batching, train=train, seed=seed, epoch=epoch,
                               pad_multiple=pad_multiple, max_len=max_len):
        tokens = np.zeros((len(index), max_len), dtype=np.int64)
        part = pad_batch(split, index)  # (B, T) with T = the longest of the batch
        tokens[:, :part.shape[1]] = part
        yield Batch(*(to_device(torch.from_numpy(a), device) for a in (tokens, split.labels[index], index)))


def padding(split: EncodedSplit, batches: Sequence[np.ndarray], batching: str, max_len: int,
            pad_multiple: int) -> tuple[float, float]:
    """(padded share of all batch cells, share of batches without padding) of one epoch's batches."""
    lengths = split.lengths
    widths = [batch_width(int(lengths[b].max()), pad_multiple, max_len) if batching == "bucketed" else max_len
              for b in batches]
    cells = sum(len(b) * w for b, w in zip(batches, widths))
    unpadded = sum(int(lengths[b].min()) == w for b, w in zip(batches, widths))
    return 1.0 - lengths.sum() / cells, unpadded / len(batches)


def synchronize(device: torch.device) -> None:
    """Wait for the GPU: only around timed regions, so that the clock stops after the work it times."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device: torch.device) -> tuple[float | None, float | None]:
    """(peak allocated, peak reserved) MiB since the last reset; (None, None) on a CPU."""
    if device.type != "cuda":
        return None, None
    return torch.cuda.max_memory_allocated(device) / 2 ** 20, torch.cuda.max_memory_reserved(device) / 2 ** 20


def freeze_heap() -> None:
    """Exempt the imported modules' objects (torch's ~10^6) from later garbage collections: `release` then
    takes milliseconds instead of most of a second."""
    gc.collect()
    gc.freeze()


def release(device: torch.device) -> None:
    """Free a finished configuration's memory, so that the next one (or another process) starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _reason(caught: list[warnings.WarningMessage], exc: Exception) -> str:
    """PyTorch's reasons for refusing a forced kernel: its warnings (without the C++ source location), then the
    error."""
    lines = [str(w.message).split(" (Triggered internally")[0].strip() for w in caught]
    return "; ".join(dict.fromkeys(lines + [str(exc).splitlines()[0]]))[:400]


@torch.no_grad()
def sdpa_backends(trainer: Trainer, batch: Batch) -> tuple[list[str], dict[str, str]]:
    """The SDPA kernels that accept the model's attention call (one eval-mode forward of `batch` with only that
    kernel allowed), and PyTorch's reason for each one refused. Eval mode, because on a CPU training runs
    dropout through pefusion's own kernel and never asks SDPA; the mask and the dtype decide either way."""
    trainer.model.eval()
    ok, refused = [], {}
    for name, backend in SDPA_BACKENDS.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([backend]), trainer.autocast():
                    trainer.model(batch.tokens)
                ok.append(name)
            except RuntimeError as exc:
                refused[name] = _reason(caught, exc)
    return ok, refused


def run_steps(trainer: Trainer, batches: Iterator[Batch]) -> int:
    """Training steps on `batches` (host batch preparation included, as in training); returns the samples. Ends
    with the GPU synchronised, so that a clock around it counts the GPU's work."""
    trainer.model.train()
    n = 0
    for batch in batches:
        trainer.step(batch)
        n += len(batch.labels)
    synchronize(trainer.device)
    return n


def build(plan: Plan, model: str, fusion: str, precision: str, corpus: EncodedCorpus) -> Trainer:
    """The preset's model with `fusion`, its optimiser, and the training protocol at `precision`."""
    preset = plan.preset(model)
    model_cfg = dataclasses.replace(preset.model, fusion=fusion)
    train_cfg = dataclasses.replace(preset.train, precision=precision, seed=plan.seed, device=plan.device,
                                    batch_size=plan.batch_size(model), timing_repeats=plan.latency_repeats,
                                    timing_warmup=1)
    return Trainer(model_cfg, train_cfg, corpus, device=torch.device(plan.device))


def describe(plan: Plan, model: str, trainer: Trainer) -> dict[str, Any]:
    """The fields every line of a configuration carries."""
    device, cfg, placement = trainer.device, trainer.model_cfg, trainer.placement
    return {"model": model, "pe_type": cfg.pe_type, "fusion": cfg.fusion, "precision": trainer.train_cfg.precision,
            "precision_resolved": placement.precision, "pad_multiple": placement.pad_multiple,
            "attention_policy": placement.attention.name, "device": device.type, "device_name": device_name(device),
            "torch": torch.__version__, "d_model": cfg.d_model, "num_layers": cfg.num_layers, "max_len": cfg.max_len,
            "batch_size": trainer.train_cfg.batch_size, "params": sum(p.numel() for p in trainer.model.parameters()),
            "steps": plan.steps, "warmup": plan.warmup,
            "fp32_matmul_precision": torch.backends.cuda.matmul.fp32_precision}


def warm_up(plan: Plan, trainer: Trainer, batching: str) -> dict[str, int]:
    """`plan.warmup` untimed training steps (epoch 0's first batches, cycled), under the profiler: the attention
    kernels they ran."""
    split, cfg = trainer.corpus.train, trainer.train_cfg
    batches = list(itertools.islice(epoch_batches(split, cfg.batch_size, batching, train=True, seed=plan.seed,
                                                  epoch=0, max_len=trainer.model_cfg.max_len, device=trainer.device,
                                                  pad_multiple=trainer.placement.pad_multiple), plan.warmup))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_steps(trainer, (batches[i % len(batches)] for i in range(plan.warmup)))
    return attention_kernels(prof.events())


def measure_train(plan: Plan, model: str, fusion: str, precision: str, batching: str, attention: str,
                  corpus: EncodedCorpus) -> dict[str, Any]:
    """One `train` line: the first epoch, warm-up, one timed steady epoch, memory, kernels, latency (see the module
    docstring). `attention`: the trial's policy, or `efficient` (cuDNN's attention off, the policy before it was
    allowed where widths are few), to compare the two in one run."""
    device = torch.device(plan.device)
    trainer = build(plan, model, fusion, precision, corpus)
    if attention == "efficient" and device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)  # until the next configuration's trainer sets its policy
    split, cfg, max_len = corpus.train, trainer.train_cfg, trainer.model_cfg.max_len
    multiple = trainer.placement.pad_multiple
    line = {"bench": "train", **describe(plan, model, trainer), "batching": batching, "attention": attention}
    pad_share, unpadded = padding(split, batch_indices(split, cfg.batch_size, batching, train=True, seed=plan.seed,
                                                       epoch=1, pad_multiple=multiple, max_len=max_len),
                                  batching, max_len, multiple)
    line.update(padding_fraction=pad_share, unpadded_batch_fraction=unpadded, oom=False)
    oom = ""

    def epoch(number: int) -> int:
        return run_steps(trainer, epoch_batches(split, cfg.batch_size, batching, train=True, seed=plan.seed,
                                                epoch=number, max_len=max_len, device=device, pad_multiple=multiple))

    try:
        reset_peak_memory(device)
        _, first_s, _ = timed(lambda: epoch(0))  # every shape new: plans, the CUDA context, cuBLAS's handles
        kernels = warm_up(plan, trainer, batching)
        samples, wall, _ = timed(lambda: epoch(1))
        alloc, reserved = peak_memory_mib(device)
        eval_batches = list(epoch_batches(split, cfg.batch_size, batching, train=False, seed=plan.seed, epoch=0,
                                          max_len=max_len, device=device, pad_multiple=multiple))
        ok, refused = sdpa_backends(trainer, eval_batches[0])
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof, trainer.autocast():
            trainer.model(eval_batches[0].tokens)
        lat_mean, lat_std = trainer.forward_latency(eval_batches)
    except torch.OutOfMemoryError as exc:
        oom = str(exc).splitlines()[0]
    trainer = None  # the model, its optimiser state and gradients go before the next configuration
    release(device)
    if oom:
        return {**line, "oom": True, "error": oom}
    mean_tokens = float(split.lengths.mean())
    line.update(first_epoch_s=first_s, first_epoch_samples_per_s=samples / first_s,
                first_over_steady=first_s / wall, samples=samples, train_s=wall, train_samples_per_s=samples / wall,
                train_tokens_per_s=samples * mean_tokens / wall, train_ms_per_step=1000.0 * wall / plan.steps,
                peak_mem_alloc_mib=alloc, peak_mem_reserved_mib=reserved, attention_kernels=kernels,
                sdpa_backends_ok=ok, sdpa_backends_refused=refused, latency_ms_per_sample=lat_mean,
                latency_ms_std=lat_std, latency_attention_kernels=attention_kernels(prof.events()))
    return line


# --------------------------------------------------------------------------------------------------------------
# Shapes: a step on new lengths against a step on lengths seen
# --------------------------------------------------------------------------------------------------------------

# `pefusion`: what a trial does (widths rounded up to its pad multiple, its attention policy: cuDNN's attention where
# the widths are few); `pytorch`: the naive way, every width as the lengths come, under PyTorch's own kernel order (on Hopper
# since torch 2.11, cuDNN's attention first, which builds an execution graph per new shape).
SHAPE_VARIANTS = ("pefusion", "pytorch")


def shape_lengths(max_len: int, n: int) -> list[int]:
    """`n` distinct document lengths spread over [max_len/5, 4·max_len/5): for max_len 512 and n 60, 102..404."""
    lo, hi = max_len // 5, 4 * max_len // 5
    return sorted({lo + (hi - lo) * i // n for i in range(n)})


def measure_shapes(plan: Plan, model: str, precision: str, variant: str, n: int,
                   corpus: EncodedCorpus) -> dict[str, Any]:
    """One `shapes` line: after warm-up steps at max_len, `n` training steps whose batches have `n` distinct
    lengths (every document of a batch that long), then the same `n` again: ms per step of each pass. A kernel
    planned per shape is paid on the first pass only."""
    trainer = build(plan, model, "add", precision, corpus)
    device, max_len = trainer.device, trainer.model_cfg.max_len
    multiple = trainer.placement.pad_multiple if variant == "pefusion" else 1
    if variant == "pytorch" and device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(True)  # PyTorch's default, which the trial's policy may turn off
    rng = np.random.default_rng(plan.seed)
    batch_size, vocab = plan.batch_size(model), corpus.vocab_size

    def batch(length: int) -> Batch:
        tokens = np.zeros((batch_size, batch_width(length, multiple, max_len)), dtype=np.int64)
        tokens[:, :length] = rng.integers(2, vocab, (batch_size, length))
        labels = rng.integers(0, corpus.num_classes, batch_size)
        return Batch(*(to_device(torch.from_numpy(a), device) for a in (tokens, labels, np.arange(batch_size))))

    lengths = shape_lengths(max_len, n)
    trainer.model.train()
    line = {"bench": "shapes", **describe(plan, model, trainer), "variant": variant, "lengths": len(lengths),
            "widths": len({batch_width(t, multiple, max_len) for t in lengths}), "oom": False}
    try:
        run_steps(trainer, (batch(max_len) for _ in range(plan.warmup)))  # the CUDA context, cuBLAS's handles
        passes = [timed(lambda: run_steps(trainer, (batch(t) for t in lengths)))[1] for _ in ("new", "seen")]
    except torch.OutOfMemoryError as exc:
        line.update(oom=True, error=str(exc).splitlines()[0])
        passes = []
    trainer = None
    release(device)
    if passes:
        new, seen = (1000.0 * s / len(lengths) for s in passes)
        line.update(new_ms_per_step=new, seen_ms_per_step=seen, new_over_seen=new / seen)
    return line


# --------------------------------------------------------------------------------------------------------------
# Stacked: the seeds of a cell trained as one model in one process, against one trial
# --------------------------------------------------------------------------------------------------------------


def measure_stacked(plan: Plan, model: str, precision: str, seeds: int, corpus: EncodedCorpus) -> dict[str, Any]:
    """One `stacked` line: one trial of the model (fusion add), then `seeds` seeds of it trained together as one
    stacked model (`pefusion.fusion.stacked`, each seed its own data order), each after warm-up steps for one
    timed epoch of the corpus: samples/s of the one trial and of the seeds together, their ratio, and the peak
    memory of each; or, where either fails, the error (`error`, and `oom` for running out of memory)."""
    device = torch.device(plan.device)
    trainer = build(plan, model, "add", precision, corpus)
    line = {"bench": "stacked", **describe(plan, model, trainer), "seeds": seeds, "oom": False}
    model_cfg, train_cfg, n = trainer.model_cfg, trainer.train_cfg, len(corpus.train)
    try:
        reset_peak_memory(device)
        warm_up(plan, trainer, "bucketed")
        samples, trial_s, _ = timed(lambda: run_steps(trainer, trainer.batches(corpus.train, shuffle=True)))
        trial_alloc, trial_reserved = peak_memory_mib(device)
        trainer = None
        release(device)
        reset_peak_memory(device)
        stacked = StackedTrainer(model_cfg, train_cfg, corpus, list(range(plan.seed, plan.seed + seeds)), device)

        def epoch(steps: int | None) -> int:
            for _ in itertools.islice(stacked.train_steps(), steps):
                pass
            synchronize(device)
            return seeds * n

        epoch(plan.warmup)
        stacked_samples, stacked_s, _ = timed(lambda: epoch(None))
        alloc, reserved = peak_memory_mib(device)
    except torch.OutOfMemoryError as exc:
        line.update(oom=True, error=str(exc).splitlines()[0])
        return line
    except Exception as exc:  # the line says why, and the benchmark's other lines still run
        line.update(error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return line
    finally:
        trainer = stacked = None
        release(device)
    line.update(trial_samples_per_s=samples / trial_s, samples_per_s=stacked_samples / stacked_s,
                speedup=(stacked_samples / stacked_s) / (samples / trial_s),
                trial_peak_mem_alloc_mib=trial_alloc, trial_peak_mem_reserved_mib=trial_reserved,
                peak_mem_alloc_mib=alloc, peak_mem_reserved_mib=reserved)
    return line


def corpus_line(plan: Plan, model: str, corpus: EncodedCorpus) -> dict[str, Any]:
    split = corpus.train
    return {"bench": "corpus", "model": model, "length_dist": LENGTHS[model].describe(), "seed": plan.seed,
            "n_docs": len(split), "max_len": corpus.max_len, "mean_tokens": float(split.lengths.mean()),
            "truncated_fraction": float((split.raw_lengths > corpus.max_len).mean()),
            "doc_words": split.raw_lengths.tolist()}


# --------------------------------------------------------------------------------------------------------------
# Packing: K processes training at once on one device
# --------------------------------------------------------------------------------------------------------------


def pack_worker(rank: int, k: int, plan: Plan, configs: list[tuple[str, str, str]], barrier: Any,
                results: Any) -> None:
    """One of K processes: for each configuration, build and warm up, wait for the others, train one timed epoch,
    wait again (so that no configuration's timing overlaps another's set-up), put a result on `results`."""
    torch.set_num_threads(1 if plan.tiny else max(1, (os.cpu_count() or 1) // k))  # K processes share the cores
    device = torch.device(plan.device)
    freeze_heap()
    corpora: dict[str, EncodedCorpus] = {}
    for i, (model, fusion, precision) in enumerate(configs):
        corpus = corpora.setdefault(model, make_corpus(plan, model))
        out: dict[str, Any] = {"config": i, "rank": rank, "oom": False, "error": ""}
        trainer = None
        try:
            reset_peak_memory(device)
            trainer = build(plan, model, fusion, precision, corpus)
            warm_up(plan, trainer, "bucketed")
        except torch.OutOfMemoryError:
            out["oom"] = True
        except Exception as exc:  # recorded in the line: one broken configuration must not stop the others
            out["error"] = f"{type(exc).__name__}: {exc}"
        try:
            barrier.wait(BARRIER_TIMEOUT_S)
            if trainer is not None and not out["oom"] and not out["error"]:
                cfg = trainer.train_cfg
                start = time.monotonic()
                out["samples"] = run_steps(trainer, epoch_batches(
                    corpus.train, cfg.batch_size, "bucketed", train=True, seed=plan.seed, epoch=1,
                    max_len=trainer.model_cfg.max_len, device=device, pad_multiple=trainer.placement.pad_multiple))
                out.update(start=start, end=time.monotonic())
                out["peak_alloc"], out["peak_reserved"] = peak_memory_mib(device)
        except torch.OutOfMemoryError:
            out["oom"] = True
        except threading.BrokenBarrierError:
            out["error"] = "another process of this packing failed; stopped"
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            trainer = None
            release(device)
        try:
            barrier.wait(BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            out["error"] = out["error"] or "another process of this packing failed; stopped"
        results.put(out)
        if out["error"].startswith("another process"):
            return


def run_packing(plan: Plan, k: int, configs: list[tuple[str, str, str]]) -> list[list[dict[str, Any]]]:
    """Spawn K workers over `configs`; per configuration, the K workers' results (a worker that died is an
    error result)."""
    ctx = mp.get_context("spawn")  # a fresh interpreter per process: CUDA cannot be shared across fork
    barrier, results = ctx.Barrier(k), ctx.Queue()
    procs = [ctx.Process(target=pack_worker, args=(rank, k, plan, configs, barrier, results), daemon=True)
             for rank in range(k)]
    for proc in procs:
        proc.start()
    got: list[list[dict[str, Any]]] = [[] for _ in configs]
    expected = k * len(configs)
    received = 0
    while received < expected:
        try:
            out = results.get(timeout=1.0)
        except queue_module.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) or all(p.exitcode is not None for p in procs):
                barrier.abort()  # a worker died: the others stop instead of waiting for it
                if all(p.exitcode is not None for p in procs) and results.empty():
                    break
            continue
        got[out["config"]].append(out)
        received += 1
    for proc in procs:
        proc.join(timeout=30)
    codes = [p.exitcode for p in procs]
    for outs in got:
        missing = k - len(outs)
        outs += [{"oom": False, "error": f"process exited with code {codes}"}] * missing
    return got


def packing_line(k: int, outs: list[dict[str, Any]], corpus: EncodedCorpus,
                 trainer_fields: dict[str, Any]) -> dict[str, Any]:
    """The `packing` line of one configuration from its K workers' results."""
    outs = sorted(outs, key=lambda o: o.get("rank", len(outs)))
    done = [o for o in outs if "samples" in o]
    span = (max(o["end"] for o in done) - min(o["start"] for o in done)) if done else 0.0
    samples = sum(o["samples"] for o in done)
    mean_tokens = float(corpus.train.lengths.mean())
    rate = samples / span if span > 0 else None
    return {"bench": "packing", **trainer_fields, "k": k, "samples_per_s": rate,
            "tokens_per_s": None if rate is None else rate * mean_tokens, "wall_s": span,
            "process_samples_per_s": [o["samples"] / (o["end"] - o["start"]) if "samples" in o else None
                                      for o in outs],
            "process_peak_mem_alloc_mib": [o.get("peak_alloc") for o in outs],
            "process_peak_mem_reserved_mib": [o.get("peak_reserved") for o in outs],
            "oom": any(o["oom"] for o in outs), "oom_processes": sum(o["oom"] for o in outs),
            "errors": sorted({o["error"] for o in outs if o["error"]})}


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: the GPU if one is visible, else the CPU")
    ap.add_argument("--tiny", action="store_true",
                    help="seconds on a CPU: the presets shrunk as --smoke shrinks them, batches of 4, 2 timed steps "
                         "after 1 warm-up step, 1 latency pass, fusion add, K in (1, 2), one CPU "
                         "thread per process; a check that the benchmark runs, not a measurement")
    ap.add_argument("--models", type=csv_list(), default=list(LENGTHS), help=f"from {', '.join(LENGTHS)}")
    ap.add_argument("--fusions", type=csv_list(), help=f"default: all input fusions ({', '.join(INPUT_FUSIONS)})")
    ap.add_argument("--precisions", type=csv_list(),
                    help="from auto (a trial's default: bf16 on a GPU that has it, else fp32), fp32, tf32, bf16 "
                         "(default: auto,fp32; with --tiny auto,bf16)")
    ap.add_argument("--batchings", type=csv_list(), default=list(BATCHINGS), help="bucketed (training's), padded")
    ap.add_argument("--attention", type=csv_list(), default=["policy"],
                    help="train lines' attention kernels: policy (a trial's), efficient (cuDNN's attention off: "
                         "the memory-efficient kernel), e.g. policy,efficient to compare them in one run")
    ap.add_argument("--packing", type=csv_list(int), help="processes at once, K (default 1,2,4,8)")
    ap.add_argument("--packing-fusions", type=csv_list(),
                    help="fusions measured packed (default: add; the fusion is a small part of a step)")
    ap.add_argument("--shapes", type=int,
                    help="distinct lengths of the `shapes` lines (new lengths, then seen ones; default 60, with --tiny "
                         "4; 0: no shapes lines)")
    ap.add_argument("--stacked", type=csv_list(int),
                    help="seeds trained together in the `stacked` lines, each value a line per model and precision "
                         "(default 3,5; with --tiny 2; 0: no stacked lines)")
    ap.add_argument("--steps", type=int, help="timed training steps = batches of the corpus (default 20)")
    ap.add_argument("--warmup", type=int, help="untimed steps before them, profiled for the kernel (default 3)")
    ap.add_argument("--latency-repeats", type=int, help="timed eval passes over the corpus (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", metavar="FILE", help="also write the lines to FILE")
    args = ap.parse_args(argv)
    tiny = args.tiny
    for key, full, small in (("fusions", list(INPUT_FUSIONS), ["add"]), ("packing", [1, 2, 4, 8], [1, 2]),
                             ("precisions", ["auto", "fp32"], ["auto", "bf16"]), ("shapes", 60, 4),
                             ("stacked", [3, 5], [2]),
                             ("packing_fusions", ["add"], ["add"]), ("steps", 20, 2), ("warmup", 3, 1),
                             ("latency_repeats", 3, 1)):
        if getattr(args, key) is None:
            setattr(args, key, small if tiny else full)
    return args


def check_args(args: argparse.Namespace) -> None:
    """A ConfigError naming the flag and the allowed values for anything out of range."""
    for flag, values, allowed in (("--models", args.models, tuple(LENGTHS)), ("--fusions", args.fusions, INPUT_FUSIONS),
                                  ("--packing-fusions", args.packing_fusions, INPUT_FUSIONS),
                                  ("--precisions", args.precisions, PRECISIONS),
                                  ("--batchings", args.batchings, BATCHINGS),
                                  ("--attention", args.attention, ATTENTIONS)):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ConfigError(f"{flag} {','.join(bad) or '(empty)'} is not allowed; choose from {', '.join(allowed)}")
    if args.shapes < 0:
        raise ConfigError(f"--shapes {args.shapes} must be >= 0 (0: no shapes lines)")
    if any(s < 0 for s in args.stacked):
        raise ConfigError(f"--stacked {','.join(map(str, args.stacked))}: seeds must be >= 0 (0: no stacked lines)")
    for flag, value, why in (("--steps", args.steps, ""), ("--latency-repeats", args.latency_repeats, ""),
                             ("--warmup", args.warmup, " (the warm-up steps show which attention kernel runs)")):
        if value < 1:
            raise ConfigError(f"{flag} {value} must be >= 1{why}")
    if any(k < 1 for k in args.packing):
        raise ConfigError(f"--packing {','.join(map(str, args.packing))}: every K must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu (or auto)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    plan = Plan(tiny=args.tiny, steps=args.steps, warmup=args.warmup, latency_repeats=args.latency_repeats,
                seed=args.seed, device=device)
    if args.tiny:
        torch.set_num_threads(1)
    freeze_heap()
    out = open(args.json_out, "w", encoding="utf-8") if args.json_out else None
    try:
        corpora = {model: make_corpus(plan, model) for model in args.models}
        for model, corpus in corpora.items():
            emit(corpus_line(plan, model, corpus), out)
            for fusion in args.fusions:
                for precision in args.precisions:
                    for batching, attention in itertools.product(args.batchings, args.attention):
                        emit(measure_train(plan, model, fusion, precision, batching, attention, corpus), out)
            for precision in args.precisions:
                for variant in SHAPE_VARIANTS if args.shapes else ():
                    emit(measure_shapes(plan, model, precision, variant, args.shapes, corpus), out)
                for seeds in (s for s in args.stacked if s):
                    emit(measure_stacked(plan, model, precision, seeds, corpus), out)
        configs = [(m, f, p) for m in args.models for f in args.packing_fusions for p in args.precisions]
        fields = {}
        for config in configs:  # what each line says about its configuration, from a trainer built here
            trainer = build(plan, *config, corpora[config[0]])
            fields[config] = describe(plan, config[0], trainer)
            del trainer
        release(torch.device(device))
        for k in args.packing:
            for config, outs in zip(configs, run_packing(plan, k, configs)):
                emit(packing_line(k, outs, corpora[config[0]], fields[config]), out)
    finally:
        if out is not None:
            out.close()
    return 0
