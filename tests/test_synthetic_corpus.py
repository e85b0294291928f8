"""The synthetic corpus: order decides the class, word counts do not."""
from __future__ import annotations

import collections

import numpy as np
import pytest

from conftest import write_synthetic_corpus
from pefusion.data import synthetic as sc
from pefusion.data.config import DataConfig
from pefusion.data.corpus import load_corpus
from pefusion.data.readers import SPLITS


@pytest.fixture(scope="module")
def corpus():
    return sc.generate_synthetic_corpus(2000, 500, 500, seed=0)


def test_schema_sizes_and_balanced_labels(corpus):
    assert {k: len(v) for k, v in corpus.items()} == {"train": 2000, "validation": 500, "test": 500}
    for docs in corpus.values():
        assert all(set(d) == {"text", "label"} and isinstance(d["text"], str) for d in docs)
        counts = collections.Counter(d["label"] for d in docs)
        assert sorted(counts) == list(range(sc.NUM_CLASSES))
        assert max(counts.values()) - min(counts.values()) <= 1


def test_lengths_span_32_to_2048_in_every_split(corpus):
    for docs in corpus.values():
        lengths = [len(d["text"].split()) for d in docs]
        assert min(lengths) <= 32 and max(lengths) >= 2048
        # lengths are independent of the class: every class covers short and long documents
        for c in range(sc.NUM_CLASSES):
            mine = [n for n, d in zip(lengths, docs) if d["label"] == c]
            assert min(mine) < 100 and max(mine) > 1000


def test_deterministic_for_a_seed_and_different_across_seeds():
    a = sc.generate_synthetic_corpus(50, 20, 20, seed=3)
    assert a == sc.generate_synthetic_corpus(50, 20, 20, seed=3)
    assert a["train"] != sc.generate_synthetic_corpus(50, 20, 20, seed=4)["train"]
    # each split has its own random stream: resizing one split leaves the others unchanged
    assert sc.generate_synthetic_corpus(50, 30, 20, seed=3)["train"] == a["train"]


def test_every_document_has_the_same_markers_and_order_decides_the_class(corpus):
    markers = sc.MARKER_WORDS[:sc.NUM_CLASSES]
    for d in corpus["train"][:300]:
        words = d["text"].split()
        counts = collections.Counter(w for w in words if w in markers)
        assert len(set(counts.values())) == 1 and set(counts) == set(markers)  # same multiset for every class
        first = next(w for w in words if w in markers)
        assert markers.index(first) == d["label"]  # a rule that reads order is always right
        assert max(i for i, w in enumerate(words) if w in markers) < sc.SIGNAL_SPAN


def test_bag_of_words_classifier_stays_at_chance(corpus):
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    vectorizer = CountVectorizer(token_pattern=r"\S+", lowercase=False)
    # log counts: the same information as counts, and lbfgs converges in a few hundred steps
    x_train = vectorizer.fit_transform(d["text"] for d in corpus["train"]).log1p()
    x_val = vectorizer.transform(d["text"] for d in corpus["validation"]).log1p()
    y_train = [d["label"] for d in corpus["train"]]
    y_val = np.array([d["label"] for d in corpus["validation"]])
    with threadpool_limits(1):  # BLAS threads on a busy 2-core machine only contend
        model = LogisticRegression(max_iter=1000).fit(x_train, y_train)
    train_acc = model.score(x_train, y_train)
    val_acc = float((model.predict(x_val) == y_val).mean())
    chance = 1 / sc.NUM_CLASSES
    assert abs(val_acc - chance) < 0.05, val_acc
    assert train_acc > 0.9  # it could fit (memorise) the training set; it just cannot generalise


def test_written_jsonl_loads_like_the_built_in_source(tmp_path):
    paths = write_synthetic_corpus(tmp_path / "syn", 40, 10, 10, seed=2)
    assert sorted(p.name for p in paths.values()) == ["test.jsonl", "train.jsonl", "validation.jsonl"]
    from_files = load_corpus(DataConfig(data_dir=str(tmp_path / "syn"), max_len=64, cache_dir=str(tmp_path / "c")))
    built_in = load_corpus(DataConfig(synthetic=True, synthetic_train=40, synthetic_val=10, synthetic_test=10,
                                      synthetic_seed=2, max_len=64, cache_dir=str(tmp_path / "c")))
    assert built_in.name == "synthetic" and built_in.num_classes == sc.NUM_CLASSES
    for split in SPLITS:
        a, b = from_files.split(split), built_in.split(split)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_array_equal(a.raw_lengths, b.raw_lengths)


def test_num_classes_is_checked():
    with pytest.raises(ValueError, match="num_classes=1"):
        sc.generate_synthetic_corpus(10, 10, 10, num_classes=1)
    docs = sc.generate_synthetic_corpus(30, 6, 6, num_classes=2)["train"]
    assert {d["label"] for d in docs} == {0, 1}
