"""Where a PE-fusion trial trains and how it uses the device: the device, the precision `auto` resolves to, the
attention kernels SDPA may pick, the multiple batch widths are rounded up to; and what the trial reports about
itself (`Placement.info`), since the driver cannot know any of it: `auto` resolves on the trial's own device.

Every choice is a pure function of the device's kind and what it supports, so each is tested on a CPU with made-up
devices; `place` makes them for one process and applies them there (`configure`). On a CPU nothing changes: fp32,
unpadded batches, PyTorch's kernels plus pefusion's CPU dropout kernel, as the CPU numbers were always computed.

Why these choices on a GPU (the measurements, from `scripts/bench_gpu.py`, are in README's GPU section):
- bf16 autocast by default: fp32 matrix products run without TF32 (PyTorch's "highest"), and fp32 attention can
  only use the memory-efficient kernel; the paper's models trained several times faster in bf16.
- Batch widths rounded up to a multiple of 64: length-bucketed batches have hundreds of distinct widths, and a
  kernel planned per shape is planned again for every one of them, in every trial process.
- cuDNN's attention off: it builds an execution graph per (batch, length) shape, so every new length paid for a
  plan; the efficient kernel runs as fast on seen lengths and plans nothing.
  Flash attention takes no mask, and the model always passes its key-padding mask, so `efficient` is what runs.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pefusion import record as R

PAD_MULTIPLE_CUDA = 64  # batch widths on a GPU: max_len / 64 shapes at most (8 for IMDB's 512, 64 for 4 096)


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


def attention_policy(device_type: str) -> AttentionPolicy:
    """CUDA: cuDNN's attention off (it plans per shape; see the module docstring), so PyTorch picks among flash,
    memory-efficient and math. A CPU: PyTorch's own choice, and pefusion's chunked kernel for attention dropout
    in training (`pefusion.fusion.attention`)."""
    if device_type == "cuda":
        return AttentionPolicy("flash, efficient, math (cuDNN off: it plans per batch shape)", cudnn=False)
    return AttentionPolicy("PyTorch's CPU kernels; pefusion's chunked kernel for attention dropout", cudnn=True)


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


def place(device: torch.device, precision: str, pad_multiple: int) -> Placement:
    """Resolve the requested precision and pad multiple on `device`, choose its attention policy, and apply them
    to this process."""
    placement = Placement(device, resolve_precision(precision, device.type, bf16_supported(device)),
                          resolve_pad_multiple(pad_multiple, device.type), attention_policy(device.type))
    configure(device, placement.precision, placement.attention)
    return placement
