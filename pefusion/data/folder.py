"""Data folders for machines without internet: a hub dataset written once as the local files `--data-dir` reads
(`fetch`), with a manifest of where it came from, and a folder checked against its manifest (`check`).

Compute nodes on Slurm and Kubernetes are usually offline; a login node (or a Kubernetes Job) runs
`pefusion-data fetch imdb --out DIR` and the sweep runs with `--data-dir DIR`. The folder holds the dataset's own
splits as the hub has them, one Parquet file each (`train.parquet`, `test.parquet`, and `validation.parquet` where
the hub has one), with the preset's text and label columns. A dataset without a validation split (IMDB, AG News)
gets none here: the sweep holds out 10 % of train from the folder exactly as it does from the hub
(`readers.held_out_rows`, or per seed where the preset draws per seed), so one folder serves every seed.

The manifest (`manifest.json`) says what the folder is: the hub dataset and config, the revision `datasets`
resolved (the hub's commit; for a local dataset directory, `datasets`' hash of its files), the rows and SHA-256 of
each file, the class names and the columns. `check` recomputes every checksum and reads every file with the
sweep's own reader, so a folder that passes is one the sweep reads.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pefusion.data import readers
from pefusion.data.readers import (HUB_VALIDATION_FRACTION, HUB_VALIDATION_SEED, SPLIT_ALIASES, SPLITS, DataError,
                                   find_split_files, read_data_file)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class HubSource:
    """Which hub dataset a folder is made from, and which of its columns the sweep reads."""

    dataset: str  # a hub name ("stanfordnlp/imdb") or a local dataset directory `datasets` loads
    config: str | None
    text_column: str = "text"
    label_column: str = "label"
    revision: str | None = None  # a hub branch, tag or commit; None: the newest


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _load(source: HubSource) -> tuple[Any, str]:
    """The dataset's splits (a DatasetDict) and the revision `datasets` resolved, read as a sweep reads the hub
    (`sources.HubDataset`): offline at once where the hub cannot be reached; any failure one DataError line."""
    import datasets

    where = f"dataset {source.dataset!r}" + (f" (config {source.config!r})" if source.config else "")
    offline = readers.hub_out_of_reach(source.dataset)
    try:
        with readers.forced_offline() if offline else contextlib.nullcontext():
            # load_dataset's own steps, kept apart for the revision the builder resolved (the hub's commit)
            builder = datasets.load_dataset_builder(source.dataset, source.config, revision=source.revision)
            builder.download_and_prepare()
            return builder.as_dataset(), str(builder.hash)
    except Exception as e:
        raise readers.hub_load_error(where, offline, e, "run this where the hub is reachable, then copy the "
                                                        "folder") from e


def fetch(source: HubSource, out: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Write `source`'s train, test (and validation, where it has one) splits into `out` as Parquet files of its
    text and label columns, then the manifest; returns the manifest. A folder that already holds this source,
    intact (`check`), is left as it is: a rerun (a retried Job) downloads nothing."""
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    if (out / MANIFEST).exists():
        old = json.loads((out / MANIFEST).read_text())
        same = {k: old.get("source", {}).get(k) for k in ("dataset", "config")} == \
            {"dataset": source.dataset, "config": source.config}
        if same and (source.revision is None or old["source"].get("revision") == source.revision) \
                and not check(out).problems:
            say(f"{out} already holds {source.dataset} (revision {old['source'].get('revision')}), intact: nothing "
                f"to do")
            return old
    dsd, revision = _load(source)
    names = {split: next((a for a in aliases if a in dsd), None) for split, aliases in SPLIT_ALIASES.items()}
    if names["train"] is None or names["test"] is None:
        raise DataError(f"{source.dataset} has splits {', '.join(dsd)}; a folder needs train and test")
    files: dict[str, Any] = {}
    for split, name in names.items():
        if name is None:
            continue
        part = dsd[name]
        missing = [c for c in (source.text_column, source.label_column) if c not in part.column_names]
        if missing:
            raise DataError(f"{source.dataset} split {name!r} has no column {missing[0]!r} "
                            f"(columns: {', '.join(part.column_names)})")
        table = part.select_columns([source.text_column, source.label_column]).with_format("arrow")[:]
        path = out / f"{split}.parquet"
        partial = path.with_name(path.name + ".partial")  # a killed download leaves no file the readers take
        pq.write_table(table, partial)
        os.replace(partial, path)
        files[split] = {"file": path.name, "rows": table.num_rows, "sha256": sha256(path)}
        say(f"wrote {path}: {table.num_rows} rows of {source.dataset} split {name!r}")
    feature = dsd[names["train"]].features[source.label_column]
    manifest = {
        "format": MANIFEST_FORMAT,
        "source": {"dataset": source.dataset, "config": source.config, "revision": revision},
        "columns": {"text": source.text_column, "label": source.label_column},
        "class_names": list(getattr(feature, "names", None) or []),
        "splits": files,
        "validation": ("the dataset's own" if "validation" in files else
                       f"none: the sweep holds out {100 * HUB_VALIDATION_FRACTION:.0f} % of train (seed "
                       f"{HUB_VALIDATION_SEED}, or each seed's own draw where the preset draws per seed), exactly as "
                       f"from the hub"),
        "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    say(f"wrote {out / MANIFEST}")
    return manifest


@dataclass(frozen=True)
class Checked:
    """What `check` found: each split's rows as the sweep's reader reads them, and every problem in one line."""

    rows: dict[str, int]
    problems: tuple[str, ...]
    manifest: dict[str, Any] | None


def check(folder: Path, text_column: str | None = None, label_column: str | None = None) -> Checked:
    """Every file the sweep would read in `folder` read with its reader (`readers.find_split_files`,
    `read_data_file`), and, where a manifest is present, each file's SHA-256 and rows against it. Columns: the
    manifest's, else `text_column`/`label_column`, else text and label."""
    problems: list[str] = []
    manifest = None
    if (folder / MANIFEST).exists():
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
        except json.JSONDecodeError as e:
            return Checked({}, (f"{folder / MANIFEST}: not valid JSON ({e.msg})",), None)
    columns = (manifest or {}).get("columns", {})
    text_column = text_column or columns.get("text", "text")
    label_column = label_column or columns.get("label", "label")
    try:
        found = find_split_files(folder, optional=("validation",))
    except DataError as e:
        return Checked({}, (str(e),), manifest)
    rows = {}
    for split, paths in found.items():
        try:
            rows[split] = sum(len(read_data_file(p, text_column, label_column)[0]) for p in paths)
        except DataError as e:
            problems.append(str(e))
    if manifest is not None:
        listed = manifest.get("splits", {})
        for split, entry in listed.items():
            path = folder / entry["file"]
            if not path.exists():
                problems.append(f"{path}: listed in {MANIFEST} but missing")
                continue
            if sha256(path) != entry["sha256"]:
                problems.append(f"{path}: SHA-256 differs from {MANIFEST}'s (changed or truncated); fetch it again")
            if split in rows and rows[split] != entry["rows"]:
                problems.append(f"{path}: {rows[split]} rows, {MANIFEST} says {entry['rows']}")
        extra = [p.name for s, ps in found.items() for p in ps if s not in listed or p.name != listed[s]["file"]]
        if extra:
            problems.append(f"{folder}: {', '.join(extra)} not in {MANIFEST}; the sweep would read them too")
    return Checked(rows, tuple(problems), manifest)


def describe_rows(rows: dict[str, int]) -> str:
    """'train 22 500, validation: 10 % of train held out, test 25 000' in the readers' split order."""
    parts = []
    for split in SPLITS:
        if split in rows:
            parts.append(f"{split} {rows[split]}")
        elif split == "validation":
            parts.append(f"validation: none, {100 * HUB_VALIDATION_FRACTION:.0f} % of train held out by the sweep")
    return ", ".join(parts)
