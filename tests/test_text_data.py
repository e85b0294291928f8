"""Text data pipeline: sources, train-only vocabulary, token-id cache, length-bucketed batching, length buckets."""
from __future__ import annotations

import bz2
import collections
import gzip
import io
import json
import lzma
import random
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import count_tokenisations
from pefusion.data import batching, cache, readers, tokenizer
from pefusion.data.config import DataConfig
from pefusion.data.corpus import load_corpus
from pefusion.record import length_bucket_labels
from pefusion.data.encoded import EncodedSplit
from pefusion.data.readers import DataError
from pefusion.data.tokenizer import PAD_ID, UNK_ID

# "the" x3, "cat" x2 in train; "dog" once (below min_freq); "zebra" only in test.
TRAIN = [("The cat sat", "pos"), ("the CAT ran far", "neg"), ("the dog", "pos"), ("   ", "neg")]
VALIDATION = [("the cat", "neg"), ("far away", "pos")]
TEST = [("zebra the cat", "pos"), ("dog dog dog dog", "neg")]
SPLITS = {"train": TRAIN, "validation": VALIDATION, "test": TEST}


def write_split(path: Path, rows, text_col="text", label_col="label") -> None:
    frame = pd.DataFrame({text_col: [t for t, _ in rows], label_col: [y for _, y in rows]})
    if path.suffix in (".jsonl", ".json"):
        frame.to_json(path, orient="records", lines=True)
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)


def make_dir(root: Path, ext: str = ".jsonl", suffix: str = "", splits=SPLITS, **cols) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        write_split(root / f"{split}{suffix}{ext}", rows, **cols)
    return root


def cfg_for(tmp_path: Path, data_dir: Path, **kw) -> DataConfig:
    return DataConfig(data_dir=str(data_dir), cache_dir=str(tmp_path / "cache"), **kw)


def docs(split: EncodedSplit) -> list[list[int]]:
    return [split.doc(i).tolist() for i in range(len(split))]


# ---------------------------------------------------------------------------------------------------------
# Sources and vocabulary
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext,suffix", [(".jsonl", ""), (".jsonl", "_clean"), (".csv", ""), (".parquet", ""),
                                        (".json", "")])
def test_each_format_loads_with_train_only_vocab_and_string_labels(tmp_path, ext, suffix):
    corpus = load_corpus(cfg_for(tmp_path, make_dir(tmp_path / "data", ext, suffix)))
    # specials, then "the" (3), "cat" (2); "sat", "ran", "far", "dog" occur once in train -> not in vocab.
    vocab = cache.load_vocab(corpus, cfg_for(tmp_path, tmp_path / "data"))
    assert vocab == ["<pad>", "<unk>", "the", "cat"]
    assert corpus.vocab_size == 4
    the, cat = 2, 3
    # The whitespace-only train document is dropped and counted.
    assert len(corpus.train) == 3 and corpus.meta["dropped_empty"] == {"train": 1, "validation": 0, "test": 0}
    assert docs(corpus.train) == [[the, cat, UNK_ID], [the, cat, UNK_ID, UNK_ID], [the, UNK_ID]]
    # "far" occurs in train once only; "zebra" never occurs in train: both UNK.
    assert docs(corpus.validation) == [[the, cat], [UNK_ID, UNK_ID]]
    assert docs(corpus.test) == [[UNK_ID, the, cat], [UNK_ID] * 4]
    # String labels -> ids of the sorted unique train labels.
    assert corpus.label_names == ("neg", "pos") and corpus.num_classes == 2
    assert corpus.train.labels.tolist() == [1, 0, 1]
    assert corpus.validation.labels.tolist() == [0, 1] and corpus.test.labels.tolist() == [1, 0]
    assert corpus.train.ids.dtype == np.int32 and corpus.train.offsets.dtype == np.int64
    assert corpus.name == "data"


def test_paper_layout_with_integer_labels_and_custom_columns(tmp_path):
    rows = {s: [(t, i % 3) for i, (t, _) in enumerate(r)] for s, r in SPLITS.items()}
    data = make_dir(tmp_path / "data", ".jsonl", "_clean", splits=rows, text_col="body", label_col="y")
    corpus = load_corpus(cfg_for(tmp_path, data, text_column="body", label_column="y"))
    assert corpus.train.labels.tolist() == [0, 1, 2]  # the dataset's own integer ids are kept
    assert corpus.num_classes == 3 and corpus.label_names == ("0", "1", "2")


