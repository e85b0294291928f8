"""Stacked seeds (`pefusion.fusion.stacked`): the seeds of one cell trained as one batched model are each the
trial it would have been alone."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from pefusion.fusion.stacked import StackedTrainer
from pefusion.fusion.training import Trainer

SEEDS = (0, 1, 2)
STEPS = 50


@pytest.fixture
def deterministic():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)


def _configs(preset, fusion: str):
    """The smoke model without dropout (its draws are the one thing a stacked seed does not share with its
    trial), batches of 4 (50 steps to an epoch of the smoke corpus's 200 documents, the seeds' batches of other
    widths: a stacked step pads them to the widest, a difference of ~1e-7 in a loss), clipping low enough to act
    at every step (gradient norms 0.7-2.3), at the preset's lr (at 3e-3 the post-LN model is chaotic enough to
    grow 1e-7 into 1e-3 within 50 steps)."""
    model = dataclasses.replace(preset.model, fusion=fusion, dropout=0.0)
    train = dataclasses.replace(preset.train, batch_size=4, grad_clip=0.1, device="cpu", precision="fp32")
    return model, train


@pytest.mark.parametrize("fusion", ["add", "concat", "gate_cnn", "mlp_gate"])
def test_each_stacked_seed_takes_its_separate_trials_steps(smoke_preset, smoke_corpus, deterministic, fusion):
    """Per-step training loss of each of 3 stacked seeds against its own separate trial, over 50 steps, fp32 on
    the CPU: within 1e-4 (float rounding of batched products and wider padding), while two seeds differ by far
    more."""
    model, train = _configs(smoke_preset, fusion)
    separate = {}
    for seed in SEEDS:
        trainer = Trainer(model, dataclasses.replace(train, seed=seed), smoke_corpus)
        separate[seed] = [float(loss) for loss, _ in itertools.islice(trainer.train_steps(), STEPS)]
    stacked = StackedTrainer(model, train, smoke_corpus, SEEDS)
    steps = [losses.tolist() for losses, _ in itertools.islice(stacked.train_steps(), STEPS)]
    assert len(steps) == STEPS
    for row, seed in enumerate(SEEDS):
        np.testing.assert_allclose([s[row] for s in steps], separate[seed], rtol=0, atol=1e-4, err_msg=str(seed))
    assert np.abs(np.subtract(separate[0], separate[1])).max() > 1e-2  # the seeds' trials are not alike


def test_cpu_dropout_kernels_under_vmap_draw_one_mask_per_seed_and_their_gradients_follow_it():
    """The CPU kernels vmap cannot batch run under it through their vmap rules (every seed's tensors as one batch):
    each seed's output is its input through its own mask, the masks differ between seeds, and the gradients
    are those of that output, checked against the dense formula written here."""
    from torch.func import vmap

    from pefusion.fusion.attention import _ChunkedDropoutAttention, _MaskedDropout

    torch.manual_seed(0)
    S, B, H, T, hd, p = 3, 2, 2, 5, 4, 0.3
    q, k, v = (torch.randn(S, B, H, T, hd, requires_grad=True) for _ in range(3))
    attend = torch.ones(S, B, 1, 1, T, dtype=torch.bool)
    attend[:, 0, ..., -2:] = False  # the first document of each seed's batch is padded
    bias = torch.zeros(attend.shape).masked_fill(~attend, float("-inf"))
    out, keep = vmap(lambda *a: _ChunkedDropoutAttention.apply(*a, p), randomness="different")(q, k, v, bias)
    probs = torch.softmax(q @ k.transpose(-1, -2) / hd ** 0.5 + bias, -1)
    expected = (probs * keep / (1 - p)) @ v
    torch.testing.assert_close(out, expected)
    assert not torch.equal(keep[0], keep[1]) and not torch.equal(keep[1], keep[2])
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    torch.testing.assert_close(got, torch.autograd.grad(expected, (q, k, v), grad))

    x = torch.randn(S, 7, 6, requires_grad=True)
    y, mask = vmap(lambda t: _MaskedDropout.apply(t, p), randomness="different")(x)
    torch.testing.assert_close(y, x * mask)
    assert mask.unique().tolist() == pytest.approx([0.0, 1 / (1 - p)]) and not torch.equal(mask[0], mask[1])
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], mask)


def test_a_stacked_seed_that_diverges_is_recorded_while_the_others_train_on(smoke_preset, smoke_corpus):
    """Seeds share the trial's learning rate, so seed 1's weights are poisoned after the first epoch, as a blow-up
    would leave them: it ends as diverged in its next epoch and leaves the stack, and the other seeds train on to
    their own end with the records of healthy runs."""
    from pefusion import record as R

    model = smoke_preset.model
    train = dataclasses.replace(smoke_preset.train, max_epochs=3, early_stopping=False, device="cpu")
    stacked = StackedTrainer(model, train, smoke_corpus, SEEDS)
    stacked.train_epoch()
    with torch.no_grad():
        next(iter(stacked.params.values()))[1].fill_(float("nan"))  # seed 1's slice of the first weight
    while not stacked.finished:
        stacked.train_epoch()
    records = stacked.final_records(smoke_preset.data.length_edges)
    assert records[1][R.STATUS] == R.STATUS_DIVERGED and "non-finite" in records[1][R.ERROR]
    assert records[1][R.EPOCHS_RUN] == 1
    for seed in (0, 2):
        assert records[seed][R.STATUS] == R.STATUS_OK and records[seed][R.EPOCHS_RUN] == 3
        assert np.isfinite(records[seed][R.TEST_ACC])


@pytest.mark.parametrize("gpus_per_trial", [None, 0.5])
def test_the_grid_trains_one_trial_per_seed_by_default_also_where_trials_get_a_gpu(
        monkeypatch, tmp_path, smoke_preset, gpus_per_trial):
    """`--stack-seeds` left out on a machine with a CUDA device and a local cluster of one (logical) GPU, with
    `--gpus-per-trial` auto or 0.5: the seeds stay a grid, one trial each; `--stack-seeds` stacks them."""
    from pefusion.cli.fusion import pefusion_study
    from pefusion.fusion.config import RULES
    from pefusion.sweep.driver import resolve_stacking
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.space import parse_search_space

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    space = parse_search_space({"fusion": {"grid": ["add"]}, "seed": {"grid": [0, 1, 2]}}, RULES)
    study = pefusion_study("arxiv_grid", "smoke", smoke_preset, space, 1.0)

    def settled(stack):
        opts = SweepOptions(sweep="arxiv_grid", experiment="pe-fusion", storage_path=str(tmp_path), num_gpus=1,
                            gpus_per_trial=gpus_per_trial, stack=stack)
        return resolve_stacking(study, opts).space.stacked_key()

    assert settled(None) is None and settled(False) is None
    assert settled(True) == "seed"
