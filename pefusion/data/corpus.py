"""Text data: the on-disk token-id cache and `load_corpus`, the entry point from a `DataConfig` to token ids.

A corpus goes  source -> (texts, labels) per split -> vocabulary from the TRAINING split -> token ids, once.
The ids of all documents of a split live in one int32 array with offsets (`EncodedSplit`), so a whole corpus is a
handful of numpy arrays: cheap to cache on disk, and shipped once to every trial of a sweep through Ray's object
store. The paper's notebook re-tokenised every document in `__getitem__` every epoch; here the tokeniser
(`pefusion.data.tokenizer`) runs once per corpus and an epoch only gathers ids into batches
(`pefusion.data.batching`). The sources are read by `pefusion.data.readers`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from pefusion.data.config import DataConfig
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.data.readers import (HUB_VALIDATION_FRACTION, SPLITS, DataError, find_split_files, map_labels,
                                   read_source)
from pefusion.data.tokenizer import TOKENIZER_NAME, UNK_ID, encode, encode_training_split

log = logging.getLogger(__name__)

# Bump when the cache layout or the meaning of cached arrays changes: old entries are then simply not found.
FORMAT_VERSION = 1

# How many times this process has tokenised a corpus (not read it from the cache): tests assert on it.
TOKENISATIONS = 0


# ---------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------


def cache_root(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir or os.environ.get("PEFUSION_CACHE") or Path.home() / ".cache" / "pefusion").expanduser()


def source_identity(cfg: DataConfig) -> dict[str, Any]:
    """What the cached ids depend on besides the tokeniser: which documents, from where, in which columns."""
    if cfg.synthetic:
        from pefusion.data import synthetic as synthetic_corpus

        return {"kind": "synthetic", "generator": synthetic_corpus.GENERATOR_VERSION,
                "settings": synthetic_corpus.default_settings(),
                "sizes": [cfg.synthetic_train, cfg.synthetic_val, cfg.synthetic_test], "seed": cfg.synthetic_seed}
    columns = [cfg.text_column, cfg.label_column]
    if cfg.data_dir:
        files = find_split_files(Path(cfg.data_dir))
        stamp = []
        for split, paths in files.items():
            for p in paths:
                st = p.stat()
                stamp.append([split, str(p.resolve()), st.st_size, st.st_mtime_ns])
        return {"kind": "local", "files": stamp, "columns": columns}
    return {"kind": "hub", "dataset": cfg.dataset, "config": cfg.dataset_config, "columns": columns,
            "validation_fraction": HUB_VALIDATION_FRACTION}


def cache_key(cfg: DataConfig) -> str:
    """Hash of the source identity + tokeniser settings + max_len + format version."""
    payload = {"source": source_identity(cfg), "tokenizer": TOKENIZER_NAME, "min_freq": cfg.min_freq,
               "max_vocab": cfg.max_vocab, "max_len": cfg.max_len, "format": FORMAT_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


def _write_cache(entry: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any], vocab: dict[str, int]) -> None:
    """Write into a private temporary directory, then rename it into place: a directory rename is atomic, so a
    reader sees a complete entry or none, and of two racing writers the loser just discards its copy."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        np.savez(tmp / "arrays.npz", **arrays)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        # Words never contain whitespace (they come from str.split), so one per line is unambiguous.
        (tmp / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a cache on a shared filesystem serves other users too
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read_cache(entry: Path) -> tuple[dict[str, EncodedSplit], dict[str, Any]] | None:
    if not (entry / "meta.json").exists():
        return None
    meta = json.loads((entry / "meta.json").read_text())
    with np.load(entry / "arrays.npz") as z:
        splits = {s: EncodedSplit(z[f"{s}_ids"], z[f"{s}_offsets"], z[f"{s}_labels"], z[f"{s}_raw_lengths"])
                  for s in SPLITS}
    return splits, meta


def load_vocab(corpus: EncodedCorpus, cfg: DataConfig) -> list[str]:
    """The cached vocabulary, word per id (for decoding or inspecting a corpus)."""
    return (cache_root(cfg) / corpus.cache_key / "vocab.txt").read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------------------------------------------------
# load_corpus
# ---------------------------------------------------------------------------------------------------------


def load_corpus(cfg: DataConfig) -> EncodedCorpus:
    """The encoded corpus of `cfg`: read from the cache when present, else read, tokenised once and cached."""
    global TOKENISATIONS
    key = cache_key(cfg)
    entry = cache_root(cfg) / key
    cached = _read_cache(entry)
    if cached is not None:
        log.info("data cache hit %s", entry)
        splits, meta = cached
    else:
        raw, class_names = read_source(cfg)
        for s in SPLITS:
            if not raw[s].texts:
                raise DataError(f"{raw[s].origin}: the {s} split has no document with a non-empty "
                                f"{cfg.text_column!r}")
        labels, label_names = map_labels(raw, cfg.label_column, class_names)
        TOKENISATIONS += 1
        vocab, train = encode_training_split(raw["train"].texts, cfg.min_freq, cfg.max_vocab, cfg.max_len)
        encoded = {"train": train} | {s: encode(raw[s].texts, vocab, cfg.max_len) for s in SPLITS[1:]}
        splits = {s: EncodedSplit(ids, offsets, labels[s], raw_lengths)
                  for s, (ids, offsets, raw_lengths) in encoded.items()}
        meta = {
            "format": FORMAT_VERSION, "source": source_identity(cfg), "name": cfg.source_name,
            "tokenizer": TOKENIZER_NAME, "min_freq": cfg.min_freq, "max_vocab": cfg.max_vocab,
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
        _write_cache(entry, arrays, meta, vocab)
        log.info("tokenised %s: %s docs, vocab %d, cached at %s", cfg.source_name, meta["docs"], len(vocab), entry)
    return EncodedCorpus(train=splits["train"], validation=splits["validation"], test=splits["test"],
                         vocab_size=meta["vocab_size"], num_classes=meta["num_classes"], max_len=cfg.max_len,
                         name=cfg.source_name, cache_key=key, label_names=tuple(meta["label_names"]), meta=meta)
