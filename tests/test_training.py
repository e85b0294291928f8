"""The training loop: determinism, divergence, early stopping, resume, metrics; and the demo corpus's promise
(position-aware models learn it, an order-blind one cannot)."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from pefusion import record as R
from pefusion.data.batching import iter_batches
from pefusion.data.config import DataConfig
from pefusion.data.corpus import load_corpus
from pefusion.fusion.config import PRESETS
from pefusion.fusion.training import Trainer, length_bucket_accuracy, macro_f1, train_and_evaluate
from study_names import FINAL_METRICS, TIMING_METRICS


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING_METRICS}


def _cfgs(preset, **train):
    return preset.model, dataclasses.replace(preset.train, **train)


def test_same_seed_gives_bit_identical_metrics(smoke_preset, smoke_corpus):
    model, train = _cfgs(smoke_preset, max_epochs=2)
    edges = smoke_preset.data.length_edges
    a = train_and_evaluate(model, train, smoke_corpus, length_edges=edges)
    b = train_and_evaluate(model, train, smoke_corpus, length_edges=edges)
    assert a[R.STATUS] == R.STATUS_OK
    assert _without_timing(a) == _without_timing(b)
    other = train_and_evaluate(model, dataclasses.replace(train, seed=1), smoke_corpus, length_edges=edges)
    assert _without_timing(other) != _without_timing(a)


def test_resumed_trainer_continues_bit_identically(smoke_preset, smoke_corpus):
    model, train = _cfgs(smoke_preset, max_epochs=3, early_stopping=False)
    edges = smoke_preset.data.length_edges
    straight = train_and_evaluate(model, train, smoke_corpus, length_edges=edges)

    first = Trainer(model, train, smoke_corpus)
    first.train_epoch()
    state = first.state_dict()
    torch.manual_seed(12345)  # whatever happened in between, the checkpoint restores the RNG
    resumed = Trainer(model, train, smoke_corpus)
    resumed.load_state_dict(state)
    record = train_and_evaluate(model, train, smoke_corpus, length_edges=edges, trainer=resumed)
    assert _without_timing(record) == _without_timing(straight)
    assert len(resumed.history) == 3


def test_an_epochs_rates_are_its_documents_and_tokens_over_its_training_seconds(smoke_preset, smoke_corpus):
    """Counted here: the training split's documents and their non-pad tokens (every one seen once an epoch);
    timed here: each epoch, around `train_epoch`. The training seconds a rate implies fit inside the epoch's
    seconds, which fit inside this test's clock, and add up to the trial's training time."""
    model, train = _cfgs(smoke_preset, max_epochs=2, early_stopping=False)
    trainer = Trainer(model, train, smoke_corpus)
    documents = len(smoke_corpus.train)
    tokens = sum(int((b.tokens != 0).sum()) for b in iter_batches(smoke_corpus.train, 7, shuffle=False))
    implied = []
    for _ in range(2):
        start = time.monotonic()
        metrics = trainer.train_epoch()
        held = time.monotonic() - start
        implied.append(documents / metrics[R.TRAIN_SAMPLES_PER_S])
        assert 0 < implied[-1] <= metrics[R.EPOCH_S] <= held
        assert metrics[R.TRAIN_TOKENS_PER_S] * implied[-1] == pytest.approx(tokens, rel=1e-12)
        assert R.PEAK_MEM_RESERVED_MIB not in metrics  # a CPU has no device memory to report
    assert sum(implied) == pytest.approx(trainer.train_time_s, rel=1e-12)


def test_a_restored_trainer_adds_its_wall_time_to_the_checkpoints(smoke_preset, smoke_corpus):
    """The trial's clock across a restart, by this test's clock: the restored trial keeps its first start and
    adds its own seconds to the saved ones; the time between the two processes, when nothing ran, is not
    counted."""
    model, train = _cfgs(smoke_preset, max_epochs=3, early_stopping=False)
    started, start = time.time(), time.monotonic()
    first = Trainer(model, train, smoke_corpus)
    first.train_epoch()
    state = first.state_dict()
    first_s = time.monotonic() - start
    time.sleep(0.5)  # the trial is down: no process runs it
    start = time.monotonic()
    resumed = Trainer(model, train, smoke_corpus)
    resumed.load_state_dict(state)
    record = train_and_evaluate(model, train, smoke_corpus, length_edges=smoke_preset.data.length_edges,
                                trainer=resumed)
    second_s = time.monotonic() - start
    assert 0 < state[R.WALL_S] <= first_s
    assert second_s < record[R.WALL_S] <= first_s + second_s
    assert started <= record[R.STARTED_AT] == state[R.STARTED_AT] < record[R.ENDED_AT] - 0.5


def test_non_finite_loss_stops_and_reports_diverged(smoke_preset, smoke_corpus):
    model, train = _cfgs(smoke_preset, lr=1e30, max_epochs=3)
    record = train_and_evaluate(model, train, smoke_corpus, length_edges=smoke_preset.data.length_edges)
    assert record[R.STATUS] == R.STATUS_DIVERGED
    assert "non-finite" in record[R.ERROR] and record[R.EPOCHS_RUN] == 0
    assert (record[R.PE_TYPE], record[R.FUSION], record[R.SEED]) == ("sinusoidal", "add", 0)


def test_early_stopping_restores_the_best_checkpoint(smoke_preset, smoke_corpus):
    # min_delta 1: no later epoch can beat epoch 1 (accuracies lie in [0, 1]), so `patience` bad epochs follow it;
    # a learning rate this small leaves the weights (and so the restored record) as they were
    model, train = _cfgs(smoke_preset, lr=1e-12, max_epochs=20, patience=2, min_delta=1.0)
    trainer = Trainer(model, train, smoke_corpus)
    record = train_and_evaluate(model, train, smoke_corpus, length_edges=smoke_preset.data.length_edges,
                                trainer=trainer)
    assert record[R.EPOCHS_RUN] == 3 and record[R.BEST_EPOCH] == 1
    assert record[R.VAL_ACC] == record[R.BEST_VAL_ACC] == trainer.history[0][R.VAL_ACC]
    assert [h[R.EPOCH] for h in trainer.history] == [1, 2, 3]


def _accuracy_and_preds(model: torch.nn.Module, split, batch_size: int) -> tuple[float, np.ndarray]:
    """Accuracy and predictions (in the split's order) of `model`, computed here rather than by `Trainer`."""
    model.eval()
    preds = np.empty(len(split), dtype=np.int64)
    with torch.no_grad():
        for batch in iter_batches(split, batch_size, shuffle=False):
            preds[batch.index.numpy()] = model(batch.tokens).argmax(-1).numpy()
    return float(np.mean(preds == split.labels)), preds


# On the contradicting corpus (conftest: validation = test with flipped labels) with min_delta 1, the best epoch is the
# first by construction and every later epoch learns the rule, so the last epoch scores lower on validation and
# higher on test, whether early stopping ends the run (patience 6) or the epoch budget does (8 epochs).
BEST_NOT_LAST = [pytest.param(dict(early_stopping=True, patience=6, max_epochs=20), id="early-stopped"),
                 pytest.param(dict(early_stopping=False, max_epochs=8), id="epoch-budget")]


@pytest.mark.parametrize("stopping", BEST_NOT_LAST)
def test_final_record_is_the_best_epochs_weights_not_the_last(smoke_preset, contradicting_corpus, stopping):
    """The record's test/val metrics are those of the best validation epoch's weights, snapshotted here after
    every epoch and re-evaluated in a freshly built model: skipping the restore of the best state would report
    the last epoch's weights instead."""
    from sklearn.metrics import f1_score

    from pefusion.fusion.model import build_model_from_config

    corpus = contradicting_corpus
    model_cfg = dataclasses.replace(smoke_preset.model, pe_type="learned", fusion="concat")
    bs = smoke_preset.train.batch_size
    fresh = build_model_from_config(model_cfg, corpus.vocab_size, corpus.num_classes)
    # on the CPU, like the freshly built model that re-evaluates the snapshots (same arithmetic, same argmax)
    train_cfg = dataclasses.replace(smoke_preset.train, lr=1e-2, min_delta=1.0, device="cpu", **stopping)
    snapshots: list[dict[str, torch.Tensor]] = []  # weights after epoch i + 1, copied by this test

    def keep(metrics: dict, trainer: Trainer) -> None:
        snapshots.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})

    record = train_and_evaluate(model_cfg, train_cfg, corpus, length_edges=smoke_preset.data.length_edges,
                                on_epoch=keep)
    val, test = [], []
    for state in snapshots:
        fresh.load_state_dict(state)
        val.append(_accuracy_and_preds(fresh, corpus.validation, bs)[0])
        test.append(_accuracy_and_preds(fresh, corpus.test, bs))
    # the corpus's construction: the first epoch is the best, and the last one learnt more of the rule
    assert val[0] == max(val) and val[-1] < val[0] and test[-1][0] > test[0][0], (val, [t[0] for t in test])
    if train_cfg.early_stopping:  # stopped by patience, not by the epoch budget
        assert len(snapshots) == 1 + train_cfg.patience < train_cfg.max_epochs
    else:
        assert len(snapshots) == train_cfg.max_epochs

    assert record[R.STATUS] == R.STATUS_OK and record[R.EPOCHS_RUN] == len(snapshots)
    assert record[R.BEST_EPOCH] == 1
    assert record[R.BEST_VAL_ACC] == pytest.approx(val[0])
    assert record[R.VAL_ACC] == pytest.approx(val[0])  # the restored checkpoint's, not the last epoch's
    best_test_acc, best_preds = test[0]
    assert record[R.TEST_ACC] == pytest.approx(best_test_acc)
    assert record[R.TEST_MACRO_F1] == pytest.approx(f1_score(corpus.test.labels, best_preds, average="macro"))


