"""Data files and hub tables to raw splits: the documents and labels of each split, and the labels as class ids.

The helpers every kind of source (`pefusion.data.sources`) reads with: local train/validation/test JSONL, CSV or
Parquet files (JSONL and CSV also gzip/bz2/xz-compressed) found by name (`find_split_files`, `read_data_file`),
the Hugging Face hub probe and offline switch, documents without text dropped (`RawSplit`); `map_labels` turns the
labels into class ids. This is the code that meets what the user supplied, so it raises nearly every `DataError`
(a data problem the user can fix, in one line), and that error is defined here. Local files are vetted before any
parser sees them (`open_text`, `_check_head`): an empty file, a compressed file under a plain name, UTF-16, or
bytes that are not UTF-8 are named as such (the last with the byte offset), not left to surface as a
UnicodeDecodeError traceback from inside json or pandas.
"""
from __future__ import annotations

import bz2
import codecs
import contextlib
import gzip
import io
import json
import logging
import lzma
import math
import os
import re
import socket
import urllib.parse
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

import numpy as np

from pefusion.errors import ConfigError

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
# File-name prefixes (local directories) and split names (hub datasets) accepted for each split.
SPLIT_ALIASES = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"), "test": ("test",)}
FILE_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}
# Compressions a text file (JSONL, CSV) may carry, and the name suffix that says so; each has a reader in the
# standard library.
COMPRESSIONS = {"gzip": ".gz", "bz2": ".bz2", "xz": ".xz"}
OPENERS = {None: open, "gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open}
# What the first bytes of a file say it is. A compressed or UTF-16 file read as UTF-8 fails on some early byte;
# naming what the file is says what to do about it.
MAGIC_BYTES = {
    "gzip": rb"\x1f\x8b", "bz2": rb"BZh[1-9](1AY&SY|\x17rE8P\x90)", "xz": rb"\xfd7zXZ\x00",
    "zstd": rb"\x28\xb5\x2f\xfd", "zip": rb"PK(\x03\x04|\x05\x06)",
    "UTF-32": rb"\xff\xfe\x00\x00|\x00\x00\xfe\xff", "UTF-16": rb"\xff\xfe|\xfe\xff",  # UTF-32 first: same start
}
# A hub dataset without a validation split (ag_news, imdb), or a local folder without a validation file, gets this
# fraction of train, drawn with a fixed seed (`held_out_rows`).
HUB_VALIDATION_FRACTION = 0.1
HUB_VALIDATION_SEED = 0
# Integer labels are class ids (`map_labels`): an id at or past this is refused rather than made a class list.
MAX_CLASSES = 100_000
HUB_PROBE_TIMEOUT_S = 3.0

SUPPLY_HINT = (
    "supply data in one of three ways: --data-dir DIR with train/validation/test JSONL, CSV or Parquet files "
    "(text and label columns; `pefusion-data fetch imdb|agnews|arxiv --out DIR` writes one where the hub is "
    "reachable), the hub dataset name with internet access or a warm Hugging Face cache, "
    "or --preset demo (the bundled synthetic corpus)"
)


class DataError(ConfigError):
    """A user-caused data problem (missing dataset, malformed file, missing column), in one line."""


# ---------------------------------------------------------------------------------------------------------
# Files and hub tables -> raw splits
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RawSplit:
    texts: list[str]
    labels: list[Any]
    origin: str  # file path(s) or hub split, for error messages
    dropped_empty: int = 0


def clean_split(texts: Sequence[Any], labels: Sequence[Any], origin: str) -> RawSplit:
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


def hold_out(train: RawSplit, seed: int, fraction: float = HUB_VALIDATION_FRACTION) -> tuple[RawSplit, RawSplit]:
    """(train, validation): a permutation of `train` by np.random.default_rng(seed), its first `fraction` the
    validation split, the rest (in the file's order) the training split — the AG News notebook's per-seed draw."""
    n = len(train.texts)
    order = np.random.default_rng(seed).permutation(n)
    n_val = int(fraction * n)
    val, keep = order[:n_val], np.sort(order[n_val:])
    origin = f"{train.origin} (seed {seed}'s {100 * fraction:.0f} % held out)"
    return (RawSplit([train.texts[i] for i in keep], [train.labels[i] for i in keep], origin, train.dropped_empty),
            RawSplit([train.texts[i] for i in val], [train.labels[i] for i in val], origin))


def held_out_rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, validation rows) of a training split of `n` documents that has no validation split beside it:
    what `datasets`' train_test_split(test_size=HUB_VALIDATION_FRACTION, seed=HUB_VALIDATION_SEED, shuffle=True)
    keeps, in its order. The one draw of both the hub path and a local folder without a validation file, so that
    `pefusion-data fetch` then `--data-dir` trains on exactly the documents the hub path does. Computed by
    `datasets` itself on a table of row numbers, not re-derived: its rounding (ceil for the held-out part) and
    its order are whatever that library does."""
    import datasets

    rows = datasets.Dataset.from_dict({"row": np.arange(n, dtype=np.int64)})
    held = rows.train_test_split(test_size=HUB_VALIDATION_FRACTION, seed=HUB_VALIDATION_SEED, shuffle=True)
    return np.asarray(held["train"]["row"], dtype=np.int64), np.asarray(held["test"]["row"], dtype=np.int64)


@dataclass(frozen=True)
class DataFileName:
    """A data file's name taken apart: test-00000-of-00002.csv.gz -> stem "test-00000-of-00002", ext ".csv"
    (as written), fmt "csv", compression "gzip"."""
    stem: str
    ext: str
    fmt: str
    compression: str | None


def data_file_name(path: Path) -> DataFileName | None:
    """The parts of a data file's name, or None for a name the readers do not read."""
    name, compression = path.name, None
    for kind, suffix in COMPRESSIONS.items():
        if name.lower().endswith(suffix):
            name, compression = name[:-len(suffix)], kind
            break
    stem, ext = os.path.splitext(name)
    fmt = FILE_FORMATS.get(ext.lower())
    if fmt is None or (fmt == "parquet" and compression):  # Parquet compresses inside the file
        return None
    return DataFileName(stem, ext, fmt, compression)


