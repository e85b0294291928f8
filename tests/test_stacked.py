"""Stacked seeds (`pefusion.fusion.stacked`): the seeds of one cell trained as one batched model are each the
trial it would have been alone."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import allowed_pairs
from pefusion import build_model
from pefusion.fusion.stacked import StackedTrainer, stack_models
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


@pytest.mark.parametrize("pe_type,fusion", allowed_pairs())
def test_each_stacked_seed_computes_its_own_models_logits_loss_and_gradients(pe_type, fusion):
    """3 models of one architecture, each its own seed, stacked: on each seed's own padded batch (fp64, dropout
    0), the stack's logits, per-seed loss and every parameter's gradient slice are that seed's model's, to
    1e-12, for every PE × fusion pair the configuration allows (pre-LN with a final LayerNorm: every layer kind)."""
    S, B, T, V = 3, 3, 10, 20
    models = []
    for seed in range(S):
        torch.manual_seed(seed)
        models.append(build_model(V, 3, d_model=8, nhead=2, num_layers=2, dim_ff=16, max_len=16, dropout=0.0,
                                  norm_first=True, final_norm=True, pe_type=pe_type, fusion=fusion).double())
    stacked = stack_models(models)
    tokens = torch.randint(1, V, (S, B, T), generator=torch.Generator().manual_seed(7))
    tokens[:, 0, 6:] = 0  # every seed's first document is padded, seed 1's second more so
    tokens[1, 1, 3:] = 0
    labels = torch.tensor([[0, 1, 2], [2, 2, 0], [1, 0, 1]])
    logits = stacked(tokens)  # (S, B, C)
    losses = torch.stack([F.cross_entropy(logits[s], labels[s]) for s in range(S)])
    losses.sum().backward()
    for s, model in enumerate(models):
        own = model(tokens[s])
        loss = F.cross_entropy(own, labels[s])
        loss.backward()
        torch.testing.assert_close(logits[s], own, rtol=0, atol=1e-12)
        torch.testing.assert_close(losses[s], loss, rtol=0, atol=1e-12)
        grads = dict(stacked.named_parameters())
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name].grad[s], p.grad, rtol=0, atol=1e-12, msg=name)
    assert not torch.allclose(logits[0], logits[1])  # the seeds' models differ


def test_a_stacked_step_reaches_attention_through_the_call_a_gpu_makes(smoke_preset, smoke_corpus, monkeypatch):
    """With dropout 0 on a CPU a stacked step of 3 seeds calls F.scaled_dot_product_attention as a card's does:
    q a plain tensor (no vmap BatchedTensor), requiring grad, its batch the 3 seeds' documents together."""
    sdpa, seen = F.scaled_dot_product_attention, []

    def spy(q, k, v, **kwargs):
        seen.append((torch._C._functorch.is_batchedtensor(q), q.requires_grad, q.shape[0]))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model, train = _configs(smoke_preset, "add")
    _, sizes = next(StackedTrainer(model, train, smoke_corpus, SEEDS).train_steps())
    assert seen == [(False, True, len(SEEDS) * max(sizes))] * model.num_layers


def test_a_stacked_step_runs_the_same_ops_for_four_seeds_as_for_one(smoke_preset, smoke_corpus):
    """The ops one steady training step dispatches (forward, backward, per-seed gradient clipping, the optimiser,
    the batch's copy), counted by kind: the same for 4 stacked seeds as for 1. Activation dropout on, attention
    dropout off (the CPU's attention-dropout kernel works in cache-sized blocks, whose number grows with the
    batch; a GPU's SDPA is one call)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    model = dataclasses.replace(smoke_preset.model, dropout=0.1, attn_dropout=0.0)
    train = dataclasses.replace(smoke_preset.train, grad_clip=1.0, device="cpu", precision="fp32")
    counted = {}
    for n in (1, 4):
        steps = StackedTrainer(model, train, smoke_corpus, list(range(n))).train_steps()
        next(steps)  # the first step creates the optimiser's state
        with Count() as count:
            next(steps)
        counted[n] = count.ops
    assert counted[1] == counted[4] and sum(counted[1].values()) > 100


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
        next(stacked.model.parameters())[1].fill_(float("nan"))  # seed 1's slice of the first weight
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
    from pefusion.fusion.study import pefusion_study
    from pefusion.fusion.config import RULES
    from pefusion.sweep.settle import resolve_stacking
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
