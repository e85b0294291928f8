"""Word-level tokenisers and their vocabulary: the words of a text, the vocabulary of the TRAINING split, texts
to token ids.

Two ways to cut a text into words (`WORD_TOKENIZERS`):
- `whitespace`, the paper's: lowercase, split on whitespace. Punctuation stays attached (`guns,` and `guns.` are
  two words besides `guns`) and markup becomes words (`<br`, `/><br`).
- `words`: lowercase runs of letters (any script; an apostrophe inside a word keeps `don't` whole); digits,
  punctuation and markup tags such as `<br />` are dropped. On real text this shrinks the vocabulary by a third
  (IMDB's 4 000-review cut: 30 756 -> 21 067 entries) and gains several points of accuracy (docs/model.md,
  "Your own corpus").
The vocabulary is PAD=0, UNK=1, then the frequent words of the training split only, so words seen only in
validation or test read as UNK. Strings in, int arrays out: it knows nothing of where the texts come from or where
the ids are kept. Subword vocabularies (`wordpiece`, `bpe`) are `pefusion.data.subword`'s.
"""
from __future__ import annotations

import re
from operator import itemgetter
from typing import Callable, Sequence

import numpy as np

PAD_ID, UNK_ID = 0, 1
SPECIAL_TOKENS = ("<pad>", "<unk>")

_MARKUP = re.compile(r"<[^<>]*>")  # an HTML/XML tag: <br />, <p>, </a>
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")  # letters (no digits or underscore), inner apostrophes kept


def whitespace_words(text: str) -> list[str]:
    """The paper's tokeniser: lowercase, split on whitespace."""
    return text.lower().split()


def alphabetic_words(text: str) -> list[str]:
    """Lowercase alphabetic words, markup tags removed: 'A <br />gun, GUNS.' -> ['a', 'gun', 'guns']."""
    return _WORD.findall(_MARKUP.sub(" ", text).lower())


WORD_TOKENIZERS: dict[str, Callable[[str], list[str]]] = {"whitespace": whitespace_words, "words": alphabetic_words}


class _FirstSeenIds(dict):
    """word -> provisional id, in order of first appearance. A lookup of a known word stays in C; only a new
    word runs Python (__missing__), once per distinct word."""

    def __missing__(self, word: str) -> int:
        self[word] = idx = len(self)
        return idx


class _VocabLookup(dict):
    """word -> vocabulary id for encoding: UNK for a word not in the vocabulary, and for a word spelled like the
    padding token (it must not read as padding)."""

    def __init__(self, vocab: dict[str, int]) -> None:
        super().__init__(vocab)
        self[SPECIAL_TOKENS[PAD_ID]] = UNK_ID

    def __missing__(self, word: str) -> int:
        return UNK_ID


def _lookup_all(table: dict[str, int], words: list[str]) -> np.ndarray:
    """table[w] for every word, (len(words),) int64, in one C call: operator.itemgetter over the document is
    about twice as fast as a per-word map (it returns a tuple for two or more keys, the value for one)."""
    if len(words) > 1:
        return np.array(itemgetter(*words)(table), dtype=np.int64)
    return np.array([table[w] for w in words], dtype=np.int64)


