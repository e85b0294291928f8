"""The GPU benchmark's `shapes` lines: a training step on lengths never seen against one on lengths seen, what a
kernel planned per shape costs the first time; a trial's way (widths rounded up to its pad multiple, its attention
policy) against the naive way in the same run.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from benchmarks.gpu.trial import build, describe, release, run_steps
from benchmarks.gpu.workload import Plan
from benchmarks.timing import timed
from pefusion.data.batching import Batch, batch_width, to_device
from pefusion.data.encoded import EncodedCorpus

# `pefusion`: what a trial does (widths rounded up to its pad multiple, its attention policy: cuDNN's attention where
# the widths are few); `pytorch`: the naive way, every width as the lengths come, under PyTorch's own kernel order (on Hopper
# since torch 2.11, cuDNN's attention first, which builds an execution graph per new shape).
SHAPE_VARIANTS = ("pefusion", "pytorch")


def shape_lengths(max_len: int, n: int) -> list[int]:
    """`n` distinct document lengths spread over [max_len/5, 4·max_len/5): for max_len 512 and n 60, 102..404."""
    lo, hi = max_len // 5, 4 * max_len // 5
    return sorted({lo + (hi - lo) * i // n for i in range(n)})


def measure_shapes(plan: Plan, model: str, precision: str, variant: str, n: int,
                   corpus: EncodedCorpus) -> dict[str, Any]:
    """One `shapes` line: after warm-up steps at max_len, `n` training steps whose batches have `n` distinct
    lengths (every document of a batch that long), then the same `n` again: ms per step of each pass. A kernel
    planned per shape is paid on the first pass only."""
    trainer = build(plan, model, "add", precision, corpus)
    device, max_len = trainer.device, trainer.model_cfg.max_len
    multiple = trainer.placement.pad_multiple if variant == "pefusion" else 1
    if variant == "pytorch" and device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(True)  # PyTorch's default, which the trial's policy may turn off
    rng = np.random.default_rng(plan.seed)
    batch_size, vocab = plan.batch_size(model), corpus.vocab_size

    def batch(length: int) -> Batch:
        tokens = np.zeros((batch_size, batch_width(length, multiple, max_len)), dtype=np.int64)
        tokens[:, :length] = rng.integers(2, vocab, (batch_size, length))
        labels = rng.integers(0, corpus.num_classes, batch_size)
        return Batch(*(to_device(torch.from_numpy(a), device) for a in (tokens, labels, np.arange(batch_size))))

    lengths = shape_lengths(max_len, n)
    trainer.model.train()
    line = {"bench": "shapes", **describe(plan, model, trainer), "variant": variant, "lengths": len(lengths),
            "widths": len({batch_width(t, multiple, max_len) for t in lengths}), "oom": False}
    try:
        run_steps(trainer, (batch(max_len) for _ in range(plan.warmup)))  # the CUDA context, cuBLAS's handles
        passes = [timed(lambda: run_steps(trainer, (batch(t) for t in lengths)))[1] for _ in ("new", "seen")]
    except torch.OutOfMemoryError as exc:
        line.update(oom=True, error=str(exc).splitlines()[0])
        passes = []
    trainer = None
    release(device)
    if passes:
        new, seen = (1000.0 * s / len(lengths) for s in passes)
        line.update(new_ms_per_step=new, seen_ms_per_step=seen, new_over_seen=new / seen)
    return line
