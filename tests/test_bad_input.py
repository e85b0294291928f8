"""Bad input, many times: property tests (Hypothesis) over the search-space loader and every corpus reader.

Whatever file is generated, it loads or ends in the project's own one-line error (a ConfigError: `error: <line>`
and exit 2 on the command line), never another exception, a hang (each example has a deadline) or a file left
behind. Each test's case count is its `max_examples`, chosen so that the test takes a few seconds on 2 cores; an
input that found a defect is kept as an `@example` (the defect named beside it).
"""
from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import string

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pefusion.errors import ConfigError  # noqa: E402

# Every property test: a deadline per example (a hang fails it; 10 s, far above any example on a loaded 2-core
# machine), no example database written into the repository.
FAST = dict(deadline=10_000, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])


def _one_line_error(exc: ConfigError) -> None:
    message = str(exc)
    assert message and "\n" not in message and "Traceback" not in message, message


# --- the search-space loader ----------------------------------------------------------------------------------

# YAML scalars of every kind PyYAML makes (numbers past float's range, dates, nulls, booleans, odd strings)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10 ** 300, max_value=10 ** 400),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.dates(),
                    st.sampled_from(["sinusoidal", "add", "adamw", "1e-4", "nan", ".inf", "-1", "0", "true"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=8)
KINDS = ["grid", "choice", "stack", "uniform", "loguniform", "randint", "bogus"]
dimensions = st.one_of(values, st.builds(lambda k, v: {k: v}, st.sampled_from(KINDS), values),
                       st.builds(lambda k, a, b: {k: [a, b]}, st.sampled_from(KINDS), scalars, scalars))
FUSION_KEYS = ["pe_type", "fusion", "lr", "batch_size", "seed", "dropout", "d_model", "norm_first", "max_epochs",
               "warmup"]
spaces = st.dictionaries(st.one_of(st.sampled_from(FUSION_KEYS), st.text(max_size=8)), dimensions, max_size=4)


def _space_text(draw_value) -> str:
    return yaml.safe_dump(draw_value, allow_unicode=True)


files = st.one_of(spaces.map(_space_text),  # well-formed YAML of any shape
                  st.text(alphabet=string.printable + "{}[]:-&*!|>'\"%@`\t", max_size=80),  # any text
                  st.binary(max_size=60))  # any bytes (not UTF-8 among them)


@settings(max_examples=500, **FAST)
@given(content=files)
@example(content=b"\xff\xfe").via("not UTF-8: read_text raised UnicodeDecodeError, a traceback")
@example(content=f"lr: {10 ** 400}\n").via("an int past float's range: math.isfinite raised OverflowError")
@example(content=f"lr: {{uniform: [1, {10 ** 400}]}}\n").via("the same in a range")
def test_any_search_space_file_loads_or_ends_in_one_line(tmp_path_factory, content):
    """500 files: YAML of any shape over the study's keys and dimension kinds, any text, any bytes."""
    from pefusion.fusion.config import RULES
    from pefusion.sweep.space import SearchSpace, load_search_space

    folder = tmp_path_factory.mktemp("space")
    path = folder / "space.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    try:
        space = load_search_space(path, RULES)
    except ConfigError as exc:
        _one_line_error(exc)
        assert str(exc).startswith(str(path)), exc
    else:
        assert isinstance(space, SearchSpace)
        space.points()  # enumerable, as the sweep's check does
    assert sorted(p.name for p in folder.iterdir()) == ["space.yaml"]  # nothing written beside it


# --- the corpus readers -----------------------------------------------------------------------------------------

texts = st.one_of(st.text(max_size=20), st.none(), st.integers(), st.floats(), st.just(""), st.just("  "))
labels = st.one_of(st.integers(min_value=-3, max_value=5), st.integers(), st.sampled_from(["pos", "neg", "3", " "]),
                   st.floats(), st.none(), st.booleans(), st.lists(st.integers(), max_size=2))
records = st.lists(st.one_of(st.fixed_dictionaries({"text": texts, "label": labels}),
                             st.dictionaries(st.sampled_from(["text", "label", "x"]), texts, max_size=3),
                             texts), min_size=0, max_size=8)


def _jsonl(rows: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _json_array(rows: list) -> bytes:
    return json.dumps(rows).encode()


def _csv(rows: list) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    columns = sorted({k for r in rows if isinstance(r, dict) for k in r}) or ["text", "label"]
    writer.writerow(columns)
    for r in rows:
        writer.writerow([r.get(c, "") if isinstance(r, dict) else r for c in columns])
    return out.getvalue().encode()


def _parquet(rows: list) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    dicts = [r for r in rows if isinstance(r, dict)]
    columns = sorted({k for r in dicts for k in r}) or ["text", "label"]
    table = {}
    for c in columns:
        column = [r.get(c) for r in dicts]
        try:
            table[c] = pa.array(column)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # mixed types: as text
            table[c] = pa.array([None if v is None else str(v) for v in column])
    out = io.BytesIO()
    pq.write_table(pa.table(table) if table else pa.table({"text": pa.array([], pa.string())}), out)
    return out.getvalue()


WRITERS = {".jsonl": _jsonl, ".json": _json_array, ".csv": _csv, ".parquet": _parquet}
COMPRESS = {"": lambda b: b, ".gz": gzip.compress, ".bz2": bz2.compress}


@st.composite
def data_files(draw):
    """(name suffix, bytes): a well-formed file of generated records in a format, compressed or not, sometimes cut
    short or with bytes flipped; or any bytes under any name."""
    ext = draw(st.sampled_from(sorted(WRITERS)))
    compression = "" if ext == ".parquet" else draw(st.sampled_from(sorted(COMPRESS)))
    if draw(st.integers(0, 9)) == 0:
        return ext + compression, draw(st.binary(max_size=64))
    data = COMPRESS[compression](WRITERS[ext](draw(records)))
    damage = draw(st.sampled_from(["none", "none", "cut", "flip"]))
    if damage == "cut" and data:
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif damage == "flip" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
    return ext + compression, data


@settings(max_examples=250, **FAST)
@given(file=data_files(), held_out=st.booleans(), seed=st.integers(0, 2 ** 32 - 1))
@example(file=(".jsonl", _jsonl([{"text": "a", "label": 10 ** 20}])), held_out=False, seed=0
         ).via("a label past int64: numpy raised OverflowError, a traceback")
@example(file=(".jsonl", _jsonl([{"text": "a", "label": 10 ** 9}])), held_out=False, seed=0
         ).via("a huge integer label: a class list of a billion ids (a hang, then MemoryError)")
def test_any_data_folder_reads_or_ends_in_one_line(tmp_path_factory, file, held_out, seed):
    """250 folders: train (and validation, test) files of every format the readers take, gzip/bz2 or not, well
    formed with generated records, cut short, a byte flipped, or any bytes; without a validation file, the
    per-seed split (`split_seed`) of the training file. The documents read (and their class ids, as the corpus
    maps them) or a one-line DataError."""
    from pefusion.data.readers import map_labels
    from pefusion.data.sources import LocalFolder

    suffix, data = file
    folder = tmp_path_factory.mktemp("data")
    for split in ("train", "test") if held_out else ("train", "validation", "test"):
        (folder / f"{split}{suffix}").write_bytes(data)
    before = sorted(folder.iterdir())
    source = LocalFolder(str(folder), "text", "label", split_seed=seed if held_out else None)
    try:
        raw, class_names = source.read()
        ids, names = map_labels(raw, "label", class_names)
    except ConfigError as exc:
        _one_line_error(exc)
    else:
        for split, array in ids.items():
            assert len(array) == len(raw[split].texts) == len(raw[split].labels)
            assert all(isinstance(t, str) and t.strip() for t in raw[split].texts)
            assert array.size == 0 or 0 <= array.min() <= array.max() < len(names)
    assert sorted(folder.iterdir()) == before  # nothing written


@settings(max_examples=200, **FAST)
@given(n=st.integers(0, 400), seed=st.integers(0, 2 ** 32 - 1))
def test_the_per_seed_held_out_split_is_a_partition_fixed_by_its_seed(n, seed):
    """200 (size, seed) pairs: the per-seed split (AG News's, a folder without a validation file) holds out
    int(0.1 n) documents; train and validation partition the file, train in the file's order; the same seed
    draws the same split, and the draw is numpy's permutation of that seed (an independent computation)."""
    import numpy as np

    from pefusion.data.readers import HUB_VALIDATION_FRACTION, RawSplit, hold_out

    docs = RawSplit([f"d{i}" for i in range(n)], list(range(n)), "train.jsonl")
    train, val = hold_out(docs, seed)
    assert len(val.texts) == int(HUB_VALIDATION_FRACTION * n)
    assert sorted(train.labels + val.labels) == list(range(n))
    assert train.labels == sorted(train.labels)
    assert val.labels == list(np.random.default_rng(seed).permutation(n)[:len(val.labels)])
    assert hold_out(docs, seed)[1].labels == val.labels
    assert all(docs.texts[y] == t for t, y in zip(val.texts, val.labels))


# --- a report over a store holding a half-finished or corrupted run -------------------------------------------


def test_a_report_over_a_half_finished_and_a_corrupted_run_names_them_and_goes_on(tmp_path, capsys):
    """The analysis test store's sweep, plus a trial run left RUNNING by a driver killed mid-epoch (epochs logged,
    no final record) and one FINISHED 'ok' whose record is corrupt (its seed param unreadable, no test metrics):
    the report is written, and says which runs it left out and why."""
    from mlflow.tracking import MlflowClient

    from conftest import load_script
    from pefusion import record as R
    from test_analysis import ARXIV, _build_store, _metrics, _params

    store = _build_store(tmp_path / "store")
    client = MlflowClient(store["uri"])
    exp = client.get_experiment_by_name("pe-fusion").experiment_id
    half = client.create_run(exp, tags={R.TAG_PARENT: store["parent"], R.TAG_ROLE: "trial", R.TAG_TRIAL_ID: "half",
                                        R.TAG_STATUS: R.STATUS_RUNNING}).info.run_id
    client.log_batch(half, metrics=_metrics({R.VAL_ACC: 0.5}, step=1),
                     params=_params({R.DATASET: ARXIV, R.PE_TYPE: "learned", R.FUSION: "add", R.SEED: 7}))
    bad = client.create_run(exp, tags={R.TAG_PARENT: store["parent"], R.TAG_ROLE: "trial", R.TAG_TRIAL_ID: "bad",
                                       R.TAG_STATUS: R.STATUS_OK}).info.run_id
    client.log_batch(bad, params=_params({R.DATASET: ARXIV, R.PE_TYPE: "learned", R.FUSION: "add",
                                          R.SEED: "\x00garbled"}))
    client.set_terminated(bad, "FINISHED")

    code = load_script("scripts/report.py").main(["--tracking-uri", store["uri"], "--out", str(tmp_path / "out"),
                                                  "--parent-run", store["parent"], "--no-log"])
    out = capsys.readouterr()
    assert code == 0, out.err
    pages = list((tmp_path / "out").glob("report_*.html"))
    assert len(pages) == 1
    assert f"1 trial run still running (or left so by a driver that died) is left out: {half}" in out.err, out.err
    page = pages[0].read_text()
    assert bad[:8] in page and "its final record is missing" in page