@pytest.mark.parametrize("pe_type,fusion", [("alibi", "none"), ("rotary", "none"), ("sinusoidal", "gate_cnn")])
def test_an_epoch_on_batches_padded_to_64_equals_one_on_unpadded_batches(smoke_preset, smoke_corpus, pe_type, fusion,
                                                                         monkeypatch):
    """A GPU's pad multiple (64) changes no number of an epoch: padding is masked in attention (ALiBi's bias and
    rotary's positions included), in gate_cnn's convolution and in the pooling. The same documents in each batch
    both times (rounded widths cut batches in another order: here both take that order); without dropout, whose
    draws depend on the batch's shape; fp32 on the CPU; up to float rounding (the padded sums add more zeros)."""
    from pefusion.data import batching

    order = batching.batch_order
    monkeypatch.setattr(batching, "batch_order", lambda lengths, size, **kw: order(lengths, size, **{
        **kw, "pad_multiple": 64}))
    model = dataclasses.replace(smoke_preset.model, pe_type=pe_type, fusion=fusion, dropout=0.0)
    epochs = {}
    for multiple in (1, 64):
        # batches of 8: a third of the documents are shorter than max_len (128), so many widths without rounding
        train = dataclasses.replace(smoke_preset.train, pad_multiple=multiple, precision="fp32", device="cpu",
                                    batch_size=8)
        trainer = Trainer(model, train, smoke_corpus)
        assert trainer.placement.pad_multiple == multiple
        widths = {b.tokens.shape[1] for b in trainer.batches(smoke_corpus.train, shuffle=True)}
        assert (widths <= {64, 128}) if multiple == 64 else len(widths) > 2
        epochs[multiple] = trainer.train_epoch()
    assert _without_timing(epochs[64]) == pytest.approx(_without_timing(epochs[1]), abs=1e-5, rel=0)


