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

import logging

from pefusion.data.cache import FORMAT_VERSION, cache_key, cache_root, read_cache, write_cache
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
    subword tokeniser its JSON (None for word-level ones)."""
    if cfg.tokenizer in WORD_TOKENIZERS:
        vocab, train = encode_training_split(texts["train"], cfg.min_freq, cfg.max_vocab, cfg.max_len, cfg.tokenizer)
        rest = {s: encode(texts[s], vocab, cfg.max_len, cfg.tokenizer) for s in SPLITS[1:]}
        return vocab, {"train": train} | rest, None
    tok = train_subword(texts["train"], cfg.tokenizer, cfg.max_vocab, cfg.min_freq)
    return (subword_vocabulary(tok), {s: encode_subword(tok, texts[s], cfg.max_len) for s in SPLITS},
            tok.to_str())
