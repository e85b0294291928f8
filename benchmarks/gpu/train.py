"""The GPU benchmark's `train` lines: per model, fusion, precision, batching and attention kernels, the first epoch
as a trial's first epoch runs, then the steady state (samples and tokens per second, ms per step), padding, peak
memory, which attention kernel ran and which SDPA kernels accept the model's call, and the eval-mode latency.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu.trial import build, describe, peak_memory_mib, release, reset_peak_memory, run_steps, warm_up
from benchmarks.gpu.workload import Plan, batch_indices, epoch_batches, padding
from benchmarks.timing import timed
from pefusion.data.batching import Batch
from pefusion.data.encoded import EncodedCorpus
from pefusion.fusion.device import attention_kernels
from pefusion.fusion.training import Trainer

ATTENTIONS = ("policy", "efficient")  # a train line's kernels: the trial's policy, or cuDNN's attention off

SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def _reason(caught: list[warnings.WarningMessage], exc: Exception) -> str:
    """PyTorch's reasons for refusing a forced kernel: its warnings (without the C++ source location), then the
    error."""
    lines = [str(w.message).split(" (Triggered internally")[0].strip() for w in caught]
    return "; ".join(dict.fromkeys(lines + [str(exc).splitlines()[0]]))[:400]


@torch.no_grad()
def sdpa_backends(trainer: Trainer, batch: Batch) -> tuple[list[str], dict[str, str]]:
    """The SDPA kernels that accept the model's attention call (one eval-mode forward of `batch` with only that
    kernel allowed), and PyTorch's reason for each one refused. Eval mode, because on a CPU training runs
    dropout through pefusion's own kernel and never asks SDPA; the mask and the dtype decide either way."""
    trainer.model.eval()
    ok, refused = [], {}
    for name, backend in SDPA_BACKENDS.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([backend]), trainer.autocast():
                    trainer.model(batch.tokens)
                ok.append(name)
            except RuntimeError as exc:
                refused[name] = _reason(caught, exc)
    return ok, refused



def measure_train(plan: Plan, model: str, fusion: str, precision: str, batching: str, attention: str,
                  corpus: EncodedCorpus) -> dict[str, Any]:
    """One `train` line: the first epoch, warm-up, one timed steady epoch, memory, kernels, latency (see the module
    docstring). `attention`: the trial's policy, or `efficient` (cuDNN's attention off, the policy before it was
    allowed where widths are few), to compare the two in one run."""
    device = torch.device(plan.device)
    trainer = build(plan, model, fusion, precision, corpus)
    if attention == "efficient" and device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)  # until the next configuration's trainer sets its policy
    split, cfg, max_len = corpus.train, trainer.train_cfg, trainer.model_cfg.max_len
    multiple = trainer.placement.pad_multiple
    line = {"bench": "train", **describe(plan, model, trainer), "batching": batching, "attention": attention}
    pad_share, unpadded = padding(split, batch_indices(split, cfg.batch_size, batching, train=True, seed=plan.seed,
                                                       epoch=1, pad_multiple=multiple, max_len=max_len),
                                  batching, max_len, multiple)
    line.update(padding_fraction=pad_share, unpadded_batch_fraction=unpadded, oom=False)
    oom = ""

    def epoch(number: int) -> int:
        return run_steps(trainer, epoch_batches(split, cfg.batch_size, batching, train=True, seed=plan.seed,
                                                epoch=number, max_len=max_len, device=device, pad_multiple=multiple))

    try:
        reset_peak_memory(device)
        _, first_s, _ = timed(lambda: epoch(0))  # every shape new: plans, the CUDA context, cuBLAS's handles
        kernels = warm_up(plan, trainer, batching)
        samples, wall, _ = timed(lambda: epoch(1))
        alloc, reserved = peak_memory_mib(device)
        eval_batches = list(epoch_batches(split, cfg.batch_size, batching, train=False, seed=plan.seed, epoch=0,
                                          max_len=max_len, device=device, pad_multiple=multiple))
        ok, refused = sdpa_backends(trainer, eval_batches[0])
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof, trainer.autocast():
            trainer.model(eval_batches[0].tokens)
        lat_mean, lat_std = trainer.forward_latency(eval_batches)
    except torch.OutOfMemoryError as exc:
        oom = str(exc).splitlines()[0]
    trainer = None  # the model, its optimiser state and gradients go before the next configuration
    release(device)
    if oom:
        return {**line, "oom": True, "error": oom}
    mean_tokens = float(split.lengths.mean())
    line.update(first_epoch_s=first_s, first_epoch_samples_per_s=samples / first_s,
                first_over_steady=first_s / wall, samples=samples, train_s=wall, train_samples_per_s=samples / wall,
                train_tokens_per_s=samples * mean_tokens / wall, train_ms_per_step=1000.0 * wall / plan.steps,
                peak_mem_alloc_mib=alloc, peak_mem_reserved_mib=reserved, attention_kernels=kernels,
                sdpa_backends_ok=ok, sdpa_backends_refused=refused, latency_ms_per_sample=lat_mean,
                latency_ms_std=lat_std, latency_attention_kernels=attention_kernels(prof.events()))
    return line
