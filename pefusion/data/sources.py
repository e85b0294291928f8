"""Where documents come from: one small class per kind of source (`pefusion.data.config.source_of` picks a
DataConfig's).

A source answers three questions (`Source`): its documents (`read`: texts and labels per split, and the class
names when it has them), what those documents depend on (`identity`: the source's part of the token cache's key,
so an edited file or a changed setting finds no entry instead of a stale one), and a short `name` recorded with
every trial (the `dataset` param). Everything after reading (labels to ids, tokenising, caching) is the same for
every source (`corpus.load_corpus`), so a new kind of source is one new class here; `load_corpus(cfg, source)`
reads any `Source`, and `config.source_of` is the one place a DataConfig field would pick it. This module knows
no DataConfig: the config imports its sources, never the other way round.
"""
from __future__ import annotations

import abc
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pefusion.data import readers
from pefusion.data import synthetic as synthetic_corpus
from pefusion.data.readers import (HUB_VALIDATION_FRACTION, HUB_VALIDATION_SEED, SPLIT_ALIASES, SUPPLY_HINT,
                                   DataError, RawSplit, clean_split, find_split_files, held_out_rows, hold_out,
                                   read_data_file)

log = logging.getLogger(__name__)

Read = tuple[dict[str, RawSplit], tuple[str, ...] | None]  # raw splits by name, class names (None: from labels)


class Source(abc.ABC):
    """A kind of source: its documents, what they depend on, and its name."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Short dataset name recorded with every trial (the `dataset` param)."""

    @abc.abstractmethod
    def read(self) -> Read:
        """The train/validation/test `RawSplit`s, and the class names when the source has them."""

    @abc.abstractmethod
    def identity(self) -> dict[str, Any]:
        """JSON-able description of which documents, from where, in which columns: the source's part of the cache
        key. Change it only with a reason: a different identity misses every corpus already cached."""


@dataclass(frozen=True)
class SyntheticCorpus(Source):
    """The bundled synthetic corpus (`pefusion.data.synthetic`), generated from its task, sizes and seed."""

    task: str
    sizes: tuple[int, int, int]  # train, validation, test documents
    seed: int

    @property
    def name(self) -> str:
        return "synthetic" if self.task == "order" else f"synthetic-{self.task}"

    def read(self) -> Read:
        corpus = synthetic_corpus.generate_synthetic_corpus(*self.sizes, seed=self.seed, task=self.task)
        return {split: clean_split([d["text"] for d in docs], [d["label"] for d in docs], f"synthetic:{split}")
                for split, docs in corpus.items()}, None

    def identity(self) -> dict[str, Any]:
        return {"kind": "synthetic", "generator": synthetic_corpus.GENERATOR_VERSION,
                "settings": synthetic_corpus.default_settings(self.task), "sizes": list(self.sizes),
                "seed": self.seed}


@dataclass(frozen=True)
class LocalFolder(Source):
    """A directory of train/validation/test JSONL, CSV or Parquet files (`readers.find_split_files`). A folder
    without a validation file gets HUB_VALIDATION_FRACTION of its training file held out exactly as `HubDataset`
    does for a hub dataset without a validation split: `readers.held_out_rows` (seed 0), or with `split_seed`
    `readers.hold_out` for that seed (what `pefusion-data fetch` writes for IMDB and AG News, which have none)."""

    data_dir: str
    text_column: str
    label_column: str
    split_seed: int | None = None

    def _files(self) -> dict[str, list[Path]]:
        return find_split_files(Path(self.data_dir), optional=("validation",))

    @property
    def name(self) -> str:
        return self.data_dir.rstrip("/").split("/")[-1] or self.data_dir

    def read(self) -> Read:
        read = {}
        for split, paths in self._files().items():
            texts, labels = [], []
            for path in paths:
                t, y = read_data_file(path, self.text_column, self.label_column)
                texts += t
                labels += y
            read[split] = (texts, labels, ", ".join(map(str, paths)))
        if "validation" not in read and self.split_seed is None:
            # Before dropping empty texts, as the hub path draws from the dataset's rows.
            texts, labels, origin = read["train"]
            keep, held = held_out_rows(len(texts))
            origin = (f"{origin} ({100 * HUB_VALIDATION_FRACTION:.0f} % held out with seed {HUB_VALIDATION_SEED}, "
                      f"as from the hub)")
            for split, rows in (("train", keep), ("validation", held)):
                read[split] = ([texts[i] for i in rows], [labels[i] for i in rows], origin)
            log.info("%s has no validation file: holding out %.0f%% of train with seed %d, as the hub path does",
                     self.data_dir, 100 * HUB_VALIDATION_FRACTION, HUB_VALIDATION_SEED)
        raw = {split: clean_split(*r) for split, r in read.items()}
        if "validation" not in raw:
            raw["train"], raw["validation"] = hold_out(raw["train"], self.split_seed)
        return raw, None

    def identity(self) -> dict[str, Any]:
        # Paths, sizes and modification times: an edited or replaced file is a new corpus.
        stamp, files = [], self._files()
        for split, paths in files.items():
            for p in paths:
                st = p.stat()
                stamp.append([split, str(p.resolve()), st.st_size, st.st_mtime_ns])
        # held_out [None, fraction]: `held_out_rows`' one draw; [seed, fraction]: `hold_out`'s draw for that seed.
        drawn = {} if "validation" in files else {"held_out": [self.split_seed, HUB_VALIDATION_FRACTION]}
        return {"kind": "local", "files": stamp, "columns": [self.text_column, self.label_column], **drawn}


