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
SIGNAL_SPAN = 32  # order: the marker blocks fill tokens [0, SIGNAL_SPAN)
SPREAD_EVERY = 32  # spread: one vote (a marker block) per SPREAD_EVERY tokens
SPREAD_REPEAT = 2  # spread: copies of each marker in a block
SPREAD_AGREE = 0.5  # spread: probability that a vote names the class
RELATIVE_EVERY = 32  # relative: one marker pair per RELATIVE_EVERY tokens
RELATIVE_MAX_GAP = 16  # relative: the two markers of a pair are 1..RELATIVE_MAX_GAP tokens apart
TASKS = ("order", "spread", "relative")
FILLER_VOCAB = 1000
MARKER_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett",
                "kilo", "lima", "mike", "november", "oscar", "papa")
SPLIT_NAMES = ("train", "validation", "test")


def default_settings(task: str = "order") -> dict[str, Any]:
    """The generator's fixed settings for `task` (part of the token-id cache key)."""
    settings = {"num_classes": NUM_CLASSES, "min_length": MIN_LENGTH, "max_length": MAX_LENGTH,
                "filler_vocab": FILLER_VOCAB}
    if task == "order":
        return {**settings, "signal_span": SIGNAL_SPAN}  # the key the order corpus has always had
    if task == "spread":
        return {**settings, "task": task, "spread_every": SPREAD_EVERY, "spread_repeat": SPREAD_REPEAT,
                "spread_agree": SPREAD_AGREE}
    return {**settings, "task": task, "relative_every": RELATIVE_EVERY, "relative_max_gap": RELATIVE_MAX_GAP}


def _order_signal(doc: np.ndarray, label: int, rng: np.random.Generator, num_classes: int) -> None:
    """num_classes blocks of SIGNAL_SPAN // num_classes repeats at the start; the class's marker fills the first."""
    block = SIGNAL_SPAN // num_classes
    order = np.concatenate([[label], rng.permutation(np.delete(np.arange(num_classes), label))])
    doc[:block * num_classes] = FILLER_VOCAB + np.repeat(order, block)


def _spread_signal(doc: np.ndarray, label: int, rng: np.random.Generator, num_classes: int) -> None:
    """One vote at the start of every whole SPREAD_EVERY-token window: a block of the num_classes markers,
    SPREAD_REPEAT of each, led by the voted marker and the rest in a random order (the order task's signal, once
    per window). A vote names the class with probability
    SPREAD_AGREE, else another class at random; the class always wins a strict plurality, so reading every vote
    decides it, and a model that sees only the first max_len tokens reads only some of them."""
    k, c = max(1, len(doc) // SPREAD_EVERY), num_classes
    votes = np.where(rng.random(k) < SPREAD_AGREE, label, (label + rng.integers(1, c, size=k)) % c)
    counts = np.bincount(votes, minlength=c)
    while counts[label] <= np.delete(counts, label).max():  # turn a random dissenting vote into the class
        j = rng.choice(np.flatnonzero(votes != label))
        counts[votes[j]] -= 1
        votes[j], counts[label] = label, counts[label] + 1
    b = c * SPREAD_REPEAT
    for start, vote in zip(range(0, k * SPREAD_EVERY, SPREAD_EVERY), votes):
        order = np.concatenate([[vote], rng.permutation(np.delete(np.arange(c), vote))])
        doc[start:start + b] = FILLER_VOCAB + np.repeat(order, SPREAD_REPEAT)


def _relative_signal(doc: np.ndarray, label: int, rng: np.random.Generator, num_classes: int) -> None:
    """In every whole RELATIVE_EVERY-token window, one 'alpha' and one 'bravo' at a random offset: label % 2 says
    which comes first, label // 2 which of num_classes // 2 equal bins of 1..RELATIVE_MAX_GAP holds their
    distance. Absolute positions carry nothing; the pair's order and distance carry the class."""
    width = RELATIVE_MAX_GAP // (num_classes // 2)
    first, second = FILLER_VOCAB + np.array([0, 1] if label % 2 == 0 else [1, 0])
    for window in range(0, len(doc) // RELATIVE_EVERY * RELATIVE_EVERY, RELATIVE_EVERY):
        gap = int(rng.integers(1, width + 1)) + (label // 2) * width
        start = window + int(rng.integers(0, RELATIVE_EVERY - gap))
        doc[start], doc[start + gap] = first, second


_SIGNALS = {"order": _order_signal, "spread": _spread_signal, "relative": _relative_signal}


def _generate_split(n: int, rng: np.random.Generator, num_classes: int, task: str) -> list[dict[str, Any]]:
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
    signal = _SIGNALS[task]
    docs = []
    for i in range(n):
        doc = tokens[offsets[i]:offsets[i + 1]]
        signal(doc, int(labels[i]), rng, num_classes)
        docs.append({"text": " ".join(words[doc]), "label": int(labels[i])})
    return docs


def generate_synthetic_corpus(n_train: int = 2000, n_val: int = 500, n_test: int = 500, seed: int = 0,
                              num_classes: int = NUM_CLASSES, task: str = "order") -> dict[str, list[dict[str, Any]]]:
    """{"train" | "validation" | "test": [{"text": str, "label": int}, ...]}, deterministic for (`seed`, `task`).
    Each split has its own random stream, so changing one split's size leaves the others unchanged."""
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not a synthetic task; choose one of: {', '.join(TASKS)}")
    if not 2 <= num_classes <= len(MARKER_WORDS):
        raise ValueError(f"num_classes={num_classes} is out of range; it must be in [2, {len(MARKER_WORDS)}]")
    if task == "relative" and num_classes % 2:
        raise ValueError(f"task='relative' pairs an order bit with distance bins: num_classes={num_classes} "
                         f"must be even")
    if task == "spread" and num_classes * SPREAD_REPEAT > SPREAD_EVERY:
        raise ValueError(f"task='spread' puts a block of {SPREAD_REPEAT} x num_classes markers in every "
                         f"{SPREAD_EVERY} tokens: num_classes={num_classes} must be <= {SPREAD_EVERY // SPREAD_REPEAT}")
    streams = np.random.SeedSequence(seed).spawn(len(SPLIT_NAMES))
    sizes = (n_train, n_val, n_test)
    return {split: _generate_split(n, np.random.default_rng(stream), num_classes, task)
            for split, n, stream in zip(SPLIT_NAMES, sizes, streams)}
