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


def _widths(model) -> list[int]:
    """The width of each batch `model` is called on, as it is called (a forward pre-hook)."""
    widths: list[int] = []
    model.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[-1]))
    return widths


@pytest.mark.parametrize("fusion,pad_multiple", [("add", 1), ("concat", 1), ("gate_cnn", 1), ("mlp_gate", 1),
                                                 ("add", 64), ("gate_cnn", 64)])
def test_each_stacked_seed_takes_its_separate_trials_steps(smoke_preset, smoke_corpus, deterministic, fusion,
                                                           pad_multiple):
    """Per-step training loss of each of 3 stacked seeds against its own separate trial, over 50 steps, fp32 on
    the CPU: within 1e-4 (float rounding of batched products and wider padding), while two seeds differ by far
    more. With widths rounded to 64 (a card's batches), each stacked step is exactly as wide as every seed's own
    batch: the seeds share the order of widths, so no seed's step is padded for another's."""
    model, train = _configs(smoke_preset, fusion)
    train = dataclasses.replace(train, pad_multiple=pad_multiple)
    separate, widths = {}, {}
    for seed in SEEDS:
        trainer = Trainer(model, dataclasses.replace(train, seed=seed), smoke_corpus)
        widths[seed] = _widths(trainer.model)
        separate[seed] = [float(loss) for loss, _ in itertools.islice(trainer.train_steps(), STEPS)]
    stacked = StackedTrainer(model, train, smoke_corpus, SEEDS)
    stacked_widths = _widths(stacked.model)
    steps = [losses.tolist() for losses, _ in itertools.islice(stacked.train_steps(), STEPS)]
    assert len(steps) == STEPS
    for row, seed in enumerate(SEEDS):
        np.testing.assert_allclose([s[row] for s in steps], separate[seed], rtol=0, atol=1e-4, err_msg=str(seed))
    assert np.abs(np.subtract(separate[0], separate[1])).max() > 1e-2  # the seeds' trials are not alike
    if pad_multiple == 64:
        assert set(stacked_widths) == {64, 128}
        assert all(widths[seed] == stacked_widths for seed in SEEDS)