@dataclass(frozen=True)
class HubDataset(Source):
    """A Hugging Face dataset (`datasets.load_dataset`: a hub name or a local dataset directory). The hub is probed
    first, so that a machine without internet reads the local Hugging Face cache at once instead of waiting out
    the client's retries; a dataset without a validation split gets HUB_VALIDATION_FRACTION of train: drawn with
    seed 0 by `datasets`' train_test_split, or with `split_seed` by `readers.hold_out` (one draw per seed)."""

    dataset: str
    config: str | None
    text_column: str
    label_column: str
    split_seed: int | None = None

    @property
    def name(self) -> str:
        return self.dataset

    def identity(self) -> dict[str, Any]:
        drawn = {} if self.split_seed is None else {"split_seed": self.split_seed}
        return {"kind": "hub", "dataset": self.dataset, "config": self.config,
                "columns": [self.text_column, self.label_column], "validation_fraction": HUB_VALIDATION_FRACTION,
                **drawn}

    def read(self) -> Read:
        import datasets

        where = f"dataset {self.dataset!r}" + (f" (config {self.config!r})" if self.config else "")
        offline = readers.hub_out_of_reach(self.dataset)
        try:
            with readers.forced_offline() if offline else contextlib.nullcontext():
                dsd = datasets.load_dataset(self.dataset, self.config)
        except Exception as e:  # offline + not cached, unknown name, bad config, gated repo: all one message
            raise readers.hub_load_error(where, offline, e, SUPPLY_HINT) from e

        names = {}
        for split, aliases in SPLIT_ALIASES.items():
            names[split] = next((a for a in aliases if a in dsd), None)
        if names["train"] is None or names["test"] is None:
            raise DataError(f"{where} has splits {', '.join(dsd)}; it needs train and test (and optionally "
                            f"validation)")
        parts = {split: dsd[name] for split, name in names.items() if name is not None}
        if names["validation"] is None and self.split_seed is None:
            # Fixed seed: every trial and every later run sees the same held-out documents.
            keep, held = held_out_rows(len(parts["train"]))
            parts["train"], parts["validation"] = parts["train"].select(keep), parts["train"].select(held)
            log.info("%s has no validation split: holding out %.0f%% of train with seed %d", where,
                     100 * HUB_VALIDATION_FRACTION, HUB_VALIDATION_SEED)

        raw = {}
        for split, part in parts.items():
            for col in (self.text_column, self.label_column):
                if col not in part.column_names:
                    raise DataError(f"{where} split {split!r} has no column {col!r} "
                                    f"(columns: {', '.join(part.column_names)}); set text_column/label_column")
            table = part.with_format("arrow")[:]  # an arrow table (with any held-out split applied): no row access
            origin = f"{where} split {names[split] or 'train'!r}"
            texts, labels = (readers.arrow_values(table.column(c), origin, c)
                             for c in (self.text_column, self.label_column))
            raw[split] = clean_split(texts, labels, origin)
        if "validation" not in raw:
            raw["train"], raw["validation"] = hold_out(raw["train"], self.split_seed)
            log.info("%s has no validation split: holding out %.0f%% of train drawn with seed %d", where,
                     100 * HUB_VALIDATION_FRACTION, self.split_seed)
        feature = parts["train"].features[self.label_column]
        label_names = tuple(feature.names) if isinstance(feature, datasets.ClassLabel) else None
        return raw, label_names