def test_record_has_every_spec_field(smoke_preset, smoke_corpus):
    model, train = _cfgs(smoke_preset, max_epochs=1)
    record = train_and_evaluate(model, train, smoke_corpus, length_edges=(64, 256, 1024))
    for key in (R.DATASET, R.PE_TYPE, R.FUSION, R.SEED, *FINAL_METRICS):
        assert key in record, key
    assert record[R.LAT_MS_MEAN] > 0 and record[R.PARAMS] > 0 and 0 <= record[R.TEST_MACRO_F1] <= 1
    counts = [record[R.LENGTH_COUNT_PREFIX + lbl] for lbl in R.length_bucket_labels((64, 256, 1024))]
    assert sum(counts) == len(smoke_corpus.test)


def test_macro_f1_matches_sklearn():
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 5, 200), rng.integers(0, 4, 200)
    assert macro_f1(y, p) == pytest.approx(f1_score(y, p, average="macro"))


def test_length_bucket_accuracy_counts_by_raw_length(smoke_corpus):
    split = smoke_corpus.test
    preds = split.labels.copy()
    preds[::2] = (preds[::2] + 1) % 4  # every other prediction wrong
    out = length_bucket_accuracy(split, preds, (100, 500))
    short = split.raw_lengths <= 100
    assert out[R.LENGTH_COUNT_PREFIX + "le100"] == short.sum()
    assert out[R.length_metric("le100")] == pytest.approx(np.mean(preds[short] == split.labels[short]))