def _check_head(path: Path) -> DataFileName:
    """Raise DataError when the file is empty or its first bytes contradict its name: compressed data under a
    plain name (or plain data under a compressed one), a zip archive, UTF-16/32 text. Returns the name's parts."""
    name = data_file_name(path)
    with open(path, "rb") as f:
        head = f.read(16)
    if not head:
        raise DataError(f"{path}: the file is empty (0 bytes); write or copy it again")
    found = next((kind for kind, magic in MAGIC_BYTES.items() if re.match(magic, head)), None)
    if found in ("UTF-16", "UTF-32"):
        if name.fmt == "parquet":  # not Parquet at all: pyarrow says so, naming the file
            return name
        raise DataError(f"{path}: the file is {found} text; re-save it as UTF-8 (iconv -f {found} -t UTF-8)")
    if found == name.compression:
        return name
    plain = name.stem + name.ext
    if found is None:
        raise DataError(f"{path}: the name says {name.compression}-compressed but the data is not compressed; "
                        f"rename it to {plain}")
    if found == "zip":
        raise DataError(f"{path}: the file is a zip archive; unzip it and keep its files in {path.parent}")
    if found in COMPRESSIONS and name.fmt != "parquet":
        fix = f"rename it to {plain}{COMPRESSIONS[found]}"
    else:  # zstd (no reader in the standard library), or a compressed Parquet file
        tool = {"bz2": "bzip2"}.get(found, found)
        fix = f"decompress it: {tool} -dc {path.name} > {plain}.tmp && mv {plain}.tmp {plain}"
    raise DataError(f"{path}: the data is {found}-compressed but the name says "
                    f"{name.compression or 'uncompressed'}; {fix}")


