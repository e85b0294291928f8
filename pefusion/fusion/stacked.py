"""The seeds of one grid cell trained together in one process, as one model of stacked layers (HFTA, arXiv
2102.02344).

A small model leaves a GPU waiting on kernel launches, and fractional GPUs only time-slice the card; S models of
one architecture trained as one model make every kernel S times wider. `StackedTrainer` wraps one ordinary
`Trainer` per seed, each with its own model, initialisation, data order, early stopping, best state, validation,
test record and latency, and replaces only the optimiser step: `stack_models` turns the seeds' models into one
model of the same classes whose every parameter has a leading seed dimension (S, ...), row s being seed s's
tensor (`pefusion.fusion.layers`: one batched matmul per Linear, one grouped convolution, one embedding lookup,
attention over the seeds' documents as one batch of S·B, which SDPA receives as ordinary tensors). The one model
definition is the plain model's: a stack is not a second model class that could drift from it, and a plain
model's state_dict, its checkpoints and its random draws stay as they were; each seed's slice is copied back
into its own model, so its checkpoints stay plain state_dicts.

A step's work is the same number of kernels for any S: one host-to-device copy of the seeds' batches (tokens and
labels packed into one (S, B, T + 1) array), each seed's loss the mean over its own batch, gradients clipped per
seed from one (S,) vector of per-seed norms, and one optimiser step over the stacked parameters (Adam is
elementwise: each seed's slice moves as its own optimiser would move it; fused on a GPU). A seed that stops
(early stopping, its epoch budget, or a diverged loss) leaves the stack with its optimiser state, so no later step
touches it; the trial ends when every seed has stopped.

A step's batch is padded to the widest of the seeds' batches (then to the pad multiple) and to the largest, with
padding-only documents that count in no loss. Where widths are rounded (pad multiple > 1, a GPU's default) every
seed meets the same (size, width) at step k (`batching.batch_order` draws the order of widths from the epoch
alone; the documents of a width are each seed's own draw), so a step pads nothing for another seed: S stacked
seeds compute S separate trials' token slots (`computed_per_real_token`). Unrounded (the CPU's default) the seeds'
batches differ in width and the stack computes more. With dropout 0 every seed's per-step loss is its separate
trial's up to float rounding (`tests/test_stacked.py`); with dropout, each seed draws its own masks, from one
stream.

A step never makes the host wait for the device: the losses and the documents counted in them stay on the
device until the epoch's end. Every active seed has trained the same number of epochs (a seed leaves the stack
when it stops), so their learning-rate schedules agree; the stack follows the first active seed's. When a seed
leaves, the stacked batch becomes (S − 1)·B documents: each width is a new shape once more, and a kernel planned
per shape (cuDNN's attention) plans it again, at most max_len / pad multiple plans per seed that stops.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pefusion import record as R
from pefusion.data.batching import batch_order, batch_width, pad_batch, to_device
from pefusion.data.encoded import EncodedCorpus
from pefusion.fusion.config import ModelConfig, TrainConfig
from pefusion.fusion.model import PEFusionClassifier
from pefusion.fusion.training import Diverged, Trainer, epoch_start

NO_LABEL = -100  # a padding-only document's label: F.cross_entropy's ignore_index, a loss of 0


def stack_models(models: Sequence[PEFusionClassifier]) -> PEFusionClassifier:
    """One model of the same classes whose parameters are the models' stacked, (S, ...) each, row s from
    models[s] (copies); the fixed tables (buffers) are the first model's, shared. Takes tokens (S, B, T) and gives
    logits (S, B, C)."""
    stacked = copy.deepcopy(models[0])
    for name, _ in models[0].named_parameters():
        owner, _, attr = name.rpartition(".")
        setattr(stacked.get_submodule(owner), attr,
                nn.Parameter(torch.stack([m.get_parameter(name).detach() for m in models])))
    return stacked


def step_shape(lengths: np.ndarray, indices: Sequence[np.ndarray], pad_multiple: int, max_len: int) -> tuple[int, int]:
    """(documents, width) of each seed's row of a stacked step whose seeds take documents `indices[s]` of a split
    of `lengths`: the largest batch, padded to the widest document rounded up to `pad_multiple` (at most
    `max_len`). One seed: its separate trial's batch."""
    width = batch_width(max(int(lengths[i].max()) for i in indices), pad_multiple, max_len)
    return max(len(i) for i in indices), width