@pytest.fixture(scope="module")
def order_corpus(cache_dir):
    demo = PRESETS["demo"]
    # the order task at its default sizes (the demo preset's are calibrated for 'spread')
    data = DataConfig(synthetic=True, max_len=demo.data.max_len, length_edges=demo.data.length_edges)
    return load_corpus(dataclasses.replace(data, cache_dir=str(cache_dir)))


@pytest.mark.parametrize("pe_type,low,high", [("sinusoidal", 0.90, 1.0), ("none", 0.15, 0.35)])
def test_order_task_needs_position_information(order_corpus, pe_type, low, high):
    """On the order task (the easy control), sinusoidal+add reaches >= 90 % validation accuracy with the demo's
    model in 10 epochs; without positions it stays within 10 points of chance (4 classes: 25 %)."""
    demo = PRESETS["demo"]
    model = dataclasses.replace(demo.model, pe_type=pe_type, fusion="add")
    train = dataclasses.replace(demo.train, max_epochs=10, timing_repeats=1, timing_warmup=0)
    record = train_and_evaluate(model, train, order_corpus, length_edges=demo.data.length_edges)
    assert low <= record[R.BEST_VAL_ACC] <= high


def _ms_per_sample_direct(model: torch.nn.Module, batches: list, n: int, warmup: int = 2, repeats: int = 10) -> float:
    """An independent timing: the median over passes of one forward pass over `batches`, per sample, in ms."""
    model.eval()
    times = []
    with torch.no_grad():
        for rep in range(warmup + repeats):
            start = time.perf_counter()
            for batch in batches:
                model(batch.tokens)
            if rep >= warmup:
                times.append((time.perf_counter() - start) * 1000.0 / n)
    return float(np.median(times))


def test_latency_is_milliseconds_per_test_sample(smoke_preset, smoke_corpus):
    """lat_ms_mean against a direct timing of the same model over the same test batches, taken just before and
    just after: within a factor of 4 (what a loaded 2-core machine moves it by), whereas latency per batch (x50
    here), per pass (x100), summed over the 10 repeats (x10) or in seconds (/1000) is far outside."""
    from pefusion.data.batching import iter_batches

    model, train = _cfgs(smoke_preset, max_epochs=1, timing_repeats=10, timing_warmup=2)
    test = smoke_corpus.test
    batches = list(iter_batches(test, train.batch_size, shuffle=False))
    assert len(test) / len(batches) >= 40  # so that a per-batch latency could not pass
    trainer = Trainer(model, train, smoke_corpus)
    trainer.train_epoch()
    before = _ms_per_sample_direct(trainer.model, batches, len(test))
    record = trainer.final_record(smoke_preset.data.length_edges)
    after = _ms_per_sample_direct(trainer.model, batches, len(test))
    latency = record[R.LAT_MS_MEAN]
    assert min(before, after) / 4 < latency < max(before, after) * 4, (latency, before, after)


def test_no_batch_shape_is_new_after_the_first_epoch_when_widths_are_rounded():
    """What a trial's model sees, recorded by a forward hook: with widths rounded to a multiple (as on a GPU, where
    a kernel planned per shape is planned once per new shape), epoch 2 brings no (batch, width) shape, training or
    validation, that epoch 1 did not. 401 documents of 1..128 tokens in batches of 4: three of the unrounded
    order's sort chunks, whose batches' widths change from epoch to epoch."""
    from pefusion.data.encoded import EncodedCorpus, EncodedSplit
    from pefusion.fusion.config import ModelConfig, TrainConfig

    rng = np.random.default_rng(0)
    split = EncodedSplit.random(rng.integers(1, 129, 401), rng.integers(1, 129, 401), 50, 2, rng)
    corpus = EncodedCorpus(split, split, split, vocab_size=50, num_classes=2, max_len=128, name="shapes",
                           cache_key="")
    model = ModelConfig(d_model=8, nhead=2, num_layers=1, dim_ff=8, dropout=0.0, max_len=128)
    trainer = Trainer(model, TrainConfig(batch_size=4, max_epochs=2, pad_multiple=16, device="cpu"), corpus)
    shapes: list[set] = []
    trainer.model.register_forward_pre_hook(lambda module, args: shapes[-1].add(tuple(args[0].shape)))
    for _ in range(2):
        shapes.append(set())
        trainer.train_epoch()
    assert {w for _, w in shapes[0]} == {16 * k for k in range(1, 9)}  # every width of 16 up to 128
    assert shapes[1] <= shapes[0]