def _not_utf8(path: Path, compression: str | None) -> str | None:
    """The one-line message for a data file that is not UTF-8: its first bad byte, that byte's offset from the
    start of the file (the decoder's own error counts from the start of its buffer) and line; None when the file
    decodes cleanly after all. A second pass over the bytes, so reading a good file costs nothing extra."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1
    with OPENERS[compression](path, "rb") as f:
        while True:
            data = f.read(1 << 20)
            pending = decoder.getstate()[0]  # the start of a character split across two reads
            try:
                decoder.decode(data, final=not data)
            except UnicodeDecodeError as e:
                seen = pending + data
                at, line = offset - len(pending) + e.start, line + seen.count(b"\n", 0, e.start)
                where = " of the decompressed data" if compression else ""
                return (f"{path}: not valid UTF-8: byte 0x{seen[e.start]:02x} at byte offset {at}{where} (line "
                        f"{line}); re-save the file as UTF-8 (from Latin-1/Windows-1252: iconv -f CP1252 -t UTF-8)")
            if not data:
                return None
            offset, line = offset + len(data), line + data.count(b"\n")


@contextlib.contextmanager
def open_text(path: Path) -> Iterator[TextIO]:
    """A JSONL/CSV data file as text, for every text reader: decompressed when its name says so, a UTF-8 byte
    order mark skipped, CRLF (and CR) line ends read as "\\n". Raises DataError, in one line, for an empty file, a
    file of blank lines, bytes that contradict the name (`_check_head`), bytes that are not UTF-8 (by byte
    offset), and truncated or corrupt compressed data; also when these surface inside the reader (pandas)."""
    name = _check_head(path)
    with io.TextIOWrapper(OPENERS[name.compression](path, "rb"), encoding="utf-8-sig", newline=None) as text:
        try:
            if not _first_char(text):
                raise DataError(f"{path}: the file has only blank lines; it needs a "
                                f"{'header line and rows' if name.fmt == 'csv' else 'JSON record per line'}")
            yield text
        except UnicodeDecodeError:
            message = _not_utf8(path, name.compression)
            if message is None:
                raise
            raise DataError(message) from None
        except (EOFError, OSError, lzma.LZMAError, zlib.error) as e:
            if name.compression is None:  # an I/O error on a plain file is no data problem
                raise
            raise DataError(f"{path}: cannot decompress the {name.compression} data ({e}); the file is truncated "
                            f"or corrupt, copy or download it again") from None


def _first_char(text: TextIO) -> str:
    """The first non-whitespace character of `text` ("" for none), the stream rewound to its start."""
    while (chunk := text.read(1 << 16)) and not chunk.strip():
        pass
    text.seek(0)
    return chunk.lstrip()[:1]


def _json_line(path: Path, n: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {n} is not valid JSON ({e.msg})") from None


def _read_jsonl(path: Path, text_col: str, label_col: str) -> tuple[list, list]:
    """JSON lines; a .json file holding one array of records is read too."""
    texts, labels = [], []
    with open_text(path) as f:
        if _first_char(f) == "[":
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
            with open_text(path) as f:
                # keep_default_na=False: a text "NA" or "null" is a word, not a missing value.
                frame = pd.read_csv(f, dtype={text_col: str}, keep_default_na=False)
            if not isinstance(frame.index, pd.RangeIndex):  # pandas took the surplus leading fields as an index
                raise DataError(f"{path}: the first row has more fields than the header line "
                                f"({', '.join(frame.columns)}); quote texts that contain commas")
        else:
            _check_head(path)
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
    if fmt == "csv" and frame.empty:
        raise DataError(f"{path}: the file has a header line but no rows")
    return frame[text_col].tolist(), frame[label_col].tolist()


def find_split_files(data_dir: Path, optional: Sequence[str] = ()) -> dict[str, list[Path]]:
    """The file(s) of each split in `data_dir`, found by name prefix: train.jsonl, train_clean.jsonl,
    validation.csv, val.parquet, test.jsonl.gz, test-00000-of-00002.parquet (shards are concatenated in name
    order). A split in `optional` may have no file (it is then left out)."""
    if not data_dir.is_dir():
        raise DataError(f"data directory {str(data_dir)!r} does not exist; {SUPPLY_HINT}")
    named = {p: data_file_name(p) for p in data_dir.iterdir() if p.is_file()}
    found: dict[str, list[Path]] = {}
    for split, aliases in SPLIT_ALIASES.items():
        pattern = re.compile(rf"^({'|'.join(aliases)})([._-].*)?$", re.IGNORECASE)
        files = sorted(p for p, name in named.items() if name and pattern.match(name.stem))
        if not files and split in optional:
            continue
        if not files:
            raise DataError(f"no {split} file in {data_dir} (expected e.g. {split}.jsonl, {split}_clean.jsonl, "
                            f"{split}.csv, {split}.parquet or {split}.jsonl.gz)")
        shards = all(re.search(r"-\d+-of-\d+$", named[p].stem) for p in files)
        if len(files) > 1 and not shards:
            raise DataError(f"several {split} files in {data_dir}: {', '.join(p.name for p in files)}; "
                            f"keep only one")
        found[split] = files
    return found


def read_data_file(path: Path, text_col: str, label_col: str) -> tuple[list, list]:
    """The texts and labels of one JSONL, CSV or Parquet data file (by its name's format)."""
    fmt = data_file_name(path).fmt
    if fmt == "jsonl":
        return _read_jsonl(path, text_col, label_col)
    return _read_table(path, fmt, text_col, label_col)


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


def hub_out_of_reach(dataset: str) -> bool:
    """Whether loading hub dataset `dataset` must stay offline (read the local Hugging Face cache only): asked by
    the user, or the hub is out of reach. A local dataset directory needs no hub."""
    return hub_offline() or (not Path(dataset).exists() and not hub_reachable())


def hub_load_error(where: str, offline: bool, error: Exception, hint: str) -> DataError:
    """The one line for a failed hub load (offline and not cached, unknown name, bad config, gated repo)."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    state = "offline (no internet or HF_HUB_OFFLINE set) and " if offline else ""
    return DataError(f"cannot load {where} from the Hugging Face hub: {state}{type(error).__name__}: {reason}; {hint}")


@contextlib.contextmanager
def forced_offline():
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


def arrow_values(column: Any, origin: str, name: str) -> list:
    """An Arrow column as Python values. A dataset built from local files that are not UTF-8 (the JSON builder
    does not check) holds invalid strings, which fail only here: one line naming the row, not a traceback."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        for row, value in enumerate(column):  # the error path only: find the first bad value
            data = value.as_buffer().to_pybytes() if value.is_valid else b""
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as e:
                near = data[max(0, e.start - 20):e.start + 20]
                raise DataError(f"{origin}: record {row + 1} has a {name!r} that is not valid UTF-8 "
                                f"(...{near!r}...); re-save the dataset's data files as UTF-8") from None
        raise


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
        # (checked on Python's ints: numpy's int64 overflows on a larger one, and the class list below is as long
        # as the largest id: a stray big number in the column is a wrong column, not a billion classes)
        largest = max((max(ints) for ints in as_ints.values() if ints), default=0)
        if largest >= MAX_CLASSES:
            split = next(s for s, ints in as_ints.items() if largest in ints)
            raise DataError(f"{raw[split].origin}: column {label_col!r} has the integer label {largest}; integer "
                            f"labels are kept as class ids, and at most {MAX_CLASSES} classes are taken: renumber "
                            f"them from 0, or write them as names to have them mapped")
        for split, ints in as_ints.items():
            if ints and min(ints) < 0:
                raise DataError(f"{raw[split].origin}: column {label_col!r} has a negative label {min(ints)}")
        ids = {split: np.asarray(ints, dtype=np.int64) for split, ints in as_ints.items()}
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
