"""Data sources (`pefusion.data.sources`): a new kind of source is one class; the existing sources keep the cache
keys they had before they became classes, so corpora already cached are still found."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from conftest import count_tokenisations
from pefusion.data import cache
from pefusion.data.config import DataConfig
from pefusion.data.corpus import load_corpus
from pefusion.data.readers import SPLITS, clean_split
from pefusion.data.sources import Source
from pefusion.errors import ConfigError

DOCS = {"train": [("the cat sat", "pos"), ("the dog ran", "neg"), ("a cat and a dog", "pos"), ("  ", "neg")],
        "validation": [("the cat", "pos"), ("a dog", "neg")],
        "test": [("zebra cat", "pos"), ("dog dog", "neg")]}


@dataclass(frozen=True)
class InMemory(Source):
    """A kind of source the library does not have, defined here as one class and nothing else."""

    docs: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (split, ((text, label), ...))

    @property
    def name(self) -> str:
        return "in-memory"

    def read(self):
        return {split: clean_split([t for t, _ in rows], [y for _, y in rows], f"memory:{split}")
                for split, rows in self.docs}, None

    def identity(self) -> dict[str, Any]:
        return {"kind": "memory", "docs": [[split, [list(r) for r in rows]] for split, rows in self.docs]}


def in_memory(docs: dict[str, list[tuple[str, str]]]) -> InMemory:
    return InMemory(tuple((split, tuple(rows)) for split, rows in docs.items()))


def test_a_new_source_is_one_class_and_runs_through_load_corpus_and_the_cache(tmp_path, monkeypatch):
    cfg = DataConfig(cache_dir=str(tmp_path / "cache"), min_freq=1)  # its source fields name the default hub set
    tokenised = count_tokenisations(monkeypatch)
    corpus = load_corpus(cfg, in_memory(DOCS))
    assert corpus.name == "in-memory" and corpus.meta["name"] == "in-memory"
    assert corpus.meta["source"]["kind"] == "memory" and corpus.label_names == ("neg", "pos")
    # The same documents as files, read by the local-folder source: the same ids and labels.
    folder = tmp_path / "files"
    folder.mkdir()
    for split, rows in DOCS.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    files = load_corpus(DataConfig(data_dir=str(folder), cache_dir=str(tmp_path / "cache"), min_freq=1))
    for split in SPLITS:
        a, b = corpus.split(split), files.split(split)
        for field in ("ids", "offsets", "labels", "raw_lengths"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert len(tokenised) == 2
    # Cached under its identity: read again without tokenising; other documents are another corpus.
    again = load_corpus(cfg, in_memory(DOCS))
    assert len(tokenised) == 2 and again.cache_key == corpus.cache_key != files.cache_key
    other = load_corpus(cfg, in_memory({**DOCS, "test": [("zebra", "pos")]}))
    assert len(tokenised) == 3 and other.cache_key != corpus.cache_key and len(other.test) == 1


# Cache keys and names computed by main's code (pefusion/data/cache.py:source_identity, before sources became
# classes), for fixed configs; a different key would miss every corpus already cached.
KEYS_FROM_MAIN = [
    (DataConfig(synthetic=True), "6ea108edfca37ff65332", "synthetic"),
    (DataConfig(synthetic=True, synthetic_task="relative", synthetic_seed=3, synthetic_train=40, synthetic_val=10,
                synthetic_test=10, max_len=64), "89dcddd6262694e9ce8d", "synthetic-relative"),
    (DataConfig(synthetic=True, synthetic_task="spread", synthetic_train=900, synthetic_val=1000,  # the demo's
                synthetic_test=500, max_len=64, length_edges=(128, 512)), "49cf7fb49aa1edce96d9", "synthetic-spread"),
    (DataConfig(), "1bc174ea61887fac8186", "ccdv/arxiv-classification"),
    (DataConfig(dataset="someone/papers", dataset_config=None, text_column="abstract", tokenizer="words"),
     "c7d6ac8370a0729c9ddd", "someone/papers"),
    (DataConfig(dataset="stanfordnlp/imdb", dataset_config=None, tokenizer="words", max_len=256,  # the text preset's
                length_edges=(128, 256, 512, 1024)), "8d0ba4930aae729f8b2e", "stanfordnlp/imdb"),
]


@pytest.mark.parametrize("cfg,key,name", KEYS_FROM_MAIN)
def test_synthetic_and_hub_sources_keep_their_cache_keys(cfg, key, name):
    assert cache.cache_key(cfg) == key
    assert cfg.source_name == name


def test_local_folder_keeps_its_cache_key(tmp_path):
    data = tmp_path / "my corpus"
    data.mkdir()
    stamps = []
    for i, (split, file) in enumerate([("train", "train_clean.jsonl"), ("validation", "val.csv"),
                                       ("test", "test.jsonl")]):
        path = data / file
        path.write_text('{"text": "a b", "label": 1}\n' if file.endswith("jsonl") else "text,label\na b,1\n")
        os.utime(path, ns=(1_700_000_000_000_000_000 + i, 1_700_000_000_000_000_000 + i))
        stamps.append([split, str(path.resolve()), path.stat().st_size, 1_700_000_000_000_000_000 + i])
    cfg = DataConfig(data_dir=str(data) + "/", label_column="y", max_len=128)
    # main's key: sha256 of the sorted JSON of the source's files and columns with the tokeniser settings.
    payload = {"source": {"kind": "local", "files": stamps, "columns": ["text", "y"]}, "tokenizer": "whitespace",
               "min_freq": 2, "max_vocab": 50_000, "max_len": 128, "format": 1}
    assert cache.cache_key(cfg) == hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]
    assert cfg.source_name == "my corpus"


def test_two_sources_at_once_are_refused_naming_the_fix():
    with pytest.raises(ConfigError, match=r"synthetic=True and data_dir='d' name two sources; set synthetic=False "
                                          r"to read the files, or data_dir=None for the synthetic corpus"):
        DataConfig(synthetic=True, data_dir="d")


# ---------------------------------------------------------------------------------------------------------
# A validation split drawn per seed (the agnews preset)
# ---------------------------------------------------------------------------------------------------------

N_TRAIN = 40
TRAIN_DOCS = [(f"doc{i} w{i % 3} w{i % 7}", "pos" if i % 2 else "neg") for i in range(N_TRAIN)]


def notebook_split(seed: int) -> tuple[list[str], list[str]]:
    """The AG News notebook's draw: a permutation by np.random.default_rng(seed), its first 10 % validation."""
    order = np.random.default_rng(seed).permutation(N_TRAIN)
    val = [TRAIN_DOCS[i][0] for i in order[:N_TRAIN // 10]]
    return [t for t, _ in TRAIN_DOCS if t not in val], val


def test_a_hub_dataset_without_validation_gets_each_seeds_own_split_and_vocabulary(tmp_path, monkeypatch):
    import datasets

    from pefusion.data import readers
    from pefusion.fusion.config import PRESETS, trial_data

    def load_dataset(name, config):
        rows = {"train": TRAIN_DOCS, "test": DOCS["test"]}
        return datasets.DatasetDict({s: datasets.Dataset.from_dict({"text": [t for t, _ in r],
                                                                     "label": [y for _, y in r]})
                                     for s, r in rows.items()})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(readers, "hub_reachable", lambda timeout=0: False)
    base = PRESETS["agnews"]
    base = base.__class__(model=base.model, train=base.train, data=DataConfig(
        **{**base.data.__dict__, "cache_dir": str(tmp_path / "cache"), "min_freq": 1}))
    corpora = {}
    for seed in (0, 1):
        cfg = trial_data({"seed": seed}, base)
        assert cfg.split_seed == seed and cfg.tokenizer_setting.endswith(f"/split{seed}")
        raw, _ = cfg.source.read()
        train, val = notebook_split(seed)
        assert (raw["train"].texts, raw["validation"].texts) == (train, val)
        corpora[seed] = load_corpus(cfg)
        assert (len(corpora[seed].train), len(corpora[seed].validation)) == (36, 4)
    assert corpora[0].cache_key != corpora[1].cache_key  # each seed its own corpus: its own vocabulary
    assert corpora[0].meta["source"]["split_seed"] == 0
    # Without the preset's per-seed draw, the hub's fixed seed-0 split and its cache key stay as they were.
    fixed = DataConfig(**{**base.data.__dict__, "split_per_seed": False})
    assert "split_seed" not in fixed.source.identity() and "/split" not in fixed.tokenizer_setting


def test_a_folder_without_validation_file_holds_out_as_the_hub_does_or_per_seed_when_asked(tmp_path):
    import datasets

    folder = tmp_path / "agnews"
    folder.mkdir()
    for split, rows in (("train", TRAIN_DOCS), ("test", DOCS["test"])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    # Without a per-seed split: datasets' own train_test_split(test_size=0.1, seed=0) of the training file.
    raw, _ = DataConfig(data_dir=str(folder), cache_dir=str(tmp_path / "c")).source.read()
    want = datasets.Dataset.from_dict({"text": [t for t, _ in TRAIN_DOCS]}).train_test_split(test_size=0.1, seed=0)
    assert (raw["train"].texts, raw["validation"].texts) == (want["train"]["text"], want["test"]["text"])
    cfg = DataConfig(data_dir=str(folder), cache_dir=str(tmp_path / "c"), split_per_seed=True, split_seed=3)
    raw, _ = cfg.source.read()
    assert (raw["train"].texts, raw["validation"].texts) == notebook_split(3)
    assert cfg.source.identity()["held_out"] == [3, 0.1]