def computed_per_real_token(lengths: np.ndarray, batch_size: int, seeds: Sequence[int], pad_multiple: int,
                            max_len: int, epoch: int = 0) -> float:
    """Token slots the seeds' stacked steps compute in one training epoch (S × documents × width per step) per
    token of their documents: 1 without padding; for one seed, a separate trial's."""
    orders = [batch_order(lengths, batch_size, shuffle=True, seed=seed, epoch=epoch, pad_multiple=pad_multiple,
                          max_width=max_len) for seed in seeds]
    slots = sum(size * width for size, width in
                (step_shape(lengths, indices, pad_multiple, max_len) for indices in zip(*orders)))
    return slots / float(lengths.sum())


class StackedTrainer:
    """One `Trainer` per seed, trained as one stacked model; see the module docstring."""

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, corpus: EncodedCorpus, seeds: Sequence[int],
                 device: torch.device | None = None) -> None:
        if len(set(seeds)) != len(seeds) or not seeds:
            raise ValueError(f"stacked seeds must be distinct and at least one, got {list(seeds)}")
        # Each built as its separate trial builds it: its own seed, initialisation and data order.
        self.trainers = {seed: Trainer(model_cfg, dataclasses.replace(train_cfg, seed=seed), corpus, device)
                         for seed in seeds}
        self.lead = self.trainers[seeds[0]]  # what every seed shares: device, precision, batch widths, loss
        self.device = self.lead.device
        self.diverged: dict[int, str] = {}  # seed -> why its loss or a weight became non-finite
        self.active: list[int] = []
        self._stack(list(seeds))

    # --- the stack ---------------------------------------------------------------------------------------------
    def _stack(self, seeds: list[int], optimizer_state: dict[str, Any] | None = None) -> None:
        """Stack the models of `seeds` and build the optimiser over them, with its state if given (already cut to
        these seeds)."""
        self.active = seeds
        if not seeds:  # every seed has stopped
            self.model, self.optimizer = None, None
            return
        self.model = stack_models([self.trainers[s].model for s in seeds])
        self.optimizer = self.lead.make_optimizer(self.model.parameters())
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)

    def _unstack(self, keep: list[int]) -> None:
        """Only the seeds `keep` go on: their weights and optimiser state, the others' dropped."""
        self.sync_models()
        rows = [self.active.index(s) for s in keep]
        state = self.optimizer.state_dict()
        for slot in state["state"].values():
            for name, value in slot.items():
                if name != "step" and torch.is_tensor(value) and value.dim() > 0:
                    slot[name] = value[rows]
        self._stack(keep, state if keep else None)

    @torch.no_grad()
    def sync_models(self) -> None:
        """Copy each active seed's slice of the stack into its own model (for evaluation and checkpoints)."""
        stacked = dict(self.model.named_parameters()) if self.active else {}
        for row, seed in enumerate(self.active):
            for name, tensor in self.trainers[seed].model.named_parameters():
                tensor.copy_(stacked[name][row])

    # --- training ----------------------------------------------------------------------------------------------
    def step(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimiser step of every active seed on its own batch: `batch` (S, B, T + 1) on the device, row s
        seed s's (in `self.active`'s order) token ids with its labels in the last column (`NO_LABEL` for a
        padding-only document). Returns the seeds' mean batch losses (S,) and their documents (S,), detached, on
        the device."""
        tokens, labels = batch[..., :-1], batch[..., -1]  # (S, B, T), (S, B)
        self.model.train()
        with self.lead.autocast():
            logits = self.model(tokens)  # (S, B, C)
        # (S, C, B) logits against (S, B) labels: no reshape, whose backward would copy for S > 1 only
        per_doc = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=NO_LABEL,
                                  label_smoothing=self.lead.train_cfg.label_smoothing, reduction="none")  # (S, B)
        counts = (labels != NO_LABEL).sum(1)  # (S,)
        losses = per_doc.sum(1) / counts  # (S,) each seed's mean
        self.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()  # a seed's weights reach its own loss only: its gradient is its trial's
        if self.lead.train_cfg.grad_clip > 0:
            self._clip(self.lead.train_cfg.grad_clip)
        self.optimizer.step()
        return losses.detach(), counts

    @torch.no_grad()
    def _clip(self, max_norm: float) -> None:
        """torch.nn.utils.clip_grad_norm_ per seed, computed as it computes it (the norm of each gradient tensor,
        then of those norms), so that each seed's gradient is scaled as its separate trial's is: one norm per
        stacked tensor gives every seed's at once."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norms = torch.stack([torch.linalg.vector_norm(g, dim=tuple(range(1, g.dim()))) for g in grads])  # (P, S)
        coef = torch.clamp(max_norm / (torch.linalg.vector_norm(norms, dim=0) + 1e-6), max=1.0)  # (S,)
        for g in grads:
            g.mul_(coef.view(-1, *(1,) * (g.dim() - 1)))

    def _host_batch(self, indices: Sequence[np.ndarray]) -> torch.Tensor:
        """The seeds' batches (documents `indices[s]` of the training split) as one host (S, B, T + 1) int64
        tensor (see `step`): widths padded to the widest (then to the pad multiple), sizes to the largest with
        padding-only documents."""
        split = self.lead.corpus.train
        size, width = step_shape(split.lengths, indices, self.lead.placement.pad_multiple,
                                 self.lead.model_cfg.max_len)
        packed = np.zeros((len(indices), size, width + 1), dtype=np.int64)
        packed[..., -1] = NO_LABEL
        for row, index in enumerate(indices):
            tokens = pad_batch(split, index)  # (n, t)
            packed[row, :len(index), :tokens.shape[1]] = tokens
            packed[row, :len(index), -1] = split.labels[index]
        return torch.from_numpy(packed)

    def train_steps(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The optimiser steps of the active seeds' current epoch, each yielding their mean batch losses (S,) and
        batch sizes (S,), both on the device. Every seed has as many batches (the same split and batch size), in
        its own trial's order, and the same learning rate: the active seeds have trained as many epochs."""
        trainers = [self.trainers[s] for s in self.active]
        first = trainers[0]  # not the lead seed's epoch: it may have stopped
        for t in trainers:
            t.model.train()
        orders = [batch_order(t.corpus.train.lengths, t.train_cfg.batch_size, shuffle=True, seed=t.train_cfg.seed,
                              epoch=t.epoch, pad_multiple=t.placement.pad_multiple, max_width=t.model_cfg.max_len)
                  for t in trainers]
        for i, indices in enumerate(zip(*orders)):
            if first.scheduled:
                first.set_lr(self.optimizer, i)
            yield self.step(to_device(self._host_batch(indices), self.device))

    def train_epoch(self) -> dict[int, dict[str, Any]]:
        """One epoch of every active seed, then each seed's own validation and early stopping; a seed whose loss
        became non-finite is recorded as diverged. Returns each seed's epoch metrics (diverged seeds: none), and
        drops the seeds that stopped from the stack."""
        start = epoch_start(self.device)  # (resets the device's peak memory, which each seed's end_epoch reads)
        loss_sum = torch.zeros(len(self.active), dtype=torch.float64, device=self.device)
        n_seen = torch.zeros(len(self.active), dtype=torch.int64, device=self.device)
        for losses, sizes in self.train_steps():
            loss_sum += losses.double() * sizes
            n_seen += sizes
        losses = (loss_sum / n_seen.clamp(min=1)).tolist()  # waits for the GPU's last step
        seconds = time.perf_counter() - start  # the seeds' shared epoch: each seed's training time
        self.sync_models()
        metrics = {}
        for seed, loss in zip(self.active, losses):
            try:
                metrics[seed] = self.trainers[seed].end_epoch(loss, seconds)
            except Diverged as exc:
                self.diverged[seed] = str(exc)
        going = [s for s in self.active if s not in self.diverged and not self.trainers[s].finished]
        if going != self.active:
            self._unstack(going)
        return metrics

    @property
    def finished(self) -> bool:
        return not self.active

    # --- records and checkpoints -------------------------------------------------------------------------------
    def final_records(self, length_edges: tuple[int, ...]) -> dict[int, dict[str, Any]]:
        """Each seed's record from its own Trainer (its best state restored, tested and timed alone, as a
        separate trial would be), or its diverged record."""
        return {seed: (t.failure_record(R.STATUS_DIVERGED, self.diverged[seed]) if seed in self.diverged
                       else t.final_record(length_edges)) for seed, t in self.trainers.items()}

    def state_dict(self) -> dict[str, Any]:
        """Every seed's Trainer state, the stack's optimiser state and which seeds it holds, and the process's
        RNG state once (every seed's dropout draws from it)."""
        self.sync_models()
        return {"trainers": {seed: t.state_dict() for seed, t in self.trainers.items()},
                "active": list(self.active), "diverged": dict(self.diverged),
                "optimizer": self.optimizer.state_dict() if self.optimizer else None,
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for seed, trainer_state in state["trainers"].items():
            self.trainers[seed].load_state_dict(trainer_state)
        self.diverged = dict(state["diverged"])
        self._stack(list(state["active"]), state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
