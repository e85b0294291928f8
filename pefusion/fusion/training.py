"""Training and evaluation of one PE-fusion trial: epochs, early stopping, best-checkpoint restore, test metrics.

`Trainer` is the unit of one trial (build, restore, step); `train_and_evaluate` is the one epoch loop, driven by
the Ray Tune trainable (which reports each epoch through `on_epoch`), scripts and tests. It ends in the trial's
record (docs/operations.md, MLflow), a plain dict keyed by `pefusion.record` names.

Why a class with `state_dict()`: a Tune trial may be killed and resumed; the checkpoint carries the model, the
optimiser, the early-stopping counters, the best weights and the RNG state, so a resumed trial continues
bit-identically on CPU (batch order is a function of (seed, epoch), dropout draws come from the restored RNG, and
the learning rate of a step is a function of its index, epoch × steps per epoch + batch). The checkpoint also
carries the trial's clock (its first start, its wall seconds so far), so a restarted trial adds to it; clocks and
rates are timing, read and never fed back into what is trained.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pefusion import record as R
from pefusion.fusion.config import ModelConfig, TrainConfig, flat_config
from pefusion.fusion.device import place, select_device
from pefusion.fusion.model import build_model_from_config
from pefusion.data.batching import Batch, iter_batches, length_bucket_of
from pefusion.data.encoded import EncodedCorpus, EncodedSplit


# The most evaluation batches the `test_sample` latency times: enough to cover the split's lengths, few enough that
# timing stays a small part of a trial whatever the split's size.
LATENCY_SAMPLE_BATCHES = 16


def latency_sample(n_batches: int) -> np.ndarray:
    """Which of a split's `n_batches` evaluation batches (sorted by length) the `test_sample` latency times: all,
    or `LATENCY_SAMPLE_BATCHES` spread evenly over them, the shortest and the longest included."""
    if n_batches <= LATENCY_SAMPLE_BATCHES:
        return np.arange(n_batches)
    return np.linspace(0, n_batches - 1, LATENCY_SAMPLE_BATCHES).round().astype(int)


class Diverged(RuntimeError):
    """The training loss or a parameter became non-finite."""


def seed_everything(seed: int) -> None:
    """One seed controls initialisation and dropout (batch order has its own (seed, epoch) stream)."""
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Unweighted mean F1 over the classes present in y_true or y_pred (sklearn's default label set)."""
    labels = np.union1d(y_true, y_pred)
    tp = np.array([np.sum((y_true == c) & (y_pred == c)) for c in labels], dtype=float)
    fp = np.array([np.sum((y_true != c) & (y_pred == c)) for c in labels], dtype=float)
    fn = np.array([np.sum((y_true == c) & (y_pred != c)) for c in labels], dtype=float)
    denom = 2 * tp + fp + fn
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return float(f1.mean()) if len(labels) else 0.0


def epoch_start(device: torch.device) -> float:
    """An epoch begins on `device`: reset the peak-memory counters (CUDA) that `memory_peaks` reads at its end, and
    return the clock's time (`time.perf_counter`)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return time.perf_counter()


def memory_peaks(device: torch.device) -> dict[str, float]:
    """The peak memory torch allocated and reserved on `device` since `epoch_start`, in MiB; none on a CPU."""
    if device.type != "cuda":
        return {}
    return {R.PEAK_MEM_ALLOC_MIB: torch.cuda.max_memory_allocated(device) / 2 ** 20,
            R.PEAK_MEM_RESERVED_MIB: torch.cuda.max_memory_reserved(device) / 2 ** 20}


def nonfinite_parameter(model: torch.nn.Module) -> str | None:
    """The name of `model`'s first parameter holding a NaN or an infinity, or None: one flag per parameter computed
    on the device and read in one transfer. Read at an epoch's end: a non-finite weight stays so under Adam (its
    gradient and update are non-finite too), so none that appeared during the epoch is missed."""
    names, params = zip(*model.named_parameters())
    finite = torch.stack([torch.isfinite(p).all() for p in params]).cpu().numpy()  # (P,)
    return None if finite.all() else names[int(np.argmin(finite))]


def lr_factor(step: int, total: int, warmup_steps: int, schedule: str) -> float:
    """The multiplier of the base learning rate at optimiser step `step` (0-based) of `total`: linear warm-up
    (step + 1) / warmup_steps over the first warmup_steps, then 1 (constant), or a cosine or linear decay over
    the remaining steps that reaches 0 one step after the last."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total - warmup_steps)  # in [0, 1)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    return 1.0


