"""The chunked CPU attention-dropout path (pefusion.fusion.attention.attention) computes SDPA's function exactly, given
its dropout mask, draws masks at rate p, and is fixed by torch.manual_seed."""
import pytest
import torch

from pefusion.fusion import attention as encoder
from pefusion.fusion.attention import attention


def reference(q, k, v, bias, keep, p):
    """softmax(q kᵀ/√hd + bias), dropped with `keep` and scaled by 1/(1-p), times v."""
    probs = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias, -1)
    return (probs * keep / (1 - p)) @ v


@pytest.mark.parametrize("chunk", [64, 1 << 18], ids=["head_blocks", "document_blocks"])
@pytest.mark.parametrize("mask_kind", ["key_padding", "alibi_like"])
def test_chunked_attention_matches_the_formula_given_its_mask(monkeypatch, chunk, mask_kind):
    monkeypatch.setattr(encoder, "CHUNK_ELEMENTS", chunk)
    torch.manual_seed(0)
    B, H, T, hd, p = 3, 4, 13, 8, 0.3
    q, k, v = (torch.randn(B, H, T, hd, dtype=torch.float64, requires_grad=True) for _ in range(3))
    attend = torch.arange(T)[None] < torch.tensor([13, 7, 1])[:, None]  # (B, T); one document of one token
    if mask_kind == "key_padding":
        mask = attend[:, None, None, :]  # bool (B, 1, 1, T)
        bias = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    else:
        slope = torch.arange(1, H + 1, dtype=torch.float64)[None, :, None, None]
        dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().double()
        mask = (-slope * dist).masked_fill(~attend[:, None, None, :], float("-inf"))  # float (B, H, T, T)
        bias = mask
    y = attention(q, k, v, mask, p)
    assert y.grad_fn.name().endswith("_ChunkedDropoutAttentionBackward")
    keep = y.grad_fn.saved_tensors[-1].double()
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (q, k, v), g)
    want_y = reference(q, k, v, bias, keep, p)
    want = torch.autograd.grad(want_y, (q, k, v), g)
    torch.testing.assert_close(y, want_y, atol=1e-12, rtol=0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_dropout_rate_and_seed():
    q = k = v = torch.randn(2, 8, 64, 16)
    mask = torch.ones(2, 1, 1, 64, dtype=torch.bool)
    torch.manual_seed(5)
    y1 = attention(q.requires_grad_(), k, v, mask, 0.1)
    keep = y1.grad_fn.saved_tensors[-1].double()
    assert abs(keep.mean().item() - 0.9) < 0.005  # 65 536 draws: 6 standard deviations
    torch.manual_seed(5)
    torch.testing.assert_close(attention(q, k, v, mask, 0.1), y1, atol=0, rtol=0)


def test_fully_masked_rows_and_inference_use_sdpa():
    q = k = v = torch.randn(2, 2, 5, 4)
    mask = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    mask[0] = True  # document 1 has nothing to attend to: SDPA's math path returns zeros there, not NaN
    assert torch.isfinite(attention(q, k, v, mask, 0.1)).all()
    torch.testing.assert_close(attention(q, k, v, mask[:1].expand(2, -1, -1, -1), 0.0),
                               torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:1]))


def test_cpu_dropout_keeps_at_rate_scales_and_passes_the_same_mask_back():
    drop = encoder.Dropout(0.25)
    x = torch.ones(64, 1024, requires_grad=True)
    torch.manual_seed(3)
    y = drop(x)
    kept = y != 0
    assert abs(kept.double().mean().item() - 0.75) < 0.01  # 65 536 draws: ~6 standard deviations
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.75))
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # d(x * mask)/dx = mask
    torch.manual_seed(3)
    torch.testing.assert_close(drop(x), y, atol=0, rtol=0)
    assert torch.equal(drop.eval()(x), x)
