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
- cuDNN's attention proven first: some cuDNN builds return NaN gradients for a masked attention whose key length
  is 64 (mod 128) when a query row's log-sum-exp is very negative (an ALiBi bias across long padding makes such
  rows; they are padding, but NaN times 0 is NaN in the weights). Before a process lets cuDNN's attention run it
  runs that case with cuDNN's kernel and with the memory-efficient one (`cudnn_self_test`), and where cuDNN's
  gradients are non-finite or disagree it keeps cuDNN off, saying why in the trial's `attention` param.
"""
from __future__ import annotations

import functools
import platform
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from pefusion import record as R

PAD_MULTIPLE_CUDA = 64  # batch widths on a GPU: max_len / 64 shapes at most (8 for IMDB's 512, 64 for 4 096)
# cuDNN's attention is allowed when widths are rounded up to at least this multiple and number at most
# MAX_CUDNN_WIDTHS: the arxiv preset's 4 096 / 64 widths, each planned once (README, GPUs).
MIN_CUDNN_MULTIPLE = 64
MAX_CUDNN_WIDTHS = 64
# The self-test of cuDNN's attention: the failing case's key length (≡ 64 mod 128) and a bias slope that drives
# the padding rows' log-sum-exp far below float32's exp range (about −88.7)
SELF_TEST_SHAPE = (2, 2, 192, 64)  # (B, H, T, hd)
SELF_TEST_REAL, SELF_TEST_SLOPE = 16, 1.0  # real keys of document 0 (the rest padding); −slope·|i − j|
SELF_TEST_TOLERANCE = 0.05  # of the reference gradient's largest magnitude: bf16 rounding is ~1e-2 of it
# The attention kernel behind each op name a profile shows (torch.profiler's event names).
KERNEL_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "_ChunkedDropoutAttention": "chunked",  # pefusion.fusion.attention's autograd Function
}


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


def self_test_inputs(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """q, k, v (B, H, T, hd), a float mask (B, H, T, T) and an upstream gradient (B, H, T, hd) for the self-test:
    T ≡ 64 (mod 128); document 0 has SELF_TEST_REAL real keys and T − SELF_TEST_REAL of padding (−inf), with an
    ALiBi-like bias −SELF_TEST_SLOPE·|i − j|, so its last rows' log-sum-exp is about −(T − SELF_TEST_REAL);
    document 1 has no padding. Drawn from a generator of its own: the trial's random stream is untouched."""
    B, H, T, hd = SELF_TEST_SHAPE
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(B, H, T, hd, generator=gen) for _ in range(4))
    pos = torch.arange(T)
    mask = (-SELF_TEST_SLOPE * (pos[:, None] - pos[None, :]).abs().float()).expand(B, H, T, T).clone()
    mask[0, :, :, SELF_TEST_REAL:] = float("-inf")
    return tuple(t.to(device, dtype) for t in (q, k, v, mask, grad))


def attention_gradients(inputs: Sequence[torch.Tensor], backend: SDPBackend) -> list[torch.Tensor]:
    """(grad_q, grad_k, grad_v) of SDPA on `self_test_inputs`, with only `backend`'s kernel allowed."""
    q, k, v, mask, grad = (t.clone().requires_grad_(i < 3) for i, t in enumerate(inputs))
    with sdpa_kernel([backend]):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).backward(grad)
    return [q.grad, k.grad, v.grad]


def gradients_disagree(tested: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> str | None:
    """Why the `tested` kernel's (grad_q, grad_k, grad_v) cannot be trusted against the `reference` kernel's, or
    None: a non-finite entry, or a difference beyond SELF_TEST_TOLERANCE of the reference's largest magnitude."""
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), tested, reference):
        got, want = got.float(), want.float()
        bad = int((~torch.isfinite(got)).sum())
        if bad:
            return f"{name} has {bad} non-finite entries"
        error, scale = float((got - want).abs().max()), float(want.abs().max())
        if error > SELF_TEST_TOLERANCE * scale:
            return f"{name} differs from the memory-efficient kernel's by {error:.3g} (largest {scale:.3g})"
    return None


@functools.lru_cache(maxsize=None)
def cudnn_self_test(device: torch.device, dtype: torch.dtype) -> str | None:
    """Run the self-test on `device` (CUDA) in `dtype`, once per process: None when cuDNN's attention gradients
    are finite and agree with the memory-efficient kernel's, else why not (its error, where it cannot run)."""
    inputs = self_test_inputs(device, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SDPA warns of each kernel it cannot use; the error says what matters
        try:
            reference = attention_gradients(inputs, SDPBackend.EFFICIENT_ATTENTION)
        except RuntimeError as exc:
            return f"the memory-efficient kernel did not run ({str(exc).splitlines()[0]})"
        try:
            tested = attention_gradients(inputs, SDPBackend.CUDNN_ATTENTION)
        except RuntimeError:
            return f"cuDNN's attention did not run in {str(dtype).removeprefix('torch.')}"
    return gradients_disagree(tested, reference)


def proven_policy(policy: AttentionPolicy, self_test: Callable[[], str | None]) -> AttentionPolicy:
    """`policy` once cuDNN's attention has proven itself: unchanged where cuDNN is off (no test runs); where the
    self-test finds a fault, cuDNN off and the name says why; else the name adds that it passed."""
    if not policy.cudnn:
        return policy
    fault = self_test()
    if fault is not None:
        return AttentionPolicy(f"flash, efficient, math (cuDNN off by its self-test: {fault})", cudnn=False)
    return replace(policy, name=f"{policy.name[:-1]}; self-test passed)")


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype attention computes in at a resolved precision."""
    return torch.bfloat16 if precision == "bf16" else torch.float32


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
    resolved = resolve_precision(precision, device.type, bf16_supported(device))
    policy = attention_policy(device.type, multiple, max_len)
    if device.type == "cuda":
        policy = proven_policy(policy, lambda: cudnn_self_test(device, compute_dtype(resolved)))
    placement = Placement(device, resolved, multiple, policy)
    configure(device, placement.precision, placement.attention)
    return placement


def attention_kernels(events: Sequence[Any]) -> dict[str, int]:
    """How many attention calls ran on each kernel, from a profile's events (`torch.profiler.profile.events()`)."""
    counts: dict[str, int] = {}
    for event in events:
        kernel = KERNEL_OPS.get(event.name)
        if kernel is not None:
            counts[kernel] = counts.get(kernel, 0) + 1
    return counts
