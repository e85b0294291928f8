"""The CPU attention kernel of the classifier's encoder layers: `attention()` (F.scaled_dot_product_attention's
function, with dropout on the attention probabilities run in blocks on a CPU) and the seeded `Dropout` for
activations.

Why it exists: PyTorch's fused CPU attention kernels have no dropout, so F.scaled_dot_product_attention with
dropout_p > 0 on a CPU takes its math path: it materialises the (B, H, T, T) logits, probabilities, a float
Bernoulli mask drawn with bernoulli_ (~7 ns per element on one core) and the dropped probabilities, each 268 MB at
B=32, H=8, T=512, and keeps them for backward. That path dominated training time. `_ChunkedDropoutAttention`
computes the same function one L2-sized block of (document, heads) at a time, recomputes the probabilities in
backward (flash-attention style) and keeps only a uint8 keep-mask (1 byte per weight). One training step of the
paper's ArXiv model at B=32, T=512 on one core: 4.6 -> 1.8 CPU-seconds.

Its dropout masks come from numpy's SFC64 generator seeded from torch's default generator, so `torch.manual_seed`
and a restored torch RNG state still fix them; an element is kept when a uniform 32-bit integer is
>= round(p * 2^32), i.e. with probability 1 - p up to 2^-32 (torch.rand_like(x) >= p resolves p to 2^-24): the
same functions, the same distribution of dropout masks as PyTorch's, other random numbers. CUDA keeps SDPA's
fused kernels.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

CHUNK_ELEMENTS = 1 << 18  # attention weights per block: 1 MB of float32, so a block stays in L2 cache


def _generator() -> np.random.SFC64:
    """A fresh SFC64 stream seeded from torch's default generator (so torch.manual_seed fixes it)."""
    return np.random.SFC64(int(torch.randint(2 ** 62, ()).item()))


