"""The seeds of one grid cell trained together in one process, as one batched model (HFTA, arXiv 2102.02344).

A small model leaves a GPU waiting on kernel launches, and fractional GPUs only time-slice the card; S models of
one architecture trained as one model make every kernel S times wider. `StackedTrainer` wraps one ordinary
`Trainer` per seed, each with its own model, initialisation, data order, early stopping, best state, validation,
test record and latency, and replaces only the optimiser step: the seeds' parameters are stacked
(`torch.func.stack_module_state`), the one model definition runs over them with `torch.func.vmap` of
`functional_call`, each seed's loss is the mean over its own batch, gradients are clipped per seed, and one
optimiser updates the stacked parameters (Adam is elementwise: each seed's slice moves as its own optimiser would
move it). A seed that stops (early stopping, its epoch budget, or a diverged loss) leaves the stack with its
optimiser state, so no later step touches it; the trial ends when every seed has stopped.

What vmap cannot batch is kept out of its way: the CPU kernels of `pefusion.fusion.attention` (numpy-drawn dropout
masks, the chunked attention-dropout kernel) are autograd Functions whose vmap rules run them once on every seed's
tensors folded into one batch, and the template's modules (`vmapped`) take no branch on a tensor's values
(`vmapped_attention`; ALiBi's unpadded batch). Seeds' batches differ in length and, at the end of an epoch,
in size: a step's batch is padded to the widest of them (then to the pad multiple) and to the largest, with
padding-only documents that count in no loss. With dropout 0 every seed's per-step loss is its separate trial's
up to float rounding (`tests/test_stacked.py`); with dropout, each seed draws its own masks, from one stream.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from pefusion import record as R
from pefusion.data.batching import Batch, batch_width, to_device
from pefusion.data.encoded import EncodedCorpus
from pefusion.fusion.config import ModelConfig, TrainConfig
from pefusion.fusion.model import PEFusionClassifier, SelfAttention
from pefusion.fusion.training import Diverged, Trainer, epoch_start


class StackedTrainer:
    """One `Trainer` per seed, trained as one stacked model; see the module docstring."""

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, corpus: EncodedCorpus, seeds: Sequence[int],
                 device: torch.device | None = None) -> None:
        if len(set(seeds)) != len(seeds) or not seeds:
            raise ValueError(f"stacked seeds must be distinct and at least one, got {list(seeds)}")
        # Each built as its separate trial builds it: its own seed, initialisation and data order.
        self.trainers = {seed: Trainer(model_cfg, dataclasses.replace(train_cfg, seed=seed), corpus, device)
                         for seed in seeds}
        self.lead = self.trainers[seeds[0]]  # what every seed shares: device, precision, schedule, batch widths
        self.device = self.lead.device
        self.diverged: dict[int, str] = {}  # seed -> why its loss became non-finite
        # The one model definition, with no weights of its own, that vmap runs each seed's weights through.
        self.template = copy.deepcopy(self.lead.model).to("meta")
        for module in self.template.modules():
            if isinstance(module, (PEFusionClassifier, SelfAttention)):
                module.vmapped = True
        self.active: list[int] = []
        self._stack(list(seeds))

    # --- the stack ---------------------------------------------------------------------------------------------
    def _stack(self, seeds: list[int], optimizer_state: dict[str, Any] | None = None) -> None:
        """Stack the weights of `seeds` (from their models) and build the optimiser over them, with its state if
        given (already cut to these seeds)."""
        self.active = seeds
        if not seeds:  # every seed has stopped
            self.params, self.buffers, self.optimizer = {}, {}, None
            return
        self.params, self.buffers = stack_module_state([self.trainers[s].model for s in seeds])  # (S, ...) each
        self.optimizer = self.lead.make_optimizer(self.params.values())
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
        for row, seed in enumerate(self.active):
            for name, tensor in self.trainers[seed].model.named_parameters():
                tensor.copy_(self.params[name][row])

    # --- training ----------------------------------------------------------------------------------------------
    def _forward(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                 tokens: torch.Tensor) -> torch.Tensor:
        """One seed's logits (B, C) from its weights and its tokens (B, T): the model's own forward."""
        return functional_call(self.template, (params, buffers), (tokens,))

    def step(self, batches: Sequence[Batch]) -> torch.Tensor:
        """One optimiser step of every active seed on its own batch (in `self.active`'s order); returns the
        seeds' mean batch losses (S,), detached, on the device."""
        tokens, labels, weights = self._stacked_batch(batches)  # (S, B, T), (S, B), (S, B)
        self.template.train()
        with self.lead.autocast():
            logits = vmap(self._forward, randomness="different")(self.params, self.buffers, tokens)  # (S, B, C)
        per_doc = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                                  label_smoothing=self.lead.train_cfg.label_smoothing, reduction="none")
        losses = (per_doc.view_as(weights) * weights).sum(1) / weights.sum(1)  # (S,) each seed's mean
        self.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()  # a seed's weights reach its own loss only: its gradient is its trial's
        if self.lead.train_cfg.grad_clip > 0:
            self._clip(self.lead.train_cfg.grad_clip)
        self.optimizer.step()
        return losses.detach()

    def _clip(self, max_norm: float) -> None:
        """torch.nn.utils.clip_grad_norm_ per seed, computed as it computes it (the norm of each gradient tensor,
        then of those norms), so that each seed's gradient is scaled as its separate trial's is."""
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        for row in range(len(self.active)):
            seed_grads = [g[row] for g in grads]
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in seed_grads]))
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
            for g in seed_grads:
                g.mul_(coef)

    def _stacked_batch(self, batches: Sequence[Batch]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The seeds' batches as one (S, B, T) batch: widths padded to the widest (then to the pad multiple),
        sizes to the largest with padding-only documents of weight 0."""
        placement, max_len = self.lead.placement, self.lead.model_cfg.max_len
        width = batch_width(max(b.tokens.shape[1] for b in batches), placement.pad_multiple, max_len)
        size = max(len(b.labels) for b in batches)
        tokens = torch.zeros(len(batches), size, width, dtype=torch.int64, device=self.device)
        labels = torch.zeros(len(batches), size, dtype=torch.int64, device=self.device)
        weights = torch.zeros(len(batches), size, device=self.device)
        for row, b in enumerate(batches):
            n, t = b.tokens.shape
            tokens[row, :n, :t] = b.tokens
            labels[row, :n] = b.labels
            weights[row, :n] = 1.0
        return tokens, labels, weights

    def train_steps(self) -> Iterator[tuple[torch.Tensor, np.ndarray]]:
        """The optimiser steps of the active seeds' current epoch, each yielding (their mean batch losses (S,) on
        the device, their batch sizes (S,)). Every seed has as many batches (the same split and batch size)."""
        trainers = [self.trainers[s] for s in self.active]
        for t in trainers:
            t.model.train()
        for i, batches in enumerate(zip(*(t.batches(t.corpus.train, shuffle=True) for t in trainers))):
            if self.lead.scheduled:
                self.lead.set_lr(self.optimizer, i)
            yield self.step(batches), np.array([len(b.labels) for b in batches])

    def train_epoch(self) -> dict[int, dict[str, Any]]:
        """One epoch of every active seed, then each seed's own validation and early stopping; a seed whose loss
        became non-finite is recorded as diverged. Returns each seed's epoch metrics (diverged seeds: none), and
        drops the seeds that stopped from the stack."""
        start = epoch_start(self.device)  # (resets the device's peak memory, which each seed's end_epoch reads)
        loss_sum = torch.zeros(len(self.active), dtype=torch.float64, device=self.device)
        n_seen = np.zeros(len(self.active))
        for losses, sizes in self.train_steps():
            loss_sum += losses.double() * torch.as_tensor(sizes, device=self.device)
            n_seen += sizes
        losses = (loss_sum.cpu().numpy() / np.maximum(n_seen, 1)).tolist()  # waits for the GPU's last step
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
        """Each seed's SPEC §3 record from its own Trainer (its best state restored, tested and timed alone, as a
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
