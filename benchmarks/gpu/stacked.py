"""The GPU benchmark's `stacked` lines: the seeds of a cell trained together as one stacked model in one process
(`pefusion.fusion.stacked`), against one trial of the same model on the same card.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

from benchmarks.gpu.trial import (build, describe, peak_memory_mib, release, reset_peak_memory, run_steps,
                                  synchronize, warm_up)
from benchmarks.gpu.workload import Plan
from benchmarks.timing import timed
from pefusion.data.encoded import EncodedCorpus
from pefusion.fusion.stacked import StackedTrainer


def measure_stacked(plan: Plan, model: str, precision: str, seeds: int, corpus: EncodedCorpus) -> dict[str, Any]:
    """One `stacked` line: one trial of the model (fusion add), then `seeds` seeds of it trained together as one
    stacked model (`pefusion.fusion.stacked`, each seed its own data order), each after warm-up steps for one
    timed epoch of the corpus: samples/s of the one trial and of the seeds together, their ratio, and the peak
    memory of each; or, where either fails, the error (`error`, and `oom` for running out of memory)."""
    device = torch.device(plan.device)
    trainer = build(plan, model, "add", precision, corpus)
    line = {"bench": "stacked", **describe(plan, model, trainer), "seeds": seeds, "oom": False}
    model_cfg, train_cfg, n = trainer.model_cfg, trainer.train_cfg, len(corpus.train)
    try:
        reset_peak_memory(device)
        warm_up(plan, trainer, "bucketed")
        samples, trial_s, _ = timed(lambda: run_steps(trainer, trainer.batches(corpus.train, shuffle=True)))
        trial_alloc, trial_reserved = peak_memory_mib(device)
        trainer = None
        release(device)
        reset_peak_memory(device)
        stacked = StackedTrainer(model_cfg, train_cfg, corpus, list(range(plan.seed, plan.seed + seeds)), device)

        def epoch(steps: int | None) -> int:
            for _ in itertools.islice(stacked.train_steps(), steps):
                pass
            synchronize(device)
            return seeds * n

        epoch(plan.warmup)
        stacked_samples, stacked_s, _ = timed(lambda: epoch(None))
        alloc, reserved = peak_memory_mib(device)
    except torch.OutOfMemoryError as exc:
        line.update(oom=True, error=str(exc).splitlines()[0])
        return line
    except Exception as exc:  # the line says why, and the benchmark's other lines still run
        line.update(error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return line
    finally:
        trainer = stacked = None
        release(device)
    line.update(trial_samples_per_s=samples / trial_s, samples_per_s=stacked_samples / stacked_s,
                speedup=(stacked_samples / stacked_s) / (samples / trial_s),
                trial_peak_mem_alloc_mib=trial_alloc, trial_peak_mem_reserved_mib=trial_reserved,
                peak_mem_alloc_mib=alloc, peak_mem_reserved_mib=reserved)
    return line
