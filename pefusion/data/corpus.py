"""Text data: sources, the on-disk token-id cache, and `load_corpus`.

A corpus goes  source -> (texts, labels) per split -> vocabulary from the TRAINING split -> token ids, once.
The ids of all documents of a split live in one int32 array with offsets (`EncodedSplit`), so a whole corpus is a
handful of numpy arrays: cheap to cache on disk, and shipped once to every trial of a sweep through Ray's object
store. The paper's notebook re-tokenised every document in `__getitem__` every epoch; here the tokeniser
(`pefusion.data.tokenizer`) runs once per corpus and an epoch only gathers ids into batches
(`pefusion.data.batching`).

Sources, in the order `DataConfig` picks them: the bundled synthetic corpus, a local directory of
train/validation/test JSONL/CSV/Parquet files, or a Hugging Face hub dataset (`datasets.load_dataset`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import shutil
import socket
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pefusion.errors import ConfigError
from pefusion.data.config import DataConfig
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.data.tokenizer import TOKENIZER_NAME, UNK_ID, encode, encode_training_split

log = logging.getLogger(__name__)

# Bump when the cache layout or the meaning of cached arrays changes: old entries are then simply not found.
FORMAT_VERSION = 1

SPLITS = ("train", "validation", "test")
# File-name prefixes (local directories) and split names (hub datasets) accepted for each split.
SPLIT_ALIASES = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"), "test": ("test",)}
FILE_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}
# A hub dataset without a validation split (ag_news, imdb) gets this fraction of train, drawn with a fixed seed.
HUB_VALIDATION_FRACTION = 0.1
HUB_PROBE_TIMEOUT_S = 3.0

SUPPLY_HINT = (
    "supply data in one of three ways: --data-dir DIR with train/validation/test JSONL, CSV or Parquet files "
    "(text and label columns), the hub dataset name with internet access or a warm Hugging Face cache, "
    "or --preset demo (the bundled synthetic corpus)"
)

# How many times this process has tokenised a corpus (not read it from the cache): tests assert on it.
TOKENISATIONS = 0


class DataError(ConfigError):
    """A user-caused data problem (missing dataset, malformed file, missing column), in one line."""


# ---------------------------------------------------------------------------------------------------------
# Sources -> raw splits
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RawSplit:
    texts: list[str]
    labels: list[Any]
    origin: str  # file path(s) or hub split, for error messages
    dropped_empty: int = 0


def _clean(texts: Sequence[Any], labels: Sequence[Any], origin: str) -> RawSplit:
    """Drop documents whose text is missing or only whitespace (the paper's filter), counting them."""
    keep_t, keep_l = [], []
    for t, y in zip(texts, labels):
        if t is None or (isinstance(t, float) and math.isnan(t)):
            continue
        t = t if isinstance(t, str) else str(t)
        if t.strip():
            keep_t.append(t)
            keep_l.append(y)
    return RawSplit(keep_t, keep_l, origin, dropped_empty=len(texts) - len(keep_t))


def _json_line(path: Path, n: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {n} is not valid JSON ({e.msg})") from None


def _read_jsonl(path: Path, text_col: str, label_col: str) -> tuple[list, list]:
    """JSON lines; a .json file holding one array of records is read too."""
    texts, labels = [], []
    with open(path, encoding="utf-8-sig") as f:
        head = f.read(64).lstrip()[:1]
        f.seek(0)
        if head == "[":
            try:
                rows = enumerate(json.load(f), start=1)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        else:
            rows = ((n, _json_line(path, n, line)) for n, line in enumerate(f, start=1) if line.strip())
        for n, row in rows:
            if not isinstance(row, dict):
                raise DataError(f"{path}: record {n} is not a JSON object with {text_col!r} and {label_col!r}")
            for col in (text_col, label_col):
                if col not in row:
                    raise DataError(f"{path}: record {n} has no column {col!r} (columns: {', '.join(row)})")
            texts.append(row[text_col])
            labels.append(row[label_col])
    return texts, labels


def _read_table(path: Path, fmt: str, text_col: str, label_col: str) -> tuple[list, list]:
    import pandas as pd
    import pyarrow.parquet as pq

    try:
        if fmt == "csv":
            # keep_default_na=False: a text "NA" or "null" is a word, not a missing value.
            frame = pd.read_csv(path, dtype={text_col: str}, keep_default_na=False)
        else:
            columns = pq.read_schema(path).names
            missing = [c for c in (text_col, label_col) if c not in columns]
            if missing:
                raise DataError(f"{path}: no column {missing[0]!r} (columns: {', '.join(columns)})")
            frame = pd.read_parquet(path, columns=[text_col, label_col])
    except DataError:
        raise
    except Exception as e:  # pandas/pyarrow raise many types for a malformed file
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path}: cannot read as {fmt.upper()} ({reason})") from None
    for col in (text_col, label_col):
        if col not in frame.columns:
            raise DataError(f"{path}: no column {col!r} (columns: {', '.join(map(str, frame.columns))})")
    return frame[text_col].tolist(), frame[label_col].tolist()


def find_split_files(data_dir: Path) -> dict[str, list[Path]]:
    """The file(s) of each split in `data_dir`, found by name prefix: train.jsonl, train_clean.jsonl,
    validation.csv, val.parquet, test-00000-of-00002.parquet (shards are concatenated in name order)."""
    if not data_dir.is_dir():
        raise DataError(f"data directory {str(data_dir)!r} does not exist; {SUPPLY_HINT}")
    found: dict[str, list[Path]] = {}
    for split, aliases in SPLIT_ALIASES.items():
        pattern = re.compile(rf"^({'|'.join(aliases)})([._-].*)?$", re.IGNORECASE)
        files = sorted(p for p in data_dir.iterdir()
                       if p.is_file() and p.suffix.lower() in FILE_FORMATS and pattern.match(p.stem))
        if not files:
            raise DataError(f"no {split} file in {data_dir} (expected e.g. {split}.jsonl, {split}_clean.jsonl, "
                            f"{split}.csv or {split}.parquet)")
        shards = all(re.search(r"-\d+-of-\d+$", p.stem) for p in files)
        if len(files) > 1 and not shards:
            raise DataError(f"several {split} files in {data_dir}: {', '.join(p.name for p in files)}; "
                            f"keep only one")
        found[split] = files
    return found


def _read_local(cfg: DataConfig, files: dict[str, list[Path]]) -> dict[str, RawSplit]:
    raw = {}
    for split, paths in files.items():
        texts, labels = [], []
        for path in paths:
            fmt = FILE_FORMATS[path.suffix.lower()]
            if fmt == "jsonl":
                t, y = _read_jsonl(path, cfg.text_column, cfg.label_column)
            else:
                t, y = _read_table(path, fmt, cfg.text_column, cfg.label_column)
            texts += t
            labels += y
        raw[split] = _clean(texts, labels, ", ".join(map(str, paths)))
    return raw


def _read_synthetic(cfg: DataConfig) -> dict[str, RawSplit]:
    from pefusion.data.synthetic import generate_synthetic_corpus

    corpus = generate_synthetic_corpus(cfg.synthetic_train, cfg.synthetic_val, cfg.synthetic_test,
                                       seed=cfg.synthetic_seed)
    return {split: _clean([d["text"] for d in docs], [d["label"] for d in docs], f"synthetic:{split}")
            for split, docs in corpus.items()}


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """True when the user asked the Hugging Face libraries not to touch the network."""
    return _env_true("HF_HUB_OFFLINE") or _env_true("HF_DATASETS_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """One TCP connect to the hub endpoint. Behind a firewall that drops packets, the hub client would wait
    out its timeouts and retries request by request; this probe fails in `timeout` seconds instead."""
    from huggingface_hub import constants

    url = urllib.parse.urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _forced_offline():
    """What HF_HUB_OFFLINE=1 does, for one call: read the local Hugging Face cache, never the network.
    The libraries read the variable once at import, so their module flags are patched for the call."""
    import datasets
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


def _read_hub(cfg: DataConfig) -> tuple[dict[str, RawSplit], tuple[str, ...] | None]:
    """Splits of the hub dataset `cfg.dataset`, plus its ClassLabel names when the label column has them."""
    import datasets

    where = f"dataset {cfg.dataset!r}" + (f" (config {cfg.dataset_config!r})" if cfg.dataset_config else "")
    offline = hub_offline() or (not Path(cfg.dataset).exists() and not hub_reachable())
    try:
        with _forced_offline() if offline else contextlib.nullcontext():
            dsd = datasets.load_dataset(cfg.dataset, cfg.dataset_config)
    except Exception as e:  # offline + not cached, unknown name, bad config, gated repo: all one message
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        state = "offline (no internet or HF_HUB_OFFLINE set) and " if offline else ""
        raise DataError(f"cannot load {where} from the Hugging Face hub: {state}{type(e).__name__}: "
                        f"{reason}; {SUPPLY_HINT}") from e

    names = {}
    for split, aliases in SPLIT_ALIASES.items():
        names[split] = next((a for a in aliases if a in dsd), None)
    if names["train"] is None or names["test"] is None:
        raise DataError(f"{where} has splits {', '.join(dsd)}; it needs train and test (and optionally validation)")
    parts = {split: dsd[name] for split, name in names.items() if name is not None}
    if names["validation"] is None:
        # Fixed seed: every trial and every later run sees the same held-out documents.
        held = parts["train"].train_test_split(test_size=HUB_VALIDATION_FRACTION, seed=0, shuffle=True)
        parts["train"], parts["validation"] = held["train"], held["test"]
        log.info("%s has no validation split: holding out %.0f%% of train with seed 0", where,
                 100 * HUB_VALIDATION_FRACTION)

    raw = {}
    for split, part in parts.items():
        for col in (cfg.text_column, cfg.label_column):
            if col not in part.column_names:
                raise DataError(f"{where} split {split!r} has no column {col!r} "
                                f"(columns: {', '.join(part.column_names)}); set text_column/label_column")
        table = part.with_format("arrow")[:]  # an arrow table (with any held-out split applied): no row access
        raw[split] = _clean(table.column(cfg.text_column).to_pylist(), table.column(cfg.label_column).to_pylist(),
                            f"{where} split {names[split] or 'train'!r}")
    feature = parts["train"].features[cfg.label_column]
    label_names = tuple(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    return raw, label_names


# ---------------------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------------------


def _is_missing(y: Any) -> bool:
    return y is None or (isinstance(y, float) and math.isnan(y)) or (isinstance(y, str) and not y.strip())


def _as_int(y: Any) -> int | None:
    if isinstance(y, (bool, np.bool_)):
        return None
    if isinstance(y, (int, np.integer)):
        return int(y)
    if isinstance(y, (float, np.floating)) and float(y).is_integer():
        return int(y)
    if isinstance(y, str) and re.fullmatch(r"\s*-?\d+\s*", y):
        return int(y)
    return None


def map_labels(raw: dict[str, RawSplit], label_col: str,
               class_names: tuple[str, ...] | None = None) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """Labels -> class ids. Integer labels (also "3" or 3.0) are kept as the dataset's own ids; any other labels
    are mapped by the sorted unique TRAINING labels. Returns the id arrays and the name of each class id."""
    for r in raw.values():
        if any(map(_is_missing, r.labels)):
            raise DataError(f"{r.origin}: column {label_col!r} has missing values")
    as_ints = {split: [_as_int(y) for y in r.labels] for split, r in raw.items()}
    if all(v is not None for ints in as_ints.values() for v in ints):
        ids = {split: np.asarray(ints, dtype=np.int64) for split, ints in as_ints.items()}
        for split, arr in ids.items():
            if arr.size and arr.min() < 0:
                raise DataError(f"{raw[split].origin}: column {label_col!r} has a negative label {arr.min()}")
        n = 1 + max(int(arr.max(initial=-1)) for arr in ids.values())
        unused = sorted(set(range(n)) - set(ids["train"].tolist()))
        if unused:
            log.warning("%s: integer labels are kept as class ids, and ids %s never occur in the training split",
                        raw["train"].origin, unused[:10])
        names = class_names if class_names and len(class_names) >= n else tuple(str(i) for i in range(n))
        return ids, names
    names = tuple(sorted({str(y) for y in raw["train"].labels}))
    index = {name: i for i, name in enumerate(names)}
    ids = {}
    for split, r in raw.items():
        try:
            ids[split] = np.fromiter((index[str(y)] for y in r.labels), dtype=np.int64, count=len(r.labels))
        except KeyError as e:
            raise DataError(f"{r.origin}: label {e.args[0]!r} in column {label_col!r} never occurs in the "
                            f"training split") from None
    return ids, names


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


def _read_source(cfg: DataConfig) -> tuple[dict[str, RawSplit], tuple[str, ...] | None]:
    if cfg.synthetic:
        return _read_synthetic(cfg), None
    if cfg.data_dir:
        return _read_local(cfg, find_split_files(Path(cfg.data_dir))), None
    return _read_hub(cfg)


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
        raw, class_names = _read_source(cfg)
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