def _keep_mask_into(out: torch.Tensor, rng: np.random.SFC64, p: float) -> None:
    """Fill `out` (uint8 or float) with i.i.d. Bernoulli(1 - p) draws (1 = keep)."""
    n = out.numel()
    bits = rng.random_raw((n + 1) // 2).view(np.int32)[:n]  # n uniform 32-bit integers, as int32
    torch.ge(torch.from_numpy(bits).view(out.shape), round(p * 2 ** 32) - 2 ** 31, out=out)


class Dropout(nn.Dropout):
    """nn.Dropout; training on a CPU, its mask comes from `_keep_mask_into`: forward + backward of a
    (32, 512, 128) activation take ~10 ms instead of ~22 ms with bernoulli_ (the step above: 2.06 -> 1.79 s)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and not self.inplace and 0 < self.p < 1 and x.device.type == "cpu"
                and x.dtype in (torch.float32, torch.float64)):
            return super().forward(x)
        mask = torch.empty(x.shape, dtype=x.dtype)
        _keep_mask_into(mask, _generator(), self.p)
        return x * mask.mul_(1.0 / (1.0 - self.p))  # backward multiplies by the same mask


def _blocks(B: int, H: int, T: int) -> list[tuple[slice, slice]]:
    """(documents, heads) slices of the blocks: whole documents when a document's H×T×T weights fit in
    CHUNK_ELEMENTS, otherwise groups of heads of one document (the largest divisor of H that fits, at least 1)."""
    per = max(1, CHUNK_ELEMENTS // (T * T))
    if per >= H:
        docs = per // H
        return [(slice(b, min(B, b + docs)), slice(0, H)) for b in range(0, B, docs)]
    heads = max(h for h in range(1, per + 1) if H % h == 0)
    return [(slice(b, b + 1), slice(h, h + heads)) for b in range(B) for h in range(0, H, heads)]


def _rows(x: torch.Tensor, docs: slice, heads: slice) -> torch.Tensor:
    """The (docs, heads) block of a contiguous (B, H, ...) tensor as a (docs·heads, ...) view."""
    return x[docs, heads].flatten(0, 1)


def _bias_block(bias: torch.Tensor, docs: slice, heads: slice) -> torch.Tensor:
    """The block of a (1 or B, 1 or H, 1 or T, T) additive mask that broadcasts over (docs, heads, T, T)."""
    return bias[docs if bias.shape[0] > 1 else slice(0, 1), heads if bias.shape[1] > 1 else slice(0, 1)]


def _block_buffers(qs: torch.Tensor, count: int) -> tuple[list[tuple[slice, slice]], list[torch.Tensor]]:
    """The blocks of qs (B, H, T, hd) and `count` (n, T, T) work buffers that fit the largest of them."""
    B, H, T, _ = qs.shape
    blocks = _blocks(B, H, T)
    n_max = max((d.stop - d.start) * (h.stop - h.start) for d, h in blocks)
    return blocks, [qs.new_empty(n_max, T, T) for _ in range(count)]


def _block_probs(qs: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, docs: slice, heads: slice,
                 logits_buf: torch.Tensor, probs_buf: torch.Tensor) -> torch.Tensor:
    """softmax(qs kᵀ + bias) of one (docs, heads) block, (n, T, T), written into the buffers' first n rows
    (the logits buffer is free again afterwards)."""
    nd, nh, T = docs.stop - docs.start, heads.stop - heads.start, qs.shape[2]
    logits = torch.bmm(_rows(qs, docs, heads), _rows(k, docs, heads).transpose(1, 2), out=logits_buf[:nd * nh])
    logits.view(nd, nh, T, T).add_(_bias_block(bias, docs, heads))
    return torch.softmax(logits, -1, out=probs_buf[:nd * nh])


class _ChunkedDropoutAttention(torch.autograd.Function):
    """y = dropout(softmax(q kᵀ/√hd + bias)) v, with dropout as in SDPA (kept weights scaled by 1/(1-p)).

    q, k, v (B, H, T, hd); bias float (1 or B, 1 or H, 1 or T, T), -inf = masked, no row fully masked."""

    @staticmethod
    def forward(q, k, v, bias, p):
        B, H, T, hd = q.shape
        scale = hd ** -0.5
        qs, k, v = (q * scale).contiguous(), k.contiguous(), v.contiguous()
        rng = _generator()
        keep = torch.empty(B, H, T, T, dtype=torch.uint8)
        out = torch.empty_like(qs)
        blocks, (logits_buf, probs_buf) = _block_buffers(qs, 2)
        for docs, heads in blocks:
            probs = _block_probs(qs, k, bias, docs, heads, logits_buf, probs_buf)  # (n, T, T)
            block_keep = _rows(keep, docs, heads)
            _keep_mask_into(block_keep, rng, p)
            torch.bmm(probs.mul_(block_keep), _rows(v, docs, heads), out=_rows(out, docs, heads))
        out.mul_(1.0 / (1.0 - p))  # the dropout scale, on (B, H, T, hd) instead of (B, H, T, T)
        return out, keep

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        q, k, v, bias, p = inputs
        out, keep = output
        ctx.mark_non_differentiable(keep)
        ctx.save_for_backward(q, k, v, bias, out, keep)
        ctx.p, ctx.scale = p, q.shape[-1] ** -0.5

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, _keep_grad):
        q, k, v, bias, out, keep = ctx.saved_tensors
        qs, k, v = (q * ctx.scale).contiguous(), k.contiguous(), v.contiguous()
        B, H, T, hd = qs.shape
        grad_scaled = (grad_out * (1.0 / (1.0 - ctx.p))).contiguous()
        # Softmax backward needs rowsum(dP ⊙ P) = rowsum(dy ⊙ y): one (B, H, T) reduction, no (T, T) pass.
        row_dot = (grad_out * out).sum(-1, keepdim=True)  # (B, H, T, 1)
        grad_q = torch.empty_like(qs)
        # dk and dv come out transposed: (hd×T)·(T×T) products run about twice as fast as (T×T)ᵀ·(T×hd) ones.
        grad_kT, grad_vT = qs.new_empty(B, H, hd, T), qs.new_empty(B, H, hd, T)
        blocks, (logits_buf, probs_buf, grad_buf) = _block_buffers(qs, 3)
        for docs, heads in blocks:
            n = (docs.stop - docs.start) * (heads.stop - heads.start)
            probs = _block_probs(qs, k, bias, docs, heads, logits_buf, probs_buf)  # (n, T, T)
            block_keep = _rows(keep, docs, heads)
            dy = _rows(grad_scaled, docs, heads)  # (n, T, hd)
            dropped = torch.mul(probs, block_keep, out=logits_buf[:n])  # logits are no longer needed
            torch.bmm(dy.transpose(1, 2), dropped, out=_rows(grad_vT, docs, heads))
            grad_logits = torch.bmm(dy, _rows(v, docs, heads).transpose(1, 2), out=grad_buf[:n])
            grad_logits.mul_(block_keep).sub_(_rows(row_dot, docs, heads)).mul_(probs)
            torch.bmm(grad_logits, _rows(k, docs, heads), out=_rows(grad_q, docs, heads))
            torch.bmm(_rows(qs, docs, heads).transpose(1, 2), grad_logits, out=_rows(grad_kT, docs, heads))
        return grad_q.mul_(ctx.scale), grad_kT.transpose(-1, -2), grad_vT.transpose(-1, -2), None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor,
              dropout_p: float) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p): q, k, v (B, H, T, hd); attn_mask bool
    (True = attend) or float, 4-D and broadcastable to (B, H, T, T). Dropout on a CPU runs chunked."""
    if dropout_p > 0 and q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) \
            and attn_mask.dim() == 4 and not attn_mask.requires_grad:
        if attn_mask.dtype == torch.bool:
            usable = bool(attn_mask.any(-1).all())
            bias = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill_(~attn_mask, float("-inf"))
        else:
            bias = attn_mask.to(q.dtype)
            usable = not bool(torch.isneginf(bias).all(-1).any())
        if usable:  # SDPA's math path returns 0 for a fully masked row; plain softmax would give NaN there
            return _ChunkedDropoutAttention.apply(q, k, v, bias, dropout_p)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
