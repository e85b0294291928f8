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
    tested = []
    monkeypatch.setattr(D, "cudnn_self_test", lambda device, dtype: tested.append(dtype))  # passes: None
    cuda = torch.device("cuda")
    placement = D.place(cuda, "auto", 0, 4096)
    assert (placement.precision, placement.pad_multiple, placement.attention.cudnn) == ("bf16", 64, True)
    assert tested == [torch.bfloat16] and placement.attention.name.endswith("; self-test passed)")
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


def test_cudnn_attention_runs_only_after_its_self_test_passes():
    """The fallback: where the policy allows cuDNN, a self-test that finds a fault turns cuDNN off and the recorded
    name says why; one that passes keeps it on; where cuDNN is off anyway, no test runs."""
    on, off = D.attention_policy("cuda", 64, 512), D.attention_policy("cuda", 1, 512)
    failed = D.proven_policy(on, lambda: "grad_q has 12 non-finite entries")
    assert not failed.cudnn
    assert failed.name == "flash, efficient, math (cuDNN off by its self-test: grad_q has 12 non-finite entries)"
    passed = D.proven_policy(on, lambda: None)
    assert passed.cudnn and passed.name == "cudnn, flash, efficient, math (cuDNN on: 8 widths of 64, each planned " \
                                           "once; self-test passed)"

    def never():
        raise AssertionError("the self-test ran where cuDNN is off")

    assert D.proven_policy(off, never) == off


def test_the_self_test_compares_each_gradient_with_the_memory_efficient_kernels():
    """NaN or infinite entries, or a difference beyond 5 % of the reference's largest magnitude, in any of
    grad_q, grad_k, grad_v: a fault naming the gradient; bf16-sized rounding: none."""
    gen = torch.Generator().manual_seed(0)
    reference = [torch.randn(2, 2, 192, 64, generator=gen) for _ in range(3)]
    assert D.gradients_disagree([g.bfloat16() for g in reference], reference) is None
    nan_q = [reference[0].clone(), *reference[1:]]
    nan_q[0][0, 0, 100] = float("nan")
    assert D.gradients_disagree(nan_q, reference) == "grad_q has 64 non-finite entries"
    wrong_v = [*reference[:2], reference[2] * 1.2]
    assert D.gradients_disagree(wrong_v, reference).startswith("grad_v differs from the memory-efficient kernel's")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_self_tests_inputs_are_the_failing_case(dtype):
    """What the self-test runs on a card: a key length ≡ 64 (mod 128), padding masked with -inf, and query rows
    whose log-sum-exp (computed here in float64 from the inputs) lies below float32's exp range (about -88.7), in
    the trial's dtype; the same inputs every time, and the process's random stream untouched."""
    torch.manual_seed(5)
    before = torch.get_rng_state()
    q, k, v, mask, grad = D.self_test_inputs(torch.device("cpu"), dtype)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(t.dtype == dtype for t in (q, k, v, mask, grad))
    B, H, T, hd = q.shape
    assert T % 128 == 64 and mask.shape == (B, H, T, T) and torch.isneginf(mask).any()
    lse = torch.logsumexp(q.double() @ k.double().transpose(-1, -2) / hd ** 0.5 + mask.double(), dim=-1)
    assert (lse < -88.7).sum() > 10 and torch.isfinite(lse).all()
    assert torch.equal(D.self_test_inputs(torch.device("cpu"), dtype)[0], q)


def test_the_self_tests_gradients_from_two_kernels_agree_on_a_cpu():
    """`attention_gradients` with one kernel allowed, on the self-test's inputs, here with the CPU's two kernels
    (a card runs cuDNN's and the memory-efficient one): finite, and agreeing within the self-test's tolerance."""
    from torch.nn.attention import SDPBackend

    inputs = D.self_test_inputs(torch.device("cpu"), torch.float32)
    math_grads = D.attention_gradients(inputs, SDPBackend.MATH)
    assert all(torch.isfinite(g).all() for g in math_grads)
    assert D.gradients_disagree(D.attention_gradients(inputs, SDPBackend.FLASH_ATTENTION), math_grads) is None