def test_validation_alias_and_hf_style_shards(tmp_path):
    data = tmp_path / "data"
    make_dir(data, ".parquet", splits={"train": TRAIN, "test": TEST})
    write_split(data / "val.csv", VALIDATION)
    corpus = load_corpus(cfg_for(tmp_path, data))
    assert len(corpus.validation) == 2
    shards = tmp_path / "shards"
    shards.mkdir()
    write_split(shards / "train-00000-of-00002.parquet", TRAIN[:2])
    write_split(shards / "train-00001-of-00002.parquet", TRAIN[2:])
    for split in ("validation", "test"):
        write_split(shards / f"{split}-00000-of-00001.parquet", SPLITS[split])
    sharded = load_corpus(cfg_for(tmp_path, shards))
    assert docs(sharded.train) == docs(corpus.train)


def test_build_vocab_order_min_freq_and_max_vocab():
    texts = ["b a c", "a b d", "c e", "a"]  # a:3, b:2, c:2 (b seen first), d:1, e:1
    assert list(tokenizer.build_vocab(texts, min_freq=2)) == ["<pad>", "<unk>", "a", "b", "c"]
    assert list(tokenizer.build_vocab(texts, min_freq=1)) == ["<pad>", "<unk>", "a", "b", "c", "d", "e"]
    assert list(tokenizer.build_vocab(texts, min_freq=1, max_vocab=4)) == ["<pad>", "<unk>", "a", "b"]  # incl. specials


def test_training_split_encoding_equals_vocab_then_encode_and_the_counter_definition():
    rng = random.Random(0)
    words = ["Alpha", "beta", "GAMMA", "délta", "ÉPSILON", "zeta", "eta", "ThEtA", "iota", "kappa"] + [
        f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choices(words, weights=[1 / (k + 1) for k in range(len(words))], k=rng.randint(1, 60)))
             + rng.choice(["", "\t\n", "  "]) for _ in range(200)]
    for min_freq, max_vocab, max_len in [(2, 50_000, 16), (1, 40, 7), (3, 12, 100)]:
        vocab, (ids, offsets, raw) = tokenizer.encode_training_split(texts, min_freq, max_vocab, max_len)
        assert vocab == tokenizer.build_vocab(texts, min_freq, max_vocab)
        ref_ids, ref_offsets, ref_raw = tokenizer.encode(texts, vocab, max_len)
        assert ids.dtype == ref_ids.dtype == np.int32
        assert ids.tolist() == ref_ids.tolist() and offsets.tolist() == ref_offsets.tolist()
        assert raw.tolist() == ref_raw.tolist()
        # the definition: collections.Counter's most_common order (count, then first appearance), min_freq, cap
        counts = collections.Counter(w for t in texts for w in t.lower().split())
        expected = [w for w, n in counts.most_common() if n >= min_freq][:max_vocab - 2]
        assert list(vocab) == ["<pad>", "<unk>", *expected]


def test_words_spelled_like_special_tokens_never_take_their_ids():
    texts = ["<unk> a <pad> a", "<UNK> b <pad>", "a b"]
    vocab, (ids, _, _) = tokenizer.encode_training_split(texts, 1, 100, 10)
    assert vocab == {"<pad>": 0, "<unk>": 1, "a": 2, "b": 3}
    assert ids.tolist() == [1, 2, 1, 2, 1, 3, 1, 2, 3]  # both map to UNK: "<pad>" must not read as padding
    assert tokenizer.encode(texts, vocab, 10)[0].tolist() == ids.tolist()


def test_encode_truncates_but_keeps_raw_lengths():
    vocab = {"<pad>": 0, "<unk>": 1, "a": 2, "b": 3}
    ids, offsets, raw = tokenizer.encode(["a b a b a", "B", "c a"], vocab, max_len=3)
    assert ids.tolist() == [2, 3, 2, 3, 1, 2]
    assert offsets.tolist() == [0, 3, 4, 6] and raw.tolist() == [5, 1, 2]
    naive = [[vocab.get(w, 1) for w in t.lower().split()][:3] for t in ["a b a b a", "B", "c a"]]
    assert sum(naive, []) == ids.tolist()