def test_a_weight_that_turns_non_finite_in_the_last_step_ends_the_trial_diverged(smoke_preset, smoke_corpus):
    """An infinity planted in a weight after the last step of a one-epoch trial (every loss of the epoch finite):
    the trial ends diverged, naming the weight and the epoch, not ok with a broken model."""
    model, train = _cfgs(smoke_preset, max_epochs=1, device="cpu")
    trainer = Trainer(model, train, smoke_corpus)
    steps = trainer.train_steps

    def planted():
        yield from steps()
        with torch.no_grad():
            trainer.model.head.weight[0, 0] = float("inf")

    trainer.train_steps = planted
    record = train_and_evaluate(model, train, smoke_corpus, length_edges=smoke_preset.data.length_edges,
                                trainer=trainer)
    assert record[R.STATUS] == R.STATUS_DIVERGED
    assert record[R.ERROR] == "non-finite parameter head.weight after epoch 1" and record[R.EPOCHS_RUN] == 0


def _latency_shapes(trainer: Trainer) -> tuple[dict, list[tuple[int, int]]]:
    """The trainer's latency metrics on its test split, and the (B, T) of every forward pass that timed them."""
    shapes = []
    hook = trainer.model.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    try:
        metrics = trainer.measure_latency(trainer.corpus.test)
    finally:
        hook.remove()
    return metrics, shapes


@pytest.mark.parametrize("method", R.LATENCY_METHODS)
def test_latency_times_what_its_method_names(smoke_preset, smoke_corpus, method):
    """Each method's forward passes, counted by a hook: full passes over every test batch (test_passes); one
    batch_size x max_len batch, every position a token (synthetic_batch), whose per-batch figure is batch size x the
    per-sample one; at most 16 test batches spread over their lengths, the shortest and the longest among them
    (test_sample, here on 2-document batches so the split has more than 16)."""
    warmup, repeats = 1, 2
    model, train = _cfgs(smoke_preset, max_epochs=1, timing_repeats=repeats, timing_warmup=warmup, latency=method,
                         batch_size=2 if method == R.LATENCY_TEST_SAMPLE else smoke_preset.train.batch_size)
    trainer = Trainer(model, train, smoke_corpus)
    metrics, shapes = _latency_shapes(trainer)
    passes = warmup + repeats
    test_batches = [tuple(b.tokens.shape) for b in iter_batches(smoke_corpus.test, train.batch_size, shuffle=False)]
    if method == R.LATENCY_TEST_PASSES:
        assert shapes == test_batches * passes
        assert R.LAT_MS_PER_BATCH not in metrics
    elif method == R.LATENCY_SYNTHETIC_BATCH:
        assert shapes == [(train.batch_size, smoke_corpus.max_len)] * passes
        assert metrics[R.LAT_MS_PER_BATCH] == pytest.approx(metrics[R.LAT_MS_MEAN] * train.batch_size)
        assert metrics[R.LAT_MS_PER_BATCH_STD] == pytest.approx(metrics[R.LAT_MS_STD] * train.batch_size)
    else:
        assert len(test_batches) > 16 and len(shapes) == 16 * passes
        sample = shapes[:16]
        assert set(sample) <= set(test_batches) and sample[0] == test_batches[0] and sample[-1] == test_batches[-1]
        assert R.LAT_MS_PER_BATCH not in metrics
    assert metrics[R.LAT_MS_MEAN] > 0


def test_presets_time_latency_as_their_source_did():
    """The Table 1 presets as the AG News / IMDB notebook (a synthetic batch), arxiv as the ArXiv code (full test
    passes), every other preset a bounded sample; the synthetic batch leaves the trial's random state alone."""
    assert {name: p.train.latency for name, p in PRESETS.items() if name in ("arxiv", "agnews", "imdb", "demo",
                                                                             "text")} == {
        "arxiv": R.LATENCY_TEST_PASSES, "agnews": R.LATENCY_SYNTHETIC_BATCH, "imdb": R.LATENCY_SYNTHETIC_BATCH,
        "demo": R.LATENCY_TEST_SAMPLE, "text": R.LATENCY_TEST_SAMPLE}


def test_a_synthetic_latency_leaves_the_random_state_as_it_was(smoke_preset, smoke_corpus):
    model, train = _cfgs(smoke_preset, max_epochs=1, timing_repeats=1, timing_warmup=0,
                         latency=R.LATENCY_SYNTHETIC_BATCH)
    trainer = Trainer(model, train, smoke_corpus)
    state = torch.get_rng_state()
    trainer.measure_latency(smoke_corpus.test)
    assert torch.equal(torch.get_rng_state(), state)