def _ids_per_document(texts: Sequence[str], table: dict[str, int], split_words: Callable[[str], list[str]],
                      max_len: int | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """table[word] for the words of each text, the first max_len of them (all if None; words past it are never
    looked up): (per-document id arrays (int64), raw lengths (N,) int64, before truncation)."""
    docs, raw_lengths = [], np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        words = split_words(text)
        raw_lengths[i] = len(words)
        if max_len is not None and len(words) > max_len:
            del words[max_len:]
        docs.append(_lookup_all(table, words))
    return docs, raw_lengths


def _vocab_from_counts(seen: dict[str, int], counts: np.ndarray, min_freq: int,
                       max_vocab: int) -> tuple[dict[str, int], np.ndarray]:
    """The vocabulary (specials, then words seen >= min_freq times, most frequent first, ties in order of first
    appearance) and the table provisional id -> vocabulary id (UNK for words left out). A word spelled like a
    special token is left out too: it must not take over PAD's or UNK's id."""
    counts = counts.copy()
    for tok in SPECIAL_TOKENS:
        if tok in seen:
            counts[seen[tok]] = 0
    words = list(seen)  # in provisional-id order
    order = np.argsort(-counts, kind="stable")  # count descending, ties in provisional-id = first-appearance order
    kept = order[counts[order] >= max(min_freq, 1)][:max(0, max_vocab - len(SPECIAL_TOKENS))]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update((words[j], i) for i, j in enumerate(kept.tolist(), start=len(SPECIAL_TOKENS)))
    table = np.full(len(words), UNK_ID, dtype=np.int32)
    table[kept] = np.arange(len(SPECIAL_TOKENS), len(SPECIAL_TOKENS) + len(kept), dtype=np.int32)
    return vocab, table


def pack(docs: list[np.ndarray], raw_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-document ids (already truncated) -> (ids int32 (total,), offsets int64 (N+1,), raw_lengths).

    A document with no token (only markup or digits, for the `words` tokeniser) is kept as one UNK, so that every
    document has a token to attend to; its raw length stays 0."""
    docs = [d if len(d) else np.array([UNK_ID], dtype=np.int64) for d in docs]
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    ids = np.concatenate(docs).astype(np.int32, copy=False) if docs else np.zeros(0, dtype=np.int32)
    return ids, offsets, np.asarray(raw_lengths, dtype=np.int64)


def build_vocab(texts: Sequence[str], min_freq: int = 2, max_vocab: int = 50_000,
                tokenizer: str = "whitespace") -> dict[str, int]:
    """Word -> id from `texts` (the training split only). PAD=0, UNK=1, then words seen >= min_freq times,
    most frequent first; ties keep the order of first appearance (as the paper's code). `max_vocab` counts the
    two specials."""
    return _training_vocab(texts, min_freq, max_vocab, WORD_TOKENIZERS[tokenizer])[0]


def _training_vocab(texts: Sequence[str], min_freq: int, max_vocab: int, split_words: Callable[[str], list[str]]
                    ) -> tuple[dict[str, int], np.ndarray, list[np.ndarray], np.ndarray]:
    """The vocabulary of `texts`, the table provisional id -> vocabulary id, and the texts as provisional ids
    with their raw lengths: one pass over the words (each new word numbered as it first appears), counted with
    bincount."""
    seen = _FirstSeenIds()
    docs, raw_lengths = _ids_per_document(texts, seen, split_words)
    counts = np.bincount(np.concatenate(docs), minlength=len(seen)) if docs else np.zeros(0, dtype=np.int64)
    return (*_vocab_from_counts(seen, counts, min_freq, max_vocab), docs, raw_lengths)


def encode_training_split(texts: Sequence[str], min_freq: int, max_vocab: int, max_len: int,
                          tokenizer: str = "whitespace") -> tuple[dict[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """build_vocab(texts) and encode(texts, that vocab, max_len) in one pass over the words: the training
    split is split into words once and its ids come from a table lookup."""
    vocab, table, docs, raw_lengths = _training_vocab(texts, min_freq, max_vocab, WORD_TOKENIZERS[tokenizer])
    return vocab, pack([table[d[:max_len]] for d in docs], raw_lengths)


def encode(texts: Sequence[str], vocab: dict[str, int], max_len: int,
           tokenizer: str = "whitespace") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids of `texts`, each truncated to max_len -> (ids int32 (total,), offsets int64 (N+1,),
    raw_lengths int64 (N,)). Words past max_len are never looked up; unknown words, and a word spelled like the
    padding token, are UNK."""
    return pack(*_ids_per_document(texts, _VocabLookup(vocab), WORD_TOKENIZERS[tokenizer], max_len))