class Trainer:
    """Builds the model and optimiser for one trial and steps it one epoch at a time."""

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, corpus: EncodedCorpus,
                 device: torch.device | None = None) -> None:
        # The trial's clock: its first start (Unix s) and the wall seconds of its earlier processes (a restored
        # state's), to which this process adds its own from now, building the model included (`wall_s`).
        self.started_at, self.wall_before_s, self.process_start = time.time(), 0.0, time.monotonic()
        self.model_cfg, self.train_cfg, self.corpus = model_cfg, train_cfg, corpus
        # precision and pad multiple resolved on this device, its TF32 and attention-kernel flags set
        self.placement = place(device or select_device(train_cfg.device), train_cfg.precision, train_cfg.pad_multiple,
                               model_cfg.max_len)
        self.device = self.placement.device
        if corpus.max_len > model_cfg.max_len:
            raise ValueError(f"the data keeps {corpus.max_len} tokens per document but the model's max_len is "
                             f"{model_cfg.max_len}: set max_len >= {corpus.max_len}")
        seed_everything(train_cfg.seed)
        self.model = build_model_from_config(model_cfg, corpus.vocab_size, corpus.num_classes).to(self.device)
        self.optimizer = self.make_optimizer(self.model.parameters())
        # The schedule spans the whole max_epochs budget (under ASHA: max_t), as a trial cannot know it will be
        # stopped early; an epoch has ceil(N / batch_size) steps (batching.batch_order).
        self.steps_per_epoch = math.ceil(len(corpus.train) / train_cfg.batch_size)
        self.total_steps = self.steps_per_epoch * train_cfg.max_epochs
        self.warmup_steps = round(train_cfg.warmup * self.total_steps)
        self.scheduled = train_cfg.lr_schedule != "constant" or self.warmup_steps > 0
        self.epoch = 0  # epochs completed
        self.best_val_acc = -math.inf
        self.best_epoch = 0
        self.best_state: dict[str, torch.Tensor] | None = None
        self.bad_epochs = 0
        self.train_time_s = 0.0
        self.history: list[dict[str, float]] = []
        # What an epoch trains on: every training document once, and its kept tokens (the rates' numerators).
        self.epoch_samples, self.epoch_tokens = len(corpus.train), int(corpus.train.lengths.sum())

    def make_optimizer(self, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        """The trial's optimiser over `params` (this model's, or the stacked parameters of several seeds: Adam is
        elementwise, so each seed's slice is updated as its own optimiser would update it)."""
        cfg = self.train_cfg
        opt_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
        # On a GPU, one fused kernel updates every parameter instead of a few kernels per parameter tensor; the CPU
        # keeps the default implementation, whose results the tests pin.
        return opt_cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                       **({"fused": True} if self.device.type == "cuda" else {}))

    # --- checkpointing ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "epoch": self.epoch, "best_val_acc": self.best_val_acc, "best_epoch": self.best_epoch,
            "best_state": self.best_state, "bad_epochs": self.bad_epochs, "train_time_s": self.train_time_s,
            "history": self.history, R.STARTED_AT: self.started_at, R.WALL_S: self.wall_s,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # this trial's config wins: PBT restores with a mutated lr
            group["lr"], group["weight_decay"] = self.train_cfg.lr, self.train_cfg.weight_decay
        for key in ("epoch", "best_val_acc", "best_epoch", "best_state", "bad_epochs", "train_time_s", "history"):
            setattr(self, key, state[key])
        # (a checkpoint written before the trial's clock was kept has none: this process starts it)
        self.started_at = state.get(R.STARTED_AT, self.started_at)
        self.wall_before_s = state.get(R.WALL_S, 0.0)
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    @property
    def wall_s(self) -> float:
        """The trial's wall seconds so far: its earlier processes' (as of their last checkpoint; what a lost process
        did after it is redone, and counted, here) and this process's since the Trainer was built."""
        return self.wall_before_s + time.monotonic() - self.process_start

    # --- one epoch ----------------------------------------------------------------------------------------
    def autocast(self) -> ContextManager:
        """The forward pass's precision: bf16 autocast, or nothing for fp32 and tf32 (set process-wide by
        `place`). Losses are computed outside it, in fp32, from logits cast to fp32."""
        if self.placement.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    @property
    def finished(self) -> bool:
        cfg = self.train_cfg
        return self.epoch >= cfg.max_epochs or (cfg.early_stopping and self.bad_epochs >= cfg.patience)

    def step(self, batch: Batch) -> torch.Tensor:
        """One optimiser step on `batch` (model in training mode); returns the batch's mean loss, detached and
        still on the device: reading it would make the host wait for the GPU, so callers read it once per epoch."""
        with self.autocast():
            logits = self.model(batch.tokens)  # (B, C)
        loss = F.cross_entropy(logits.float(), batch.labels, label_smoothing=self.train_cfg.label_smoothing)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.train_cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.grad_clip)
        self.optimizer.step()
        return loss.detach()

    def train_steps(self) -> Iterator[tuple[torch.Tensor, int]]:
        """The optimiser steps of epoch `self.epoch`, one per batch, each yielding (batch loss as a 0-d tensor on
        the device, batch size). Does not advance the epoch or check the loss (train_epoch does both)."""
        self.model.train()
        for i, batch in enumerate(self.batches(self.corpus.train, shuffle=True)):
            if self.scheduled:
                self.set_lr(self.optimizer, i)
            yield self.step(batch), len(batch.labels)

    def batches(self, split: EncodedSplit, *, shuffle: bool) -> Iterator[Batch]:
        """`split`'s batches on this trial's device: training's shuffled for epoch `self.epoch`, evaluation's by
        length; widths rounded up to the resolved pad multiple, never past the model's max_len."""
        return iter_batches(split, self.train_cfg.batch_size, shuffle=shuffle, seed=self.train_cfg.seed,
                            epoch=self.epoch, device=self.device, pad_multiple=self.placement.pad_multiple,
                            max_width=self.model_cfg.max_len)

    def set_lr(self, optimizer: torch.optim.Optimizer, i: int) -> None:
        """`optimizer`'s learning rate for step `i` (0-based) of epoch `self.epoch` under the configured schedule
        (a function of the step's index in the whole budget, so exact across a resume)."""
        step = self.epoch * self.steps_per_epoch + i
        lr = self.train_cfg.lr * lr_factor(step, self.total_steps, self.warmup_steps, self.train_cfg.lr_schedule)
        for group in optimizer.param_groups:
            group["lr"] = lr

    def train_epoch(self) -> dict[str, float]:
        """One pass over the training split, then validation; updates early stopping. Raises `Diverged` when a
        step's loss or a parameter was non-finite (checked once, at the end of the epoch: a NaN or inf in any step
        makes the sum non-finite, and checking every step would stall the GPU once per batch)."""
        start = epoch_start(self.device)
        # float64 on the device: the same sum, rounding for rounding, as adding the float32 losses in Python
        loss_sum, n_seen = torch.zeros((), dtype=torch.float64, device=self.device), 0
        for loss, n in self.train_steps():
            loss_sum += loss.double() * n
            n_seen += n
        return self.end_epoch(loss_sum.item() / max(n_seen, 1), time.perf_counter() - start)

    def end_epoch(self, train_loss: float, seconds: float) -> dict[str, float]:
        """Close epoch `self.epoch` after its steps, which took `seconds` (from `epoch_start`, the device done):
        raise `Diverged` on a non-finite mean training loss or parameter, else count the epoch and its training
        seconds, validate, update early stopping and the best state. Returns the epoch's metrics, its costs among
        them."""
        cfg = self.train_cfg
        if not math.isfinite(train_loss):
            raise Diverged(f"non-finite training loss ({train_loss}) in epoch {self.epoch + 1}")
        bad = nonfinite_parameter(self.model)  # e.g. the last step's update: no loss of this epoch saw it
        if bad is not None:
            raise Diverged(f"non-finite parameter {bad} after epoch {self.epoch + 1}")
        self.train_time_s += seconds
        self.epoch += 1

        validation_start = time.perf_counter()
        val = self.evaluate(self.corpus.validation)
        if val["acc"] > self.best_val_acc + cfg.min_delta:
            self.best_val_acc, self.best_epoch, self.bad_epochs = val["acc"], self.epoch, 0
            self.best_state = copy.deepcopy(self.model.state_dict())
        else:
            self.bad_epochs += 1
        metrics = {R.EPOCH: self.epoch, R.TRAIN_LOSS: train_loss, R.VAL_LOSS: val["loss"],
                   R.VAL_ACC: val["acc"], R.TRAIN_SAMPLES_PER_S: self.epoch_samples / seconds,
                   R.TRAIN_TOKENS_PER_S: self.epoch_tokens / seconds,
                   R.EPOCH_S: seconds + time.perf_counter() - validation_start,
                   **memory_peaks(self.device), R.WALL_S: self.wall_s}
        self.history.append(metrics)
        return metrics

    # --- evaluation ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, split: EncodedSplit) -> dict[str, Any]:
        """Loss, accuracy and the predictions (in the split's order) of the current weights. Losses and
        predictions stay on the device until the split is done: one transfer, not one per batch."""
        self.model.eval()
        preds = np.empty(len(split), dtype=np.int64)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        pred_parts, index_parts = [], []
        for batch in self.batches(split, shuffle=False):
            with self.autocast():
                logits = self.model(batch.tokens)  # (B, C)
            loss_sum += F.cross_entropy(logits.float(), batch.labels, reduction="sum").double()
            pred_parts.append(logits.argmax(-1))
            index_parts.append(batch.index)
        if pred_parts:
            preds[torch.cat(index_parts).cpu().numpy()] = torch.cat(pred_parts).cpu().numpy()
        n = max(len(split), 1)
        return {"loss": loss_sum.item() / n, "acc": float(np.mean(preds == split.labels)) if len(split) else 0.0,
                "preds": preds}

    def measure_latency(self, split: EncodedSplit) -> dict[str, float]:
        """The trial's latency by its config's method (`TrainConfig.latency`), as metrics of its record:
        `lat_ms_mean` / `lat_ms_std` in milliseconds per sample, and for a synthetic batch the milliseconds per
        batch the AG News / IMDB notebook printed.

        - test_passes: `timing_repeats` full passes over `split` after `timing_warmup` (the ArXiv code's).
        - synthetic_batch: one batch of batch_size x max_len random token ids, every position a token (the AG News /
          IMDB notebook's); per sample = per batch / batch size.
        - test_sample: at most `LATENCY_SAMPLE_BATCHES` of `split`'s evaluation batches, spread evenly over their
          length order, so that the sample's lengths are the split's (its batches are sorted by length).
        """
        method = self.train_cfg.latency
        if method == "synthetic_batch":
            return self.synthetic_latency()
        batches = list(self.batches(split, shuffle=False))
        if method == "test_sample":
            batches = [batches[i] for i in latency_sample(len(batches))]
        mean, std = self.forward_latency(batches)
        return {R.LAT_MS_MEAN: mean, R.LAT_MS_STD: std}

    def synthetic_latency(self) -> dict[str, float]:
        """Latency over one synthetic batch (`synthetic_batch`), per sample and per batch."""
        cfg = self.train_cfg
        mean, std = self.forward_latency([self.synthetic_batch()])  # per sample
        return {R.LAT_MS_MEAN: mean, R.LAT_MS_STD: std, R.LAT_MS_PER_BATCH: mean * cfg.batch_size,
                R.LAT_MS_PER_BATCH_STD: std * cfg.batch_size}

    def synthetic_batch(self) -> Batch:
        """The synthetic latency's batch: (batch_size, max_len) ids drawn from 1 .. vocab - 1 (0 pads, and would
        shorten the documents), from a generator of its own so that the trial's random state is left as it was."""
        cfg = self.train_cfg
        generator = torch.Generator().manual_seed(cfg.seed)
        tokens = torch.randint(1, max(self.corpus.vocab_size, 2), (cfg.batch_size, self.corpus.max_len),
                               generator=generator)  # (B, T)
        return Batch(tokens=tokens.to(self.device), labels=torch.zeros(cfg.batch_size, dtype=torch.int64),
                     index=torch.arange(cfg.batch_size))

    @torch.no_grad()
    def forward_latency(self, batches: Sequence[Batch]) -> tuple[float, float]:
        """(mean, std) milliseconds per sample of eval-mode forward passes over `batches`: `timing_repeats` timed
        passes after `timing_warmup` untimed ones. On a GPU the device is synchronised around each pass, and only
        there: the clock must not stop before the GPU has finished, and nothing inside a pass waits for it."""
        cfg, sync = self.train_cfg, self.device.type == "cuda"
        n = max(sum(len(b.labels) for b in batches), 1)
        self.model.eval()
        times = []
        for rep in range(cfg.timing_warmup + cfg.timing_repeats):
            if sync:
                torch.cuda.synchronize(self.device)
            start = time.perf_counter()
            with self.autocast():
                for batch in batches:
                    self.model(batch.tokens)
            if sync:
                torch.cuda.synchronize(self.device)
            if rep >= cfg.timing_warmup:
                times.append((time.perf_counter() - start) * 1000.0 / n)
        return float(np.mean(times)), float(statistics.pstdev(times))

    def final_record(self, length_edges: tuple[int, ...]) -> dict[str, Any]:
        """Restore the best checkpoint, test it, time it: the trial's record (status ok)."""
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        val = self.evaluate(self.corpus.validation)
        test = self.evaluate(self.corpus.test)
        latency = self.measure_latency(self.corpus.test)
        rec = {**self.identity(), R.STATUS: R.STATUS_OK, R.ERROR: "",
               R.BEST_VAL_ACC: self.best_val_acc, R.BEST_EPOCH: self.best_epoch, R.VAL_ACC: val["acc"],
               R.TEST_ACC: test["acc"], R.TEST_MACRO_F1: macro_f1(self.corpus.test.labels, test["preds"]),
               **latency, R.TRAIN_TIME_S: self.train_time_s,
               R.EPOCHS_RUN: self.epoch}
        rec.update(length_bucket_accuracy(self.corpus.test, test["preds"], length_edges))
        return {**rec, **self.clock()}

    def identity(self) -> dict[str, Any]:
        return {R.DATASET: self.corpus.name, R.PE_TYPE: self.model_cfg.pe_type, R.FUSION: self.model_cfg.fusion,
                R.SEED: self.train_cfg.seed, R.PARAMS: sum(p.numel() for p in self.model.parameters())}

    def failure_record(self, status: str, error: str) -> dict[str, Any]:
        """What a diverged (or otherwise stopped) trial reports: identity, progress and the reason."""
        return {**self.identity(), R.STATUS: status, R.ERROR: error, R.EPOCHS_RUN: self.epoch,
                R.BEST_EPOCH: self.best_epoch, R.TRAIN_TIME_S: self.train_time_s,
                R.BEST_VAL_ACC: self.best_val_acc if self.best_epoch else float("nan"), **self.clock()}

    def clock(self) -> dict[str, float]:
        """The trial's clock as it ends: its wall seconds over all its processes, its first start and now."""
        return {R.WALL_S: self.wall_s, R.STARTED_AT: self.started_at, R.ENDED_AT: time.time()}

    def best_model_config(self) -> dict[str, Any]:
        """What rebuilds the saved model: the model config plus vocabulary and class counts."""
        return {**flat_config(self.model_cfg, self.train_cfg), "vocab_size": self.corpus.vocab_size,
                "num_classes": self.corpus.num_classes}


