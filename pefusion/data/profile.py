"""What a sweep's `--plan` needs of a corpus it does not have yet: its split sizes and how long its documents are,
for the paper's datasets, from each dataset's published card and this project's own measurement (`assumed_profile`).

The plan times a few training steps on the sweep's own documents (a batch is as wide as its longest document, so
time depends on the lengths). Before the data is downloaded, a `DataProfile` stands in: a small corpus of random
token ids whose lengths follow the profile (`stand_in`), and the card's split sizes for the epochs' step counts.
The plan then says so ("assumed"); once the data is there (a --data-dir folder, the hub or its cache), the plan
reads it and is exact.

Where the numbers come from:
- IMDB (`stanfordnlp/imdb`): the card's 25 000 train / 25 000 test reviews, 10 % of train held out; lengths
  measured here on the 25 000 official training reviews with the paper's whitespace tokeniser: mean 234 words,
  median 174, the percentiles below.
- AG News (`ag_news`): the card's 120 000 train / 7 600 test, 10 % of train held out; lengths not measured (no
  AG News text here): the card's 29 817 351 bytes of training text (248 bytes a document) over IMDB's measured
  5.67 bytes a whitespace word, about 44 words a document, with IMDB's length shape scaled to that mean.
- ArXiv-11 (`ccdv/arxiv-classification`): the card's 28 388 / 2 500 / 2 500 documents; its training text is about
  1.65 GB (58 KB a paper, about 10 000 words at IMDB's bytes per word): every document assumed longer than the
  preset's 4 096 tokens, so every batch is max_len wide.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.data.readers import HUB_VALIDATION_FRACTION

# The percentiles (0 %, 1 %, ..., 100 %) of whitespace words per review in IMDB's 25 000 official training reviews
# (measured with `tokenizer.whitespace_words`). Drawn between them linearly, their mean is 241 words (the reviews':
# 234): 5 %-quantiles would put 272, the long tail drawn too long.
IMDB_WORD_QUANTILES = (10, 42, 49, 54, 59, 64, 70, 75, 80, 85, 91, 96, 101, 104, 108, 110, 112, 114, 117, 118, 120,
                       121, 123, 124, 125, 127, 128, 130, 131, 133, 134, 136, 137, 139, 141, 142, 144, 146, 148, 150,
                       151, 153, 155, 157, 160, 162, 165, 167, 169, 171, 174, 177, 180, 183, 186, 188, 192, 195, 199,
                       202, 206, 210, 214, 218, 222, 227, 232, 236, 242, 246, 252, 258, 264, 270, 277, 284, 292, 300,
                       307, 315, 325, 334, 344, 354, 365, 376, 392, 406, 422, 438, 458, 477, 502, 529, 561, 598, 646,
                       706, 789, 913, 2470)
IMDB_MEAN_WORDS = 233.8
IMDB_BYTES_PER_WORD = 5.67
STAND_IN_DOCS = (256, 64, 64)  # train, validation, test documents of the stand-in corpus the plan times on


@dataclass(frozen=True)
class DataProfile:
    """Split sizes and a length profile of a dataset not read yet, and where each comes from (`assumed`)."""

    name: str
    sizes: tuple[int, int, int]  # train, validation, test documents
    word_quantiles: tuple[int, ...]  # equally spaced quantiles (min to max) of tokens per document before truncation
    num_classes: int
    assumed: str  # where the sizes and lengths come from, said with the plan

    def lengths(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` document lengths drawn from the quantiles (piecewise-linear inverse CDF). (n,) int64"""
        q = np.asarray(self.word_quantiles, dtype=float)
        return np.maximum(1, np.round(np.interp(rng.random(n), np.linspace(0, 1, len(q)), q))).astype(np.int64)

    def stand_in(self, max_len: int, vocab_size: int, seed: int = 0) -> EncodedCorpus:
        """A small corpus of random token ids with this profile's lengths (truncated at `max_len`): the documents
        the plan times on in place of the real ones."""
        rng = np.random.default_rng(seed)
        splits = []
        for n in STAND_IN_DOCS:
            raw = self.lengths(n, rng)
            splits.append(EncodedSplit.random(np.minimum(raw, max_len), raw, vocab_size, self.num_classes, rng))
        return EncodedCorpus(*splits, vocab_size=vocab_size, num_classes=self.num_classes, max_len=max_len,
                             name=self.name, cache_key="assumed-" + self.name.replace("/", "-"),
                             meta={"assumed": self.assumed})


def _held(train: int) -> tuple[int, int]:
    held = int(np.ceil(HUB_VALIDATION_FRACTION * train))  # datasets' train_test_split rounds the held-out part up
    return train - held, held


def _scaled(mean_words: float) -> tuple[int, ...]:
    return tuple(max(1, round(q * mean_words / IMDB_MEAN_WORDS)) for q in IMDB_WORD_QUANTILES)


_AG_WORDS = 29_817_351 / 120_000 / IMDB_BYTES_PER_WORD
PUBLISHED = {
    "stanfordnlp/imdb": DataProfile(
        "stanfordnlp/imdb", (*_held(25_000), 25_000), IMDB_WORD_QUANTILES, 2,
        "split sizes from the dataset card (25 000 train, 25 000 test; 10 % of train held out), lengths measured on "
        "IMDB's 25 000 training reviews (mean 234 words)"),
    "ag_news": DataProfile(
        "ag_news", (*_held(120_000), 7_600), _scaled(_AG_WORDS), 4,
        f"split sizes from the dataset card (120 000 train, 7 600 test; 10 % of train held out), lengths not "
        f"measured: the card's 248 bytes of text a document over IMDB's measured {IMDB_BYTES_PER_WORD} bytes a "
        f"word, about {_AG_WORDS:.0f} words, in IMDB's length shape"),
    "ccdv/arxiv-classification": DataProfile(
        "ccdv/arxiv-classification", (28_388, 2_500, 2_500), (10_000,) * 2, 11,
        "split sizes from the dataset card (28 388 / 2 500 / 2 500), lengths from its text size (about 58 KB, "
        "10 000 words a paper): every document longer than max_len"),
}
PUBLISHED["fancyzhx/ag_news"] = PUBLISHED["ag_news"]


def assumed_profile(dataset: str) -> DataProfile | None:
    """The published profile of hub dataset `dataset`, or None for a dataset this project has none of."""
    return PUBLISHED.get(dataset)
