"""What every line of the GPU benchmark trains on: the run's settings (`Plan`: steps, warm-up, seed, device, the
presets as --tiny shrinks them), a corpus of random token ids whose lengths follow the dataset's (`LENGTHS`; speed
does not depend on which ids), and one epoch of its batches, `bucketed` as training makes them or `padded` to
max_len as the paper notebook did. Kept apart from the measurements so that each of them, and a packing worker
in its own process, rebuilds the same documents from the plan alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from pefusion.data.batching import Batch, batch_order, batch_width, iter_batches, pad_batch, to_device
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.fusion.config import PRESETS, Preset, smoke_budget


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


def corpus_line(plan: Plan, model: str, corpus: EncodedCorpus) -> dict[str, Any]:
    """The `corpus` line of a model: its length distribution and every document's length before truncation."""
    split = corpus.train
    return {"bench": "corpus", "model": model, "length_dist": LENGTHS[model].describe(), "seed": plan.seed,
            "n_docs": len(split), "max_len": corpus.max_len, "mean_tokens": float(split.lengths.mean()),
            "truncated_fraction": float((split.raw_lengths > corpus.max_len).mean()),
            "doc_words": split.raw_lengths.tolist()}
