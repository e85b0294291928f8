"""Benchmark document sets: `make_documents` writes the paper's file layout filled with Zipf-distributed words of
chosen lengths (`scripts/bench_train.py --make-data`); only speed is measured on them, so their labels are random."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


def make_documents(directory: Path, n_docs: int, n_eval: int, min_words: int, max_words: int, length_dist: str,
                   num_classes: int, seed: int) -> dict[str, float]:
    """Write train/validation/test_clean.jsonl (the paper's layout) of Zipf-distributed words with lengths drawn
    uniformly or log-uniformly from [min_words, max_words]; labels are random (only speed is measured here)."""
    rng = np.random.default_rng(seed)
    vocab_size = 50_000
    weights = 1.0 / (np.arange(vocab_size) + 2.7) ** 1.1  # Zipf-Mandelbrot, roughly like English word counts
    words = np.array([f"w{i}" for i in range(vocab_size)], dtype=object)
    directory.mkdir(parents=True, exist_ok=True)
    stats = {}
    for split, n in (("train", n_docs), ("validation", n_eval), ("test", n_eval)):
        if length_dist == "uniform":
            lengths = rng.integers(min_words, max_words + 1, size=n)
        else:
            lengths = np.rint(np.exp(rng.uniform(math.log(min_words), math.log(max_words), size=n))).astype(int)
        tokens = rng.choice(vocab_size, size=int(lengths.sum()), p=weights / weights.sum())
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        labels = rng.integers(num_classes, size=n)
        with open(directory / f"{split}_clean.jsonl", "w", encoding="utf-8") as f:
            for i in range(n):
                text = " ".join(words[tokens[offsets[i]:offsets[i + 1]]])
                f.write(json.dumps({"text": text, "label": int(labels[i])}) + "\n")
        stats[f"{split}_docs"] = n
        if split == "train":
            stats["train_mean_words"] = float(lengths.mean())
    return stats
