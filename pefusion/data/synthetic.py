"""The bundled synthetic corpus: a classification task that only word ORDER can solve.

Every document starts with the same marker words, one block of repeats per class (num_classes blocks filling the
first SIGNAL_SPAN tokens), in a random order; the class is WHICH marker comes first. Filler words follow, drawn
from one Zipf-like distribution for every class, and document lengths are independent of the class. So all
classes share one distribution of word counts: a bag-of-words model cannot beat chance, and a transformer
without position information (pe_type='none', mean pooling) is blind to it by construction, while a tiny
encoder with any PE learns it in a few epochs.

    class 2:  "charlie charlie ... alpha alpha ... delta delta ... bravo bravo ... w17 w3 w250 ..."

The signal lies in the first SIGNAL_SPAN tokens, so a model that truncates documents to max_len >= SIGNAL_SPAN
sees all of it; lengths still span MIN_LENGTH..MAX_LENGTH tokens (log-uniform, stratified) for the length-bucket
analysis. Same schema as the real data: records {"text": str, "label": int}.
"""
from __future__ import annotations

from typing import Any

import numpy as np

# Bump when the generated documents change for a given seed: the token-id cache key includes it.
GENERATOR_VERSION = 1
NUM_CLASSES = 4
MIN_LENGTH, MAX_LENGTH = 32, 2048
SIGNAL_SPAN = 32  # the marker blocks fill tokens [0, SIGNAL_SPAN)
FILLER_VOCAB = 1000
MARKER_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett",
                "kilo", "lima", "mike", "november", "oscar", "papa")
SPLIT_NAMES = ("train", "validation", "test")


def default_settings() -> dict[str, Any]:
    """The generator's fixed settings (part of the token-id cache key)."""
    return {"num_classes": NUM_CLASSES, "min_length": MIN_LENGTH, "max_length": MAX_LENGTH,
            "signal_span": SIGNAL_SPAN, "filler_vocab": FILLER_VOCAB}


def _generate_split(n: int, rng: np.random.Generator, num_classes: int) -> list[dict[str, Any]]:
    # Lengths: log-uniform between MIN_LENGTH and MAX_LENGTH, stratified so that both ends occur in every split.
    lengths = np.rint(np.geomspace(MIN_LENGTH, MAX_LENGTH, max(n, 2))).astype(np.int64)[:n]
    lengths = rng.permutation(lengths)
    # Balanced classes, independent of length.
    labels = rng.permutation(np.arange(n) % num_classes)
    # Fillers: a Zipf-like distribution, so the vocabulary has rare words too (some fall below min_freq -> UNK).
    weights = 1.0 / (np.arange(FILLER_VOCAB) + 10.0)
    words = np.array([f"w{i}" for i in range(FILLER_VOCAB)] + list(MARKER_WORDS[:num_classes]), dtype=object)
    tokens = rng.choice(FILLER_VOCAB, size=int(lengths.sum()), p=weights / weights.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    # The signal: num_classes blocks of `block` tokens at the start, one block per marker word; the class's
    # marker fills the first block, the other markers the next blocks in a random order.
    block = SIGNAL_SPAN // num_classes
    docs = []
    for i in range(n):
        doc = tokens[offsets[i]:offsets[i + 1]]
        order = np.concatenate([[labels[i]], rng.permutation(np.delete(np.arange(num_classes), labels[i]))])
        doc[:block * num_classes] = FILLER_VOCAB + np.repeat(order, block)
        docs.append({"text": " ".join(words[doc]), "label": int(labels[i])})
    return docs


def generate_synthetic_corpus(n_train: int = 2000, n_val: int = 500, n_test: int = 500, seed: int = 0,
                              num_classes: int = NUM_CLASSES) -> dict[str, list[dict[str, Any]]]:
    """{"train" | "validation" | "test": [{"text": str, "label": int}, ...]}, deterministic for `seed`.
    Each split has its own random stream, so changing one split's size leaves the others unchanged."""
    if not 2 <= num_classes <= len(MARKER_WORDS):
        raise ValueError(f"num_classes={num_classes} is out of range; it must be in [2, {len(MARKER_WORDS)}]")
    streams = np.random.SeedSequence(seed).spawn(len(SPLIT_NAMES))
    sizes = (n_train, n_val, n_test)
    return {split: _generate_split(n, np.random.default_rng(stream), num_classes)
            for split, n, stream in zip(SPLIT_NAMES, sizes, streams)}
