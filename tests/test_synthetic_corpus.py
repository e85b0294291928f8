"""The synthetic corpora: position decides the class, word counts do not."""
from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

from conftest import write_synthetic_corpus
from pefusion.data import synthetic as sc
from pefusion.data.config import DataConfig
from pefusion.data.corpus import load_corpus
from pefusion.data.readers import SPLITS


@pytest.fixture(scope="module", params=sc.TASKS)
def any_corpus(request):
    return sc.generate_synthetic_corpus(2000, 500, 500, seed=0, task=request.param)


@pytest.fixture(scope="module")
def corpus():
    return sc.generate_synthetic_corpus(2000, 500, 500, seed=0)


def test_schema_sizes_and_balanced_labels(any_corpus):
    corpus = any_corpus
    assert {k: len(v) for k, v in corpus.items()} == {"train": 2000, "validation": 500, "test": 500}
    for docs in corpus.values():
        assert all(set(d) == {"text", "label"} and isinstance(d["text"], str) for d in docs)
        counts = collections.Counter(d["label"] for d in docs)
        assert sorted(counts) == list(range(sc.NUM_CLASSES))
        assert max(counts.values()) - min(counts.values()) <= 1


def test_lengths_span_32_to_2048_in_every_split(any_corpus):
    corpus = any_corpus
    for docs in corpus.values():
        lengths = [len(d["text"].split()) for d in docs]
        assert min(lengths) <= 32 and max(lengths) >= 2048
        # lengths are independent of the class: every class covers short and long documents
        for c in range(sc.NUM_CLASSES):
            mine = [n for n, d in zip(lengths, docs) if d["label"] == c]
            assert min(mine) < 100 and max(mine) > 1000


@pytest.mark.parametrize("task", sc.TASKS)
def test_deterministic_for_a_seed_and_different_across_seeds(task):
    a = sc.generate_synthetic_corpus(50, 20, 20, seed=3, task=task)
    assert a == sc.generate_synthetic_corpus(50, 20, 20, seed=3, task=task)
    assert a["train"] != sc.generate_synthetic_corpus(50, 20, 20, seed=4, task=task)["train"]
    # each split has its own random stream: resizing one split leaves the others unchanged
    assert sc.generate_synthetic_corpus(50, 30, 20, seed=3, task=task)["train"] == a["train"]
    # tasks differ in their signal only: the same seed gives the same lengths and labels
    order = sc.generate_synthetic_corpus(50, 20, 20, seed=3)
    assert [(len(d["text"].split()), d["label"]) for d in a["train"]] == \
        [(len(d["text"].split()), d["label"]) for d in order["train"]]


def test_every_document_has_the_same_markers_and_order_decides_the_class(corpus):
    markers = sc.MARKER_WORDS[:sc.NUM_CLASSES]
    for d in corpus["train"][:300]:
        words = d["text"].split()
        counts = collections.Counter(w for w in words if w in markers)
        assert len(set(counts.values())) == 1 and set(counts) == set(markers)  # same multiset for every class
        first = next(w for w in words if w in markers)
        assert markers.index(first) == d["label"]  # a rule that reads order is always right
        assert max(i for i, w in enumerate(words) if w in markers) < sc.SIGNAL_SPAN


def _marker_positions(words: list[str], markers: tuple[str, ...]) -> list[tuple[int, int]]:
    """(position, marker index) of every marker word, in document order."""
    return [(i, markers.index(w)) for i, w in enumerate(words) if w in markers]


def test_spread_class_is_the_plurality_of_window_leaders_and_every_window_votes():
    markers = sc.MARKER_WORDS[:sc.NUM_CLASSES]
    docs = sc.generate_synthetic_corpus(300, 1, 1, seed=5, task="spread")["train"]
    agree, seen = 0, 0
    for d in docs:
        words = d["text"].split()
        found = _marker_positions(words, markers)
        windows = len(words) // sc.SPREAD_EVERY
        assert len(found) == windows * sc.NUM_CLASSES * sc.SPREAD_REPEAT  # counts depend on the length only
        counts = collections.Counter(m for _, m in found)
        assert len(set(counts.values())) == 1 and len(counts) == sc.NUM_CLASSES
        leaders = [m for i, m in found if i % sc.SPREAD_EVERY == 0]
        assert len(leaders) == windows
        votes = collections.Counter(leaders).most_common()
        assert votes[0][0] == d["label"] and (len(votes) == 1 or votes[1][1] < votes[0][1])  # strict plurality
        agree += sum(v == d["label"] for v in leaders)
        seen += windows
    # a vote names the class with probability SPREAD_AGREE (a little more: the plurality is enforced), so the
    # first window alone decides long documents only about half of the time
    assert sc.SPREAD_AGREE <= agree / seen < sc.SPREAD_AGREE + 0.1