# ---------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------


def test_second_load_reads_the_cache_without_tokenising(tmp_path, monkeypatch):
    cfg = cfg_for(tmp_path, make_dir(tmp_path / "data"))
    tokenised = count_tokenisations(monkeypatch)
    first = load_corpus(cfg)
    assert len(tokenised) == 1
    second = load_corpus(cfg)
    assert len(tokenised) == 1  # read from disk, not tokenised again
    assert second.cache_key == first.cache_key
    for split in readers.SPLITS:
        a, b = first.split(split), second.split(split)
        for name in ("ids", "offsets", "labels", "raw_lengths"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert second.label_names == first.label_names and second.vocab_size == first.vocab_size
    entry = tmp_path / "cache" / first.cache_key
    assert sorted(p.name for p in entry.iterdir()) == ["arrays.npz", "meta.json", "vocab.txt"]
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # no temp dir left
    # PEFUSION_CACHE is the default location when cache_dir is not set.
    monkeypatch.setenv("PEFUSION_CACHE", str(tmp_path / "env_cache"))
    assert cache.cache_root(DataConfig()) == tmp_path / "env_cache"


def test_cache_key_changes_with_settings_and_files(tmp_path):
    data = make_dir(tmp_path / "data")
    base = cache.cache_key(cfg_for(tmp_path, data))
    assert cache.cache_key(cfg_for(tmp_path, data)) == base
    assert cache.cache_key(cfg_for(tmp_path, data, max_len=7)) != base
    assert cache.cache_key(cfg_for(tmp_path, data, min_freq=1)) != base
    assert cache.cache_key(cfg_for(tmp_path, data, max_vocab=100)) != base
    assert cache.cache_key(cfg_for(tmp_path, data, label_column="y")) != base
    with open(data / "test.jsonl", "a") as f:  # an edited data file is a new corpus
        f.write(json.dumps({"text": "one more", "label": "pos"}) + "\n")
    assert cache.cache_key(cfg_for(tmp_path, data)) != base
    syn = DataConfig(synthetic=True)
    assert cache.cache_key(syn) != cache.cache_key(DataConfig(synthetic=True, synthetic_seed=1))
    assert cache.cache_key(DataConfig()) != cache.cache_key(DataConfig(dataset_config=None))


def test_racing_cache_writer_keeps_the_first_entry(tmp_path):
    entry = tmp_path / "cache" / "k"
    arrays = {"x": np.arange(3)}
    cache.write_cache(entry, arrays, {"n": 1}, {"<pad>": 0})
    cache.write_cache(entry, {"x": np.arange(5)}, {"n": 2}, {"<pad>": 0})  # the loser of a race: no error
    assert json.loads((entry / "meta.json").read_text()) == {"n": 1}
    assert [p.name for p in entry.parent.iterdir()] == ["k"]


# ---------------------------------------------------------------------------------------------------------
# User errors: one line naming the problem
# ---------------------------------------------------------------------------------------------------------


def assert_one_line_error(cfg: DataConfig, *fragments: str) -> None:
    with pytest.raises(DataError) as err:
        load_corpus(cfg)
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_missing_directory_and_missing_split(tmp_path):
    assert_one_line_error(cfg_for(tmp_path, tmp_path / "nope"), "nope", "does not exist", "--data-dir")
    data = make_dir(tmp_path / "data", splits={"train": TRAIN, "validation": VALIDATION})
    assert_one_line_error(cfg_for(tmp_path, data), "no test file", str(data))
    write_split(data / "test.csv", TEST)
    write_split(data / "test_clean.jsonl", TEST)
    assert_one_line_error(cfg_for(tmp_path, data), "several test files", "test.csv", "test_clean.jsonl")


@pytest.mark.parametrize("ext", [".jsonl", ".csv", ".parquet"])
def test_missing_column_names_file_and_column(tmp_path, ext):
    data = make_dir(tmp_path / "data", ext, label_col="category")
    assert_one_line_error(cfg_for(tmp_path, data), f"train{ext}", "'label'", "category")


def test_malformed_files(tmp_path):
    data = make_dir(tmp_path / "data")
    with open(data / "validation.jsonl", "a") as f:
        f.write('{"text": "broken", "label": \n')
    assert_one_line_error(cfg_for(tmp_path, data), "validation.jsonl", "line 3", "not valid JSON")
    data = make_dir(tmp_path / "pq", ".parquet")
    (data / "test.parquet").write_bytes(b"this is not parquet")
    assert_one_line_error(cfg_for(tmp_path, data), "test.parquet", "cannot read as PARQUET")


def test_csv_that_pandas_cannot_parse(tmp_path):
    data = make_dir(tmp_path / "data", ".csv")
    (data / "train.csv").write_text('text,label\n"never closed,pos\nthe dog,neg\n')
    assert_one_line_error(cfg_for(tmp_path, data), "train.csv: cannot read as CSV (Error tokenizing data. C error: "
                                                   "EOF inside string starting at row 1)")


def test_csv_first_row_wider_than_the_header(tmp_path):
    """pandas would silently take the surplus leading fields as an index: text and label from the wrong fields."""
    data = make_dir(tmp_path / "data", ".csv")
    (data / "train.csv").write_text("text,label\nthe cat, sat,pos\nthe dog,neg\n")
    assert_one_line_error(cfg_for(tmp_path, data), "train.csv", "the first row has more fields than the header line",
                          "quote texts that contain commas")


def jsonl_bytes(rows) -> bytes:
    return b"".join(json.dumps({"text": t, "label": y}).encode() + b"\n" for t, y in rows)


def dir_with_train(root: Path, name: str, data: bytes) -> Path:
    """A data directory whose train file is `name`, holding `data`; validation and test are good JSONL files."""
    make_dir(root, splits={"validation": VALIDATION, "test": TEST})
    (root / name).write_bytes(data)
    return root


LATIN1 = jsonl_bytes(TRAIN[:2]) + b'{"text": "caf\xe9 au lait", "label": "pos"}\n' + jsonl_bytes(TRAIN[2:])
# A 2-byte character across the 1 MiB boundary of the offset scanner's reads, then a Latin-1 byte.
ACROSS_READS = b'{"text": "' + b"a" * ((1 << 20) - 11) + "\u00e9 x".encode() + b'", "label": "pos"}\n' + LATIN1


@pytest.mark.parametrize("name,data,compress", [
    ("train.jsonl", LATIN1, None),
    ("train.csv", b"text,label\r\nthe cat,pos\r\ncaf\xe9,neg\r\n", None),
    ("train.jsonl.gz", LATIN1, gzip.compress),
    ("train.jsonl", ACROSS_READS, None),
], ids=["jsonl", "csv", "gzip", "char-across-reads"])
def test_file_not_utf8_names_the_byte_offset_of_the_first_bad_byte(tmp_path, name, data, compress):
    assert ACROSS_READS.index("\u00e9".encode()) == (1 << 20) - 1
    offset = data.index(b"\xe9")
    line = data[:offset].count(b"\n") + 1
    data_dir = dir_with_train(tmp_path / "data", name, compress(data) if compress else data)
    where = " of the decompressed data" if compress else ""
    assert_one_line_error(cfg_for(tmp_path, data_dir), f"{data_dir / name}: not valid UTF-8: byte 0xe9 at byte "
                          f"offset {offset}{where} (line {line}); re-save the file as UTF-8")


@pytest.mark.parametrize("ext", [".jsonl", ".csv"])
def test_byte_order_mark_and_crlf_line_ends_are_read_cleanly(tmp_path, ext):
    data = make_dir(tmp_path / "data", ext)
    for path in data.iterdir():
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
    extra = []
    if ext == ".csv":  # a quoted text with a line break of its own
        with open(data / "train.csv", "ab") as f:
            f.write(b'"two\r\nlines",neg\r\n')
        extra = [("two\nlines", "neg")]
    raw, _ = cfg_for(tmp_path, data).source.read()
    # The BOM did not stick to the first column's name, nor CR to any text or label.
    assert list(zip(raw["train"].texts, raw["train"].labels)) == [r for r in TRAIN if r[0].strip()] + extra
    assert not any("\r" in str(v) for r in raw.values() for v in r.texts + r.labels)


def zipped(data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("train.jsonl", data)
    return buf.getvalue()


@pytest.mark.parametrize("name,data,fix", [
    ("train.jsonl", gzip.compress(jsonl_bytes(TRAIN)), "the data is gzip-compressed but the name says uncompressed; "
                                                       "rename it to train.jsonl.gz"),
    ("train.csv", bz2.compress(b"text,label\nthe cat,pos\n"), "the data is bz2-compressed but the name says "
                                                              "uncompressed; rename it to train.csv.bz2"),
    ("train.jsonl", lzma.compress(jsonl_bytes(TRAIN)), "the data is xz-compressed but the name says uncompressed; "
                                                       "rename it to train.jsonl.xz"),
    ("train.jsonl", b"\x28\xb5\x2f\xfd" + bytes(12), "the data is zstd-compressed but the name says uncompressed; "
                                                     "decompress it: zstd -dc train.jsonl > train.jsonl.tmp && "
                                                     "mv train.jsonl.tmp train.jsonl"),
    ("train.jsonl", zipped(jsonl_bytes(TRAIN)), "the file is a zip archive; unzip it and keep its files in"),
    ("train.parquet", gzip.compress(b"PAR1"), "the data is gzip-compressed but the name says uncompressed; "
                                              "decompress it: gzip -dc train.parquet > train.parquet.tmp"),
    ("train.jsonl.gz", jsonl_bytes(TRAIN), "the name says gzip-compressed but the data is not compressed; "
                                           "rename it to train.jsonl"),
    ("train.jsonl.gz", bz2.compress(jsonl_bytes(TRAIN)), "the data is bz2-compressed but the name says gzip; "
                                                         "rename it to train.jsonl.bz2"),
    ("train.jsonl.gz", gzip.compress(jsonl_bytes(TRAIN) * 50)[:-20], "cannot decompress the gzip data (Compressed "
                                                                      "file ended before the end-of-stream marker"),
    ("train.jsonl", "\ufeff".encode("utf-16-le") + jsonl_bytes(TRAIN).decode().encode("utf-16-le"),
     "the file is UTF-16 text; re-save it as UTF-8 (iconv -f UTF-16 -t UTF-8)"),
], ids=["gzip", "bz2", "xz", "zstd", "zip", "parquet-gzip", "gz-name-plain-data", "gz-name-bz2-data", "truncated-gz",
        "utf16"])
def test_compressed_or_utf16_data_the_name_does_not_announce(tmp_path, name, data, fix):
    data_dir = dir_with_train(tmp_path / "data", name, data)
    assert_one_line_error(cfg_for(tmp_path, data_dir), f"{data_dir / name}: {fix}")


def test_compressed_files_load_like_plain_ones(tmp_path):
    plain = load_corpus(cfg_for(tmp_path, make_dir(tmp_path / "plain")))
    packed = tmp_path / "packed"
    make_dir(packed, splits={"test": TEST})
    (packed / "train-00000-of-00002.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(TRAIN[:2])))
    (packed / "train-00001-of-00002.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(TRAIN[2:])))
    (packed / "validation.csv.bz2").write_bytes(bz2.compress(pd.DataFrame(VALIDATION, columns=["text", "label"])
                                                             .to_csv(index=False).encode()))
    records = [{"text": t, "label": y} for t, y in TEST]
    (packed / "test.json.xz").write_bytes(lzma.compress(json.dumps(records).encode()))
    (packed / "test.jsonl").unlink()
    corpus = load_corpus(cfg_for(tmp_path, packed))
    for split in readers.SPLITS:
        assert docs(corpus.split(split)) == docs(plain.split(split))
        assert corpus.split(split).labels.tolist() == plain.split(split).labels.tolist()


@pytest.mark.parametrize("name,data,message", [
    ("train.jsonl", b"", "the file is empty (0 bytes)"),
    ("train.csv", b"", "the file is empty (0 bytes)"),
    ("train.parquet", b"", "the file is empty (0 bytes)"),
    ("train.jsonl", b"\n  \r\n\n", "the file has only blank lines; it needs a JSON record per line"),
    ("train.csv", b"\xef\xbb\xbf\n\n", "the file has only blank lines; it needs a header line and rows"),
    ("train.jsonl.gz", gzip.compress(b""), "the file has only blank lines"),
    ("train.csv", b"text,label\r\n", "the file has a header line but no rows"),
], ids=["jsonl", "csv", "parquet", "jsonl-blank", "csv-blank", "gzip-of-nothing", "csv-header-only"])
def test_empty_blank_and_header_only_files(tmp_path, name, data, message):
    data_dir = dir_with_train(tmp_path / "data", name, data)
    assert_one_line_error(cfg_for(tmp_path, data_dir), f"{data_dir / name}: {message}")


def test_missing_label_value_is_an_error(tmp_path):
    data = make_dir(tmp_path / "data", ".csv")
    (data / "train.csv").write_text("text,label\nthe cat,pos\nthe dog,\n")
    assert_one_line_error(cfg_for(tmp_path, data), "train.csv", "'label'", "missing values")


def test_json_array_file_and_digit_string_labels(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split, rows in SPLITS.items():
        records = [{"text": t, "label": str(i % 2)} for i, (t, _) in enumerate(rows)]
        (data / f"{split}.json").write_text(json.dumps(records, indent=1))
    corpus = load_corpus(cfg_for(tmp_path, data))
    assert corpus.train.labels.tolist() == [0, 1, 0] and corpus.label_names == ("0", "1")


def test_label_unseen_in_training_is_an_error(tmp_path):
    data = make_dir(tmp_path / "data", splits={**SPLITS, "test": [("the cat", "neutral")]})
    assert_one_line_error(cfg_for(tmp_path, data), "test.jsonl", "'neutral'", "never occurs in the training split")


# ---------------------------------------------------------------------------------------------------------
# Hugging Face hub path, offline
# ---------------------------------------------------------------------------------------------------------


def fake_hub_dataset(with_validation: bool):
    import datasets

    features = datasets.Features({"abstract": datasets.Value("string"),
                                  "category": datasets.ClassLabel(names=["cs", "math", "physics"])})
    n = 40
    data = {"abstract": [f"w{i % 5} w{i % 7} w{i % 3}" for i in range(n)], "category": [i % 3 for i in range(n)]}
    parts = {"train": datasets.Dataset.from_dict(data, features=features),
             "test": datasets.Dataset.from_dict({k: v[:6] for k, v in data.items()}, features=features)}
    if with_validation:
        parts["valid"] = datasets.Dataset.from_dict({k: v[:4] for k, v in data.items()}, features=features)
    return datasets.DatasetDict(parts)


def test_hub_path_maps_columns_classlabels_and_splits(tmp_path, monkeypatch):
    import datasets

    calls = []

    def load_dataset(name, config):
        calls.append((name, config, datasets.config.HF_HUB_OFFLINE))
        return fake_hub_dataset(with_validation=name.endswith("val"))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # as on a machine configured to go online
    monkeypatch.setattr(readers, "hub_reachable", lambda timeout=0: False)  # a machine without internet
    cfg = DataConfig(dataset="someone/papers-val", dataset_config="small", text_column="abstract",
                     label_column="category", cache_dir=str(tmp_path / "cache"))
    corpus = load_corpus(cfg)
    # Unreachable hub -> the load ran in offline mode (a warm HF cache still works); the flag is restored.
    assert calls == [("someone/papers-val", "small", True)]
    assert datasets.config.HF_HUB_OFFLINE is False
    assert corpus.name == "someone/papers-val"
    assert corpus.label_names == ("cs", "math", "physics") and corpus.num_classes == 3
    assert (len(corpus.train), len(corpus.validation), len(corpus.test)) == (40, 4, 6)  # "valid" is validation
    assert corpus.train.labels[:4].tolist() == [0, 1, 2, 0]
    # No validation split on the hub: a fixed 10% of train is held out, the same every time.
    no_val = DataConfig(dataset="someone/papers", dataset_config=None, text_column="abstract",
                        label_column="category", cache_dir=str(tmp_path / "cache2"))
    held = load_corpus(no_val)
    assert (len(held.train), len(held.validation)) == (36, 4)
    again = load_corpus(DataConfig(**{**no_val.__dict__, "cache_dir": str(tmp_path / "cache3")}))
    np.testing.assert_array_equal(held.validation.ids, again.validation.ids)


def test_hub_missing_column_is_one_line(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda name, config: fake_hub_dataset(True))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_one_line_error(DataConfig(dataset="x/y", cache_dir=str(tmp_path)), "'x/y'", "no column 'text'",
                          "abstract")


def test_offline_unknown_dataset_names_the_three_ways(tmp_path, monkeypatch):
    """The real datasets.load_dataset in offline mode with an empty cache: fails at once, one clear line."""
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    cfg = DataConfig(dataset="nobody-here/no-such-dataset", cache_dir=str(tmp_path / "cache"))
    assert_one_line_error(cfg, "nobody-here/no-such-dataset", "offline", "--data-dir", "warm Hugging Face cache",
                          "--preset demo")


def test_real_load_dataset_on_a_local_dataset_directory(tmp_path, monkeypatch):
    """The hub code path end to end through datasets.load_dataset, on a script-free local dataset directory."""
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    local = make_dir(tmp_path / "hubdir", ".parquet")
    corpus = load_corpus(DataConfig(dataset=str(local), dataset_config=None, cache_dir=str(tmp_path / "c")))
    direct = load_corpus(cfg_for(tmp_path, local))
    for split in readers.SPLITS:
        assert docs(corpus.split(split)) == docs(direct.split(split))
    assert corpus.label_names == ("neg", "pos")


def test_hub_dataset_with_text_that_is_not_utf8_is_one_line(tmp_path, monkeypatch):
    """The datasets JSON builder does not check UTF-8: a bad string fails only when read, and is named then."""
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    local = dir_with_train(tmp_path / "hubdir", "train.jsonl", LATIN1)
    assert_one_line_error(DataConfig(dataset=str(local), dataset_config=None, cache_dir=str(tmp_path / "c")),
                          f"dataset {str(local)!r} split 'train': record 3 has a 'text' that is not valid UTF-8 "
                          f"(...b'caf\\xe9 au lait'...)")


# ---------------------------------------------------------------------------------------------------------
# Batching and length buckets
# ---------------------------------------------------------------------------------------------------------


def varied_split(n: int = 700, max_len: int = 256, seed: int = 0) -> EncodedSplit:
    rng = np.random.default_rng(seed)
    raw = np.rint(np.exp(rng.uniform(np.log(3), np.log(2 * max_len), n))).astype(np.int64)
    lengths = np.minimum(raw, max_len)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = rng.integers(1, 500, size=int(offsets[-1])).astype(np.int32)
    return EncodedSplit(ids, offsets, rng.integers(0, 3, n), raw)


def test_iter_batches_rows_are_docs_then_padding():
    split = varied_split()
    seen = []
    for batch in batching.iter_batches(split, 32, shuffle=True, seed=3, epoch=1):
        assert batch.tokens.dtype == torch.int64 and batch.labels.dtype == torch.int64
        lengths = split.lengths[batch.index.numpy()]
        assert batch.tokens.shape == (len(batch.index), lengths.max())  # T = longest doc of the batch
        for row, i, n in zip(batch.tokens.numpy(), batch.index.numpy(), lengths):
            np.testing.assert_array_equal(row[:n], split.doc(i))
            assert (row[n:] == PAD_ID).all()
        np.testing.assert_array_equal(batch.labels.numpy(), split.labels[batch.index.numpy()])
        seen += batch.index.tolist()
    assert sorted(seen) == list(range(len(split)))  # every doc exactly once


@pytest.mark.parametrize("multiple,max_width", [(64, 256), (64, 200), (7, 256), (1, None)])
def test_iter_batches_rounds_widths_up_to_the_pad_multiple_never_past_max_width(multiple, max_width):
    """Every width is the batch's longest document rounded up to the multiple, or max_width where that is less
    (with max_width 200, no multiple of 64, the widest batches stop at 200); the documents and their padding as
    before."""
    split = varied_split(max_len=200)
    widths = set()
    for shuffle in (True, False):
        for batch in batching.iter_batches(split, 32, shuffle=shuffle, seed=3, pad_multiple=multiple,
                                           max_width=max_width):
            longest = int(split.lengths[batch.index.numpy()].max())
            width = batch.tokens.shape[1]
            rounded = -(-longest // multiple) * multiple
            assert width == (rounded if max_width is None else min(rounded, max_width)), (longest, width)
            assert width % multiple == 0 or width == max_width
            for row, i, n in zip(batch.tokens.numpy(), batch.index.numpy(), split.lengths[batch.index.numpy()]):
                np.testing.assert_array_equal(row[:n], split.doc(i))
                assert (row[n:] == PAD_ID).all()
            widths.add(width)
    if multiple == 64:
        assert widths <= {64, 128, 192, 256, max_width}  # few shapes
    widest = -(-200 // multiple) * multiple  # the longest documents (200 tokens): never cut, never past max_width
    assert max(widths) == (widest if max_width is None else min(widest, max_width))


def test_iter_batches_order_is_deterministic_per_seed_and_epoch():
    split = varied_split()

    def order(**kw):
        return np.concatenate([b.index.numpy() for b in batching.iter_batches(split, 16, **kw)])

    np.testing.assert_array_equal(order(shuffle=True, seed=1, epoch=2), order(shuffle=True, seed=1, epoch=2))
    assert not np.array_equal(order(shuffle=True, seed=1, epoch=2), order(shuffle=True, seed=1, epoch=3))
    assert not np.array_equal(order(shuffle=True, seed=1, epoch=2), order(shuffle=True, seed=2, epoch=2))
    evaluation = order(shuffle=False)
    np.testing.assert_array_equal(evaluation, order(shuffle=False, seed=9, epoch=9))
    assert sorted(evaluation.tolist()) == list(range(len(split)))


def test_length_bucketing_pads_far_less_than_max_len():
    split, max_len = varied_split(max_len=256), 256
    real = int(split.lengths.sum())
    for shuffle in (True, False):
        cells = sum(b.tokens.numel() for b in batching.iter_batches(split, 32, shuffle=shuffle, seed=0))
        padding = 1 - real / cells
        padding_to_max_len = 1 - real / (len(split) * max_len)
        assert padding_to_max_len > 0.5
        assert padding < 0.1, (shuffle, padding)  # sorted within chunks of 50 batches
    assert list(batching.iter_batches(split, 10_000, shuffle=False))[0].tokens.shape == (len(split), max_len)


def test_empty_split_yields_no_batches():
    empty = EncodedSplit(np.zeros(0, np.int32), np.zeros(1, np.int64), np.zeros(0, np.int64),
                         np.zeros(0, np.int64))
    assert list(batching.iter_batches(empty, 8, shuffle=True)) == []


def test_length_buckets_use_raw_lengths_and_default_edges():
    edges = DataConfig().length_edges
    assert length_bucket_labels(edges) == ["le512", "le1024", "le2048", "le4096", "gt4096"]
    raw = np.array([1, 512, 513, 1024, 1025, 2048, 4096, 4097, 100_000])
    assert batching.length_bucket_of(raw, edges).tolist() == [0, 0, 1, 1, 2, 2, 3, 4, 4]


def test_length_buckets_of_a_loaded_corpus_count_tokens_before_truncation(tmp_path):
    long_doc = " ".join(["the"] * 600)
    rows = {"train": [(long_doc, 0), ("the the", 1)], "validation": [("the", 0)], "test": [(long_doc, 1), ("the", 0)]}
    corpus = load_corpus(cfg_for(tmp_path, make_dir(tmp_path / "data", splits=rows), max_len=16))
    assert corpus.test.lengths.tolist() == [16, 1]
    assert corpus.test.raw_lengths.tolist() == [600, 1]
    assert batching.length_bucket_of(corpus.test.raw_lengths, (512, 1024)).tolist() == [1, 0]
    assert corpus.meta["truncated"]["test"] == 1
