"""Where a trial trains and how it uses the device (`pefusion.fusion.device`): each choice a function of the device's
kind, tested here on a CPU with made-up devices, and what a CPU process is left with (nothing changed)."""
from __future__ import annotations

import pytest
import torch

from pefusion import record as R
from pefusion.fusion import device as D


@pytest.mark.parametrize("requested,device_type,bf16,resolved", [
    ("auto", "cuda", True, "bf16"), ("auto", "cuda", False, "fp32"), ("auto", "cpu", True, "fp32"),
    ("auto", "cpu", False, "fp32"), ("tf32", "cuda", True, "tf32"), ("tf32", "cpu", False, "fp32"),
    ("fp32", "cuda", True, "fp32"), ("bf16", "cuda", True, "bf16"), ("bf16", "cpu", False, "bf16"),
])
def test_precision_resolves_by_device(requested, device_type, bf16, resolved):
    assert D.resolve_precision(requested, device_type, bf16) == resolved


@pytest.mark.parametrize("requested,device_type,resolved", [(0, "cuda", 64), (0, "cpu", 1), (8, "cuda", 8),
                                                            (8, "cpu", 8), (1, "cuda", 1)])
def test_pad_multiple_resolves_by_device(requested, device_type, resolved):
    assert D.resolve_pad_multiple(requested, device_type) == resolved


@pytest.mark.parametrize("pad_multiple,max_len,cudnn", [
    (64, 4096, True),  # the arxiv preset on a GPU: 64 widths, each planned once
    (64, 512, True),  # agnews_imdb: 8 widths
    (128, 8192, True),  # 64 widths of 128
    (64, 4097, False),  # 65 widths
    (64, 8192, False),  # 128 widths: a plan each would cost more than the first epoch should
    (32, 512, False),  # 16 widths, but a multiple below 64
    (1, 512, False),  # unpadded: a width per length
])
def test_cudnn_attention_on_a_gpu_only_where_widths_are_few(pad_multiple, max_len, cudnn):
    """cuDNN's attention plans per shape: allowed on CUDA where widths are rounded to a multiple >= 64 and number
    <= 64 (ceil(max_len / multiple), counted here by hand), off elsewhere; a CPU keeps PyTorch's choice."""
    policy = D.attention_policy("cuda", pad_multiple, max_len)
    assert policy.cudnn is cudnn and ("cuDNN on" if cudnn else "cuDNN off") in policy.name
    assert D.attention_policy("cpu", pad_multiple, max_len).cudnn


def test_place_on_a_bf16_capable_gpu(monkeypatch):
    """A mocked bf16-capable CUDA device: auto is bf16, batches are rounded to 64, cuDNN attention is on (the arxiv
    preset's 4 096 tokens: 64 widths) and off for a pad multiple of 8, and the choices are applied to the process (`configure`) and reported by the trial (`Placement.info`)."""
    applied = []
    monkeypatch.setattr(D, "bf16_supported", lambda device: True)
    monkeypatch.setattr(D, "configure", lambda device, precision, policy: applied.append((device, precision, policy)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    cuda = torch.device("cuda")
    placement = D.place(cuda, "auto", 0, 4096)
    assert (placement.precision, placement.pad_multiple, placement.attention.cudnn) == ("bf16", 64, True)
    assert not D.place(cuda, "auto", 8, 4096).attention.cudnn
    applied.pop()
    assert applied == [(cuda, "bf16", placement.attention)]
    assert placement.info() == {R.DEVICE: "cuda", R.DEVICE_NAME: "NVIDIA H200", R.PRECISION: "bf16",
                                R.PAD_MULTIPLE: 64, R.ATTENTION: placement.attention.name}


def test_place_on_a_cpu_changes_nothing():
    """auto on a CPU: fp32 and unpadded batches, and no process-wide flag touched."""
    before = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision,
              torch.backends.cuda.cudnn_sdp_enabled())
    placement = D.place(torch.device("cpu"), "auto", 0, 512)
    assert (placement.precision, placement.pad_multiple, placement.attention.cudnn) == ("fp32", 1, True)
    assert placement.info()[R.DEVICE] == "cpu" and placement.info()[R.DEVICE_NAME]
    assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision,
            torch.backends.cuda.cudnn_sdp_enabled()) == before


@pytest.mark.parametrize("precision,tf32", [("tf32", "tf32"), ("fp32", "ieee"), ("bf16", "ieee")])
def test_configure_sets_tf32_and_the_attention_kernels_on_cuda(precision, tf32):
    """The flags a CUDA trial's process gets (set here on a CPU build, where they change nothing), and set again
    for the next trial a reused process runs."""
    flags = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision,
             torch.backends.cuda.cudnn_sdp_enabled())
    try:
        D.configure(torch.device("cuda"), precision, D.attention_policy("cuda", 1, 512))
        assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.conv.fp32_precision == tf32
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = flags[:2]
        torch.backends.cuda.enable_cudnn_sdp(flags[2])