def test_relative_class_is_the_order_and_gap_of_every_marker_pair():
    docs = sc.generate_synthetic_corpus(400, 1, 1, seed=5, task="relative")["train"]
    offsets = []
    for d in docs:
        words = d["text"].split()
        found = _marker_positions(words, sc.MARKER_WORDS[:sc.NUM_CLASSES])
        assert len(found) == 2 * (len(words) // sc.RELATIVE_EVERY)  # one pair per window: counts follow length
        for (i, first), (j, second) in zip(found[::2], found[1::2]):
            assert {first, second} == {0, 1} and i // sc.RELATIVE_EVERY == j // sc.RELATIVE_EVERY
            far = j - i > sc.RELATIVE_MAX_GAP // 2
            assert d["label"] == 2 * far + (first == 1) and 1 <= j - i <= sc.RELATIVE_MAX_GAP
            offsets.append(i % sc.RELATIVE_EVERY)
    # the pair sits anywhere in its window, so an absolute position says nothing
    assert set(offsets) == set(range(sc.RELATIVE_EVERY - 1))


def test_bag_of_words_classifier_stays_at_chance(any_corpus):
    corpus = any_corpus
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


def test_unknown_task_is_refused_in_one_line_naming_the_tasks():
    from pefusion.errors import ConfigError

    with pytest.raises(ConfigError, match="synthetic_task='orderr' is not allowed; choose one of: order, spread"):
        DataConfig(synthetic=True, synthetic_task="orderr")
    with pytest.raises(ValueError, match="task='x' is not a synthetic task"):
        sc.generate_synthetic_corpus(10, 10, 10, task="x")


def test_num_classes_is_checked():
    with pytest.raises(ValueError, match="num_classes=1"):
        sc.generate_synthetic_corpus(10, 10, 10, num_classes=1)
    docs = sc.generate_synthetic_corpus(30, 6, 6, num_classes=2)["train"]
    assert {d["label"] for d in docs} == {0, 1}


@pytest.mark.parametrize("task,pe_type,fusion,n_train,epochs,low,high", [
    ("spread", "learned", "concat", 900, 8, 0.45, 1.0), ("spread", "none", "add", 900, 8, 0.15, 0.35),
    ("relative", "sinusoidal", "concat", 2000, 15, 0.60, 1.0), ("relative", "none", "add", 2000, 10, 0.15, 0.35),
])
def test_new_tasks_need_position_information(cache_dir, task, pe_type, fusion, n_train, epochs, low, high):
    """With the demo's model, a position-aware cell learns each task well above chance (25 %; relative needs
    more documents and epochs than the demo gives it); without positions the model stays within 10 points of
    chance: the markers' counts say nothing."""
    from pefusion import record as R
    from pefusion.fusion.config import PRESETS
    from pefusion.fusion.training import train_and_evaluate

    demo = PRESETS["demo"]
    data = dataclasses.replace(demo.data, synthetic_task=task, synthetic_train=n_train, cache_dir=str(cache_dir))
    model = dataclasses.replace(demo.model, pe_type=pe_type, fusion=fusion)
    train = dataclasses.replace(demo.train, max_epochs=epochs, timing_repeats=1, timing_warmup=0)
    record = train_and_evaluate(model, train, load_corpus(data), length_edges=data.length_edges)
    assert low <= record[R.TEST_ACC] <= high, record[R.TEST_ACC]


def _resolve(argv: list[str]):
    import argparse

    from pefusion.cli.flags import add_data_flags, add_preset_flag
    from pefusion.cli.fusion import resolve_preset
    from pefusion.fusion.config import PRESETS

    parser = argparse.ArgumentParser()
    add_preset_flag(parser, "arxiv", PRESETS)
    add_data_flags(parser)
    parser.add_argument("--smoke", action="store_true")
    return resolve_preset(parser.parse_args(argv)).data


def test_synthetic_task_flag_and_preset_key(tmp_path):
    from pefusion.errors import ConfigError

    assert _resolve(["--synthetic"]).synthetic_task == "order"  # the arxiv preset keeps the order task
    data = _resolve(["--synthetic-task", "relative"])
    assert data.synthetic and data.synthetic_task == "relative" and data.source_name == "synthetic-relative"
    assert _resolve(["--preset", "demo"]).synthetic_task == "spread"  # the demo runs the discriminating task
    assert _resolve(["--preset", "demo", "--synthetic-task", "relative"]).source_name == "synthetic-relative"
    assert _resolve(["--preset", "demo", "--synthetic-task", "order"]).source_name == "synthetic"
    with pytest.raises(ConfigError,
                       match="^synthetic_task='bogus' is not allowed; choose one of: order, spread, relative$"):
        _resolve(["--synthetic-task", "bogus"])
    with pytest.raises(ConfigError, match="drop --data-dir/--dataset"):
        _resolve(["--synthetic-task", "spread", "--data-dir", str(tmp_path)])
