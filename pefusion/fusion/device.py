"""Where a PE-fusion trial trains and how it uses the device: the device, the precision `auto` resolves to, the
attention kernels SDPA may pick, the multiple batch widths are rounded up to; and what the trial reports about
itself (`Placement.info`), since the driver cannot know any of it: `auto` resolves on the trial's own device.

Every choice is a pure function of the device's kind, what it supports and the batch widths, so each is tested on a CPU with made-up
devices; `place` makes them for one process and applies them there (`configure`). On a CPU nothing changes: fp32,
unpadded batches, PyTorch's kernels plus pefusion's CPU dropout kernel, as the CPU numbers were always computed.

Why these choices on a GPU (docs/gpus.md; the measurements, from `scripts/bench_gpu.py`, in docs/benchmarks.md):
- bf16 autocast by default: fp32 matrix products run without TF32 (PyTorch's "highest"), and fp32 attention can
  only use the memory-efficient kernel; the paper's models trained several times faster in bf16.
- Batch widths rounded up to a multiple of 64: length-bucketed batches have hundreds of distinct widths, and a
  kernel planned per shape is planned again for every one of them, in every trial process.
- cuDNN's attention where the batch widths are few: it builds an execution graph per (batch, width) shape, so
  each new width pays for a plan, but on long sequences a planned step runs several times faster than with the
  memory-efficient kernel. With widths rounded up to a multiple of at least 64 and at most 64 of them, the plans are
  paid once, in the first epoch (batching keeps every later epoch on the first one's shapes); with more widths
  (unpadded batches, a small multiple) cuDNN stays off and the efficient kernel, which plans nothing, runs.
  Flash attention takes no mask, and the model always passes its key-padding mask, so flash never runs.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pefusion import record as R

PAD_MULTIPLE_CUDA = 64  # batch widths on a GPU: max_len / 64 shapes at most (8 for IMDB's 512, 64 for 4 096)
# cuDNN's attention is allowed when widths are rounded up to at least this multiple and number at most
# MAX_CUDNN_WIDTHS: the arxiv preset's 4 096 / 64 widths, each planned once (README, GPUs).
MIN_CUDNN_MULTIPLE = 64
MAX_CUDNN_WIDTHS = 64


def select_device(preference: str = "auto") -> torch.device:
    """'auto' takes the GPU Ray (or the user) made visible, else the CPU."""
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if preference == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was requested but no CUDA device is visible")
    return torch.device(preference)


def resolve_precision(requested: str, device_type: str, bf16_supported: bool) -> str:
    """The precision a trial runs at. `auto`: bf16 autocast on a CUDA device that supports bf16, fp32 elsewhere;
    `tf32`: fp32 with TF32 matrix products and convolutions on CUDA, plain fp32 on a CPU (which has no TF32);
    `fp32` (exact) and `bf16` as asked."""
    if requested == "auto":
        return "bf16" if device_type == "cuda" and bf16_supported else "fp32"
    if requested == "tf32" and device_type != "cuda":
        return "fp32"
    return requested


def resolve_pad_multiple(requested: int, device_type: str) -> int:
    """The multiple batch widths are rounded up to: `requested`, or for 0 (the default) 64 on CUDA and 1 on a CPU
    (where a wider batch only costs time, and unpadded batches keep the CPU results as they were)."""
    if requested:
        return requested
    return PAD_MULTIPLE_CUDA if device_type == "cuda" else 1


@dataclass(frozen=True)
class AttentionPolicy:
    """Which scaled-dot-product-attention kernels a process lets PyTorch pick."""

    name: str  # as recorded on the trial's run
    cudnn: bool  # whether cuDNN's attention kernel may run


def width_count(pad_multiple: int, max_len: int) -> int:
    """How many distinct batch widths a trial can have: widths are rounded up to `pad_multiple`, never past
    `max_len` (`pefusion.data.batching.batch_width`)."""
    return -(-max_len // pad_multiple)


def attention_policy(device_type: str, pad_multiple: int, max_len: int) -> AttentionPolicy:
    """CUDA with few batch widths (rounded up to a multiple >= MIN_CUDNN_MULTIPLE, at most MAX_CUDNN_WIDTHS of
    them up to `max_len`): every kernel allowed, cuDNN's attention first, each width planned once. CUDA with more
    widths: cuDNN's attention off (it would plan again on every new width), so PyTorch picks among flash,
    memory-efficient and math. A CPU: PyTorch's own choice, and pefusion's chunked kernel for attention dropout in
    training (`pefusion.fusion.attention`)."""
    if device_type != "cuda":
        return AttentionPolicy("PyTorch's CPU kernels; pefusion's chunked kernel for attention dropout", cudnn=True)
    widths = width_count(pad_multiple, max_len)
    if pad_multiple >= MIN_CUDNN_MULTIPLE and widths <= MAX_CUDNN_WIDTHS:
        return AttentionPolicy(f"cudnn, flash, efficient, math (cuDNN on: {widths} widths of {pad_multiple}, "
                               f"each planned once)", cudnn=True)
    return AttentionPolicy(f"flash, efficient, math (cuDNN off: {widths} widths of {pad_multiple} would each be "
                           f"planned)", cudnn=False)


def configure(device: torch.device, precision: str, policy: AttentionPolicy) -> None:
    """Apply `precision`'s TF32 setting and `policy` to this process, on CUDA only: a CPU process is left as it is.

    Process-wide flags, set for every trial: Ray Tune reuses a trial's process for the next trial, which may ask
    for another precision."""
    if device.type != "cuda":
        return
    tf32 = "tf32" if precision == "tf32" else "ieee"  # ieee: fp32 stays exact outside bf16 autocast
    torch.backends.cuda.matmul.fp32_precision = tf32
    torch.backends.cudnn.conv.fp32_precision = tf32
    torch.backends.cuda.enable_cudnn_sdp(policy.cudnn)


def bf16_supported(device: torch.device) -> bool:
    """Whether `device` runs bf16 natively (emulated bf16 on an older GPU is slower than fp32)."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)


def device_name(device: torch.device) -> str:
    """The card's name, or the CPU's model name where Linux says it (else the architecture)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class Placement:
    """What one trial's process decided about its device (`place`)."""

    device: torch.device
    precision: str  # resolved: fp32, tf32 or bf16
    pad_multiple: int  # resolved: >= 1
    attention: AttentionPolicy

    def info(self) -> dict[str, Any]:
        """What the trial reports about itself (`record.TRIAL_INFO`): each a param of its run, a results column."""
        return {R.DEVICE: str(self.device), R.DEVICE_NAME: device_name(self.device), R.PRECISION: self.precision,
                R.PAD_MULTIPLE: self.pad_multiple, R.ATTENTION: self.attention.name}


def place(device: torch.device, precision: str, pad_multiple: int, max_len: int) -> Placement:
    """Resolve the requested precision and pad multiple on `device`, choose its attention policy for batches at
    most `max_len` wide, and apply them to this process."""
    multiple = resolve_pad_multiple(pad_multiple, device.type)
    placement = Placement(device, resolve_precision(precision, device.type, bf16_supported(device)), multiple,
                          attention_policy(device.type, multiple, max_len))
    configure(device, placement.precision, placement.attention)
    return placement
