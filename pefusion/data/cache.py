"""The on-disk token-id cache: one directory per encoded corpus (arrays.npz, meta.json, vocab.txt) under
`cache_root`, named by `cache_key`.

So that a corpus is tokenised once, not once per run or per trial. The key hashes everything the ids depend on
(the source's `identity()`, for local files their paths, sizes and modification times; the tokeniser settings;
max_len; FORMAT_VERSION), so an edited file or a changed setting finds no entry instead of a stale one. An entry
appears atomically, so runs that race on one corpus never read a half-written entry.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import pefusion
from pefusion.data.config import DataConfig
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.data.readers import SPLITS
from pefusion.data.sources import Source

# Bump when the cache layout or the meaning of cached arrays changes: old entries are then simply not found.
FORMAT_VERSION = 1
# An entry's files besides arrays.npz: what it holds (tokeniser settings, max_len, label names, counts), the
# vocabulary (one token per line, in id order), and a subword tokeniser's own JSON.
META_FILE, VOCAB_FILE, SUBWORD_FILE = "meta.json", "vocab.txt", "tokenizer.json"


def cache_root(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir).expanduser() if cfg.cache_dir else pefusion.cache_home()


def cache_key(cfg: DataConfig, source: Source | None = None) -> str:
    """Hash of the source's identity (default: the source `cfg` names) + tokeniser settings + max_len + format
    version."""
    source = source or cfg.source
    payload = {"source": source.identity(), "tokenizer": cfg.tokenizer, "min_freq": cfg.min_freq,
               "max_vocab": cfg.max_vocab, "max_len": cfg.max_len, "format": FORMAT_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


def write_cache(entry: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any], vocab: dict[str, int],
                tokenizer_json: str | None = None) -> None:
    """Write into a private temporary directory, then rename it into place: a directory rename is atomic, so a
    reader sees a complete entry or none, and of two racing writers the loser just discards its copy."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        np.savez(tmp / "arrays.npz", **arrays)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
        # Tokens never contain whitespace (words come from str.split or a letters-only pattern, subword pieces from
        # a whitespace pre-tokeniser), so one per line is unambiguous.
        (tmp / VOCAB_FILE).write_text("\n".join(vocab) + "\n", encoding="utf-8")
        if tokenizer_json is not None:  # a subword tokenizer, to encode new text as the trials saw it
            (tmp / SUBWORD_FILE).write_text(tokenizer_json, encoding="utf-8")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a cache on a shared filesystem serves other users too
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / META_FILE).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_cache(entry: Path) -> tuple[dict[str, EncodedSplit], dict[str, Any]] | None:
    """The splits and meta of the cache entry `entry`; None when there is no (complete) entry."""
    if not (entry / META_FILE).exists():
        return None
    meta = json.loads((entry / META_FILE).read_text())
    with np.load(entry / "arrays.npz") as z:
        splits = {s: EncodedSplit(z[f"{s}_ids"], z[f"{s}_offsets"], z[f"{s}_labels"], z[f"{s}_raw_lengths"])
                  for s in SPLITS}
    return splits, meta


def load_vocab(corpus: EncodedCorpus, cfg: DataConfig) -> list[str]:
    """The cached vocabulary, word per id (for decoding or inspecting a corpus)."""
    return (cache_root(cfg) / corpus.cache_key / VOCAB_FILE).read_text(encoding="utf-8").splitlines()


def tokenizer_files(entry: Path) -> list[Path]:
    """The files of cache entry `entry` that encode new text as its corpus was encoded (`corpus.TextEncoder`):
    meta.json, the vocabulary and a subword tokeniser's JSON, those it has (none for a missing entry)."""
    return [entry / name for name in (META_FILE, VOCAB_FILE, SUBWORD_FILE) if (entry / name).exists()]
