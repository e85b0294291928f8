"""The encoded corpus as numpy arrays: `EncodedSplit` (one split: token ids with offsets, labels, lengths before
truncation) and `EncodedCorpus` (the three splits with what a model needs to know about them).

A module of its own because every other data layer speaks these types: the cache stores and restores them,
batching gathers from them, `corpus.load_corpus` builds them, and training reads them. Holding only data and
accessors, it depends on nothing of pefusion, so none of those layers has to import another to name them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class EncodedSplit:
    """One split as flat numpy arrays: document i is `ids[offsets[i]:offsets[i+1]]`."""

    ids: np.ndarray  # int32 (total_tokens,) every document truncated to max_len
    offsets: np.ndarray  # int64 (N+1,)
    labels: np.ndarray  # int64 (N,)
    raw_lengths: np.ndarray  # int64 (N,) tokens before truncation, for the length buckets

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens kept per document, after truncation. (N,)"""
        return np.diff(self.offsets)

    def doc(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]:self.offsets[i + 1]]

    @classmethod
    def random(cls, kept: np.ndarray, raw_lengths: np.ndarray, vocab_size: int, num_classes: int,
               rng: np.random.Generator) -> EncodedSplit:
        """Documents of random token ids with `kept` tokens each (`raw_lengths` before truncation) and random
        labels: for what depends on shapes only (the GPU probe's memory, the GPU benchmark's speed)."""
        return cls(ids=rng.integers(2, vocab_size, int(kept.sum()), dtype=np.int32),  # 0 = PAD, 1 = UNK
                   offsets=np.concatenate([[0], np.cumsum(kept)]).astype(np.int64),
                   labels=rng.integers(0, num_classes, len(kept), dtype=np.int64),
                   raw_lengths=np.asarray(raw_lengths, dtype=np.int64))


@dataclass
class EncodedCorpus:
    train: EncodedSplit
    validation: EncodedSplit
    test: EncodedSplit
    vocab_size: int
    num_classes: int
    max_len: int
    name: str  # the source's name (sources.Source.name), recorded as the `dataset` param
    cache_key: str
    label_names: tuple[str, ...] = ()  # label_names[i] is the original label of class id i
    meta: dict[str, Any] = field(default_factory=dict)  # the cache's meta.json: counts, dropped docs, source

    def split(self, name: str) -> EncodedSplit:
        return getattr(self, name)
