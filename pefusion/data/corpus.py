"""`load_corpus`, the entry point of the data wing: a `DataConfig` -> its encoded corpus, from the cache if there.

A corpus goes  source -> (texts, labels) per split -> vocabulary from the TRAINING split -> token ids, once:
a `sources.Source` reads the documents, `tokenizer` turns words into ids, `cache` keeps the result; this module
strings them together and records what it did (meta.json). The ids of all documents of a split live in one int32
array with offsets (`EncodedSplit`), so a whole corpus is a handful of numpy arrays: cheap to cache on disk, and
shipped once to every trial of a sweep through Ray's object store. The paper's notebook re-tokenised every
document in `__getitem__` every epoch; here tokenising happens once per corpus and an epoch only gathers ids into
batches (`batching`).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pefusion.data.cache import (FORMAT_VERSION, META_FILE, SUBWORD_FILE, VOCAB_FILE, cache_key, cache_root,
                                 read_cache, write_cache)
from pefusion.data.config import DataConfig
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.data.readers import SPLITS, DataError, map_labels
from pefusion.data.sources import Source
from pefusion.data.subword import encode_subword, subword_vocabulary, train_subword
from pefusion.data.tokenizer import UNK_ID, WORD_TOKENIZERS, encode, encode_training_split

log = logging.getLogger(__name__)


def load_corpus(cfg: DataConfig, source: Source | None = None) -> EncodedCorpus:
    """The encoded corpus of `cfg`: read from the cache when present, else read, tokenised once and cached.
    `source`: where the documents come from (default: the source `cfg` names, `cfg.source`); `cfg` gives the
    tokeniser settings, max_len and the cache location."""
    source = source or cfg.source
    key = cache_key(cfg, source)
    entry = cache_root(cfg) / key
    cached = read_cache(entry)
    if cached is not None:
        log.info("data cache hit %s", entry)
        splits, meta = cached
    else:
        raw, class_names = source.read()
        for s in SPLITS:
            if not raw[s].texts:
                raise DataError(f"{raw[s].origin}: the {s} split has no document with a non-empty "
                                f"{cfg.text_column!r}")
        labels, label_names = map_labels(raw, cfg.label_column, class_names)
        vocab, encoded, tokenizer_json = _encode_splits(cfg, {s: raw[s].texts for s in SPLITS})
        splits = {s: EncodedSplit(ids, offsets, labels[s], raw_lengths)
                  for s, (ids, offsets, raw_lengths) in encoded.items()}
        meta = {
            "format": FORMAT_VERSION, "source": source.identity(), "name": source.name,
            "tokenizer": cfg.tokenizer, "min_freq": cfg.min_freq, "max_vocab": cfg.max_vocab,
            "max_len": cfg.max_len, "vocab_size": len(vocab), "num_classes": len(label_names),
            "label_names": list(label_names),
            "docs": {s: len(splits[s]) for s in SPLITS},
            "dropped_empty": {s: raw[s].dropped_empty for s in SPLITS},
            "truncated": {s: int((splits[s].raw_lengths > cfg.max_len).sum()) for s in SPLITS},
            "tokens": {s: int(splits[s].raw_lengths.sum()) for s in SPLITS},
            "unk_fraction": {s: float((splits[s].ids == UNK_ID).mean()) if splits[s].ids.size else 0.0
                             for s in SPLITS},
        }
        arrays = {f"{s}_{name}": getattr(splits[s], name)
                  for s in SPLITS for name in ("ids", "offsets", "labels", "raw_lengths")}
        write_cache(entry, arrays, meta, vocab, tokenizer_json)
        log.info("tokenised %s: %s docs, vocab %d, cached at %s", source.name, meta["docs"], len(vocab), entry)
    return EncodedCorpus(train=splits["train"], validation=splits["validation"], test=splits["test"],
                         vocab_size=meta["vocab_size"], num_classes=meta["num_classes"], max_len=cfg.max_len,
                         name=source.name, cache_key=key, label_names=tuple(meta["label_names"]), meta=meta)


def _encode_splits(cfg: DataConfig, texts: dict[str, list[str]]) -> tuple[dict[str, int], dict[str, tuple], str | None]:
    """The vocabulary learned from the training split, each split's (ids, offsets, raw_lengths), and for a
    subword tokeniser its JSON (None for word-level ones). Validation and test go through `TextEncoder.encode`,
    as new text does later."""
    if cfg.tokenizer in WORD_TOKENIZERS:
        vocab, train = encode_training_split(texts["train"], cfg.min_freq, cfg.max_vocab, cfg.max_len, cfg.tokenizer)
        encoder = TextEncoder(cfg.tokenizer, cfg.max_len, vocab)
    else:
        tok = train_subword(texts["train"], cfg.tokenizer, cfg.max_vocab, cfg.min_freq)
        encoder = TextEncoder(cfg.tokenizer, cfg.max_len, subword_vocabulary(tok), tok)
        train = encoder.encode(texts["train"])
    return (encoder.vocab, {"train": train} | {s: encoder.encode(texts[s]) for s in SPLITS[1:]},
            None if encoder.subword is None else encoder.subword.to_str())


@dataclass(frozen=True)
class TextEncoder:
    """Documents to token ids as a corpus's were encoded: its tokeniser, its vocabulary (learned on its training
    split; never relearned) and its truncation to max_len. `from_files` rebuilds it from a cache entry's files
    (`cache.tokenizer_files`), which a sweep also records in MLflow, so a trained model can read new text."""

    tokenizer: str  # a DataConfig tokenizer name
    max_len: int
    vocab: dict[str, int]  # token -> id, PAD = 0 and UNK = 1 first
    subword: Any = None  # the trained `tokenizers.Tokenizer` of a subword tokeniser, else None

    @classmethod
    def from_files(cls, folder: str | Path) -> TextEncoder:
        """The encoder of a folder holding a cache entry's meta.json, vocab.txt and, for a subword tokeniser,
        tokenizer.json."""
        folder = Path(folder)
        meta = json.loads((folder / META_FILE).read_text())
        words = (folder / VOCAB_FILE).read_text(encoding="utf-8").splitlines()
        subword = None
        if meta["tokenizer"] not in WORD_TOKENIZERS:
            from tokenizers import Tokenizer
            subword = Tokenizer.from_str((folder / SUBWORD_FILE).read_text(encoding="utf-8"))
        return cls(meta["tokenizer"], int(meta["max_len"]), {w: i for i, w in enumerate(words)}, subword)

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids int32 (total,), offsets int64 (N+1,), raw_lengths int64 (N,)): each text's tokens, the first
        max_len kept, unknown ones UNK; raw_lengths count tokens before truncation."""
        if self.subword is not None:
            return encode_subword(self.subword, texts, self.max_len)
        return encode(texts, self.vocab, self.max_len, self.tokenizer)