def test_at_rounded_widths_stacked_seeds_compute_the_token_slots_of_separate_trials():
    """The batch plan of an epoch over 3 000 documents of review-like lengths (log-normal, at most 512 tokens),
    batches of 64, widths rounded to 64: the slots that 1, 3 and 5 stacked seeds compute per real token, counted
    here from each step's batches (the largest batch × its widest document rounded up), are one separate trial's
    (target: at most 1.05×); the seeds still draw their own documents. Unrounded (a CPU's batches), the seeds'
    widths differ and a stacked step computes more than its seeds."""
    from pefusion.data.batching import batch_order
    from pefusion.fusion.stacked import computed_per_real_token

    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.lognormal(5.2, 0.7, 3000).astype(np.int64) + 1, 512)
    size, max_len = 64, 512

    def by_hand(seeds, multiple):
        orders = [batch_order(lengths, size, shuffle=True, seed=s, epoch=2, pad_multiple=multiple, max_width=max_len)
                  for s in seeds]
        slots = 0
        for step in zip(*orders):
            longest = max(int(lengths[b].max()) for b in step)
            slots += len(seeds) * max(len(b) for b in step) * min(-(-longest // multiple) * multiple, max_len)
        return slots / (len(seeds) * lengths.sum())

    separate = by_hand([0], 64)
    for seeds in ([0], [0, 1, 2], [0, 1, 2, 3, 4]):
        ratio = computed_per_real_token(lengths, size, seeds, 64, max_len, epoch=2)
        assert ratio == pytest.approx(by_hand(seeds, 64), rel=1e-12)
        assert ratio <= 1.05 * separate
    first, second = (batch_order(lengths, size, shuffle=True, seed=s, epoch=2, pad_multiple=64, max_width=max_len)
                     for s in (0, 1))
    assert all(len(a) == len(b) for a, b in zip(first, second))
    assert sum(not np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(first, second)) > len(first) // 2
    assert by_hand([0, 1, 2, 3, 4], 1) > 1.05 * by_hand([0], 1)


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
    assert seen == [(False, True, len(SEEDS) * int(sizes.max()))] * model.num_layers


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


def _planting_after_the_epoch(steps, plant):
    """`steps` (a trainer's train_steps) with `plant()` run once its epoch's last step is done: a weight spoilt by
    the last update, which no loss of the epoch saw."""
    def planted():
        yield from steps()
        plant()
    return planted


def test_a_stacked_seed_whose_weight_turns_non_finite_in_the_last_step_ends_diverged(smoke_preset, smoke_corpus):
    """Seed 1's slice of a weight turns NaN after the epoch's last step (its losses all finite), in a one-epoch
    trial: seed 1 ends diverged naming the weight and the epoch; seeds 0 and 2 end ok."""
    from pefusion import record as R

    train = dataclasses.replace(smoke_preset.train, max_epochs=1, device="cpu")
    stacked = StackedTrainer(smoke_preset.model, train, smoke_corpus, SEEDS)
    stacked.train_steps = _planting_after_the_epoch(
        stacked.train_steps, lambda: stacked.model.head.weight.data[1, 0, 0].fill_(float("nan")))
    stacked.train_epoch()
    records = stacked.final_records(smoke_preset.data.length_edges)
    assert records[1][R.STATUS] == R.STATUS_DIVERGED
    assert records[1][R.ERROR] == "non-finite parameter head.weight after epoch 1"
    assert [records[s][R.STATUS] for s in (0, 2)] == [R.STATUS_OK, R.STATUS_OK]


def test_each_stacked_seeds_learning_rate_follows_its_own_epoch_when_the_lead_seed_stops(smoke_preset,
                                                                                           smoke_corpus):
    """The `text` preset's schedule (warm-up, then cosine decay over the budget) on 3 stacked seeds for 3 epochs;
    the lead seed's weights are spoilt after epoch 1, so it ends diverged in epoch 2 and leaves. Every step's
    learning rate of the stack, epoch 3 included, is the one seed 1's separate trial takes at that step."""
    from pefusion.fusion.config import PRESETS

    train = dataclasses.replace(PRESETS["text"].train, max_epochs=3, early_stopping=False, device="cpu")
    separate = Trainer(smoke_preset.model, dataclasses.replace(train, seed=1), smoke_corpus)
    expected = []
    for _ in range(train.max_epochs):
        expected += [separate.optimizer.param_groups[0]["lr"] for _ in separate.train_steps()]
        separate.epoch += 1
    stacked = StackedTrainer(smoke_preset.model, train, smoke_corpus, SEEDS)
    seen = []
    step = stacked.step
    stacked.step = lambda batch: (seen.append(stacked.optimizer.param_groups[0]["lr"]), step(batch))[1]
    stacked.train_epoch()
    with torch.no_grad():
        next(stacked.model.parameters())[0].fill_(float("nan"))  # the lead seed's slice
    while not stacked.finished:
        stacked.train_epoch()
    assert stacked.diverged.keys() == {0} and stacked.trainers[1].epoch == 3
    assert len(seen) == len(expected) and len(set(expected)) > 10  # the schedule moves at every step
    assert seen == pytest.approx(expected, rel=1e-12, abs=0)


def test_the_padding_benchmark_reads_a_training_split_and_prints_each_seed_count(tmp_path, capsys):
    """`bench_stacked.py --padding DIR` on a folder of 300 reviews: a line per (pad multiple, seeds), at 64 the
    stacked seeds computing a separate trial's slots, unrounded more."""
    import json

    from benchmarks.stacked import main

    rng = np.random.default_rng(0)
    for split in ("train", "validation", "test"):
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            for n in rng.integers(1, 700, 300):
                f.write(json.dumps({"text": " ".join(["w"] * int(n)), "label": int(n) % 2}) + "\n")
    assert main(["--padding", str(tmp_path)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["pad_multiple"], x["seeds"]) for x in lines] == [(64, 1), (64, 3), (64, 5), (1, 1), (1, 3), (1, 5)]
    assert all(x["documents"] == 300 and x["over_separate"] == 1.0 for x in lines[:3])
    assert lines[5]["over_separate"] > 1.05
