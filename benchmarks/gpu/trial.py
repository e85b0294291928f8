"""One configuration of the GPU benchmark as a trial runs it: the preset's model, optimiser and training protocol
built at a precision (`build`), its training steps with the GPU synchronised at the end (`run_steps`), the warm-up
steps under the profiler (`warm_up`), the device's peak memory and its release between configurations, and the
fields every line carries about its configuration (`describe`). Every kind of line measures through these, so
that all of them time the same step.
"""
from __future__ import annotations

import dataclasses
import gc
import itertools
from typing import Any, Iterator

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu.workload import Plan, epoch_batches
from pefusion.data.batching import Batch
from pefusion.data.encoded import EncodedCorpus
from pefusion.fusion.device import attention_kernels, device_name
from pefusion.fusion.training import Trainer


def synchronize(device: torch.device) -> None:
    """Wait for the GPU: only around timed regions, so that the clock stops after the work it times."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device: torch.device) -> tuple[float | None, float | None]:
    """(peak allocated, peak reserved) MiB since the last reset; (None, None) on a CPU."""
    if device.type != "cuda":
        return None, None
    return torch.cuda.max_memory_allocated(device) / 2 ** 20, torch.cuda.max_memory_reserved(device) / 2 ** 20


def freeze_heap() -> None:
    """Exempt the imported modules' objects (torch's ~10^6) from later garbage collections: `release` then
    takes milliseconds instead of most of a second."""
    gc.collect()
    gc.freeze()


def release(device: torch.device) -> None:
    """Free a finished configuration's memory, so that the next one (or another process) starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_steps(trainer: Trainer, batches: Iterator[Batch]) -> int:
    """Training steps on `batches` (host batch preparation included, as in training); returns the samples. Ends
    with the GPU synchronised, so that a clock around it counts the GPU's work."""
    trainer.model.train()
    n = 0
    for batch in batches:
        trainer.step(batch)
        n += len(batch.labels)
    synchronize(trainer.device)
    return n


def build(plan: Plan, model: str, fusion: str, precision: str, corpus: EncodedCorpus) -> Trainer:
    """The preset's model with `fusion`, its optimiser, and the training protocol at `precision`."""
    preset = plan.preset(model)
    model_cfg = dataclasses.replace(preset.model, fusion=fusion)
    train_cfg = dataclasses.replace(preset.train, precision=precision, seed=plan.seed, device=plan.device,
                                    batch_size=plan.batch_size(model), timing_repeats=plan.latency_repeats,
                                    timing_warmup=1)
    return Trainer(model_cfg, train_cfg, corpus, device=torch.device(plan.device))


def describe(plan: Plan, model: str, trainer: Trainer) -> dict[str, Any]:
    """The fields every line of a configuration carries."""
    device, cfg, placement = trainer.device, trainer.model_cfg, trainer.placement
    return {"model": model, "pe_type": cfg.pe_type, "fusion": cfg.fusion, "precision": trainer.train_cfg.precision,
            "precision_resolved": placement.precision, "pad_multiple": placement.pad_multiple,
            "attention_policy": placement.attention.name, "device": device.type, "device_name": device_name(device),
            "torch": torch.__version__, "d_model": cfg.d_model, "num_layers": cfg.num_layers, "max_len": cfg.max_len,
            "batch_size": trainer.train_cfg.batch_size, "params": sum(p.numel() for p in trainer.model.parameters()),
            "steps": plan.steps, "warmup": plan.warmup,
            "fp32_matmul_precision": torch.backends.cuda.matmul.fp32_precision}


def warm_up(plan: Plan, trainer: Trainer, batching: str) -> dict[str, int]:
    """`plan.warmup` untimed training steps (epoch 0's first batches, cycled), under the profiler: the attention
    kernels they ran."""
    split, cfg = trainer.corpus.train, trainer.train_cfg
    batches = list(itertools.islice(epoch_batches(split, cfg.batch_size, batching, train=True, seed=plan.seed,
                                                  epoch=0, max_len=trainer.model_cfg.max_len, device=trainer.device,
                                                  pad_multiple=trainer.placement.pad_multiple), plan.warmup))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_steps(trainer, (batches[i % len(batches)] for i in range(plan.warmup)))
    return attention_kernels(prof.events())