def length_bucket_accuracy(split: EncodedSplit, preds: np.ndarray, edges: tuple[int, ...]) -> dict[str, float]:
    """Test accuracy and document count per bucket of length before truncation; empty buckets get no accuracy."""
    buckets = length_bucket_of(split.raw_lengths, edges)
    out: dict[str, float] = {}
    for b, label in enumerate(R.length_bucket_labels(edges)):
        sel = buckets == b
        out[R.LENGTH_COUNT_PREFIX + label] = int(sel.sum())
        if sel.any():
            out[R.length_metric(label)] = float(np.mean(preds[sel] == split.labels[sel]))
    return out


def train_and_evaluate(model_cfg: ModelConfig, train_cfg: TrainConfig, corpus: EncodedCorpus, *,
                       length_edges: tuple[int, ...], on_epoch: Callable[[dict, Trainer], None] | None = None,
                       trainer: Trainer | None = None) -> dict[str, Any]:
    """Run a whole trial (or the rest of a restored one) and return its record.

    A non-finite loss stops training and returns a record with status 'diverged' and the reason; it never raises.
    """
    trainer = trainer or Trainer(model_cfg, train_cfg, corpus)
    while not trainer.finished:
        try:
            metrics = trainer.train_epoch()
        except Diverged as exc:
            return trainer.failure_record(R.STATUS_DIVERGED, str(exc))
        if on_epoch is not None:
            on_epoch(metrics, trainer)
    return trainer.final_record(length_edges)
