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
