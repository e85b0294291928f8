"""Positional schemes of the PE-fusion classifier, one section per `pe_type` (docs/model.md).

Two kinds:
- input PEs (`sinusoidal`, `learned`, `rope`, `relative`, `none`) return P of shape (1, T, d), which a fusion
  operator (pefusion.fusion.operators) combines with the token embeddings;
- attention PEs (`rotary`, `alibi`, beyond the paper) act inside every attention layer: `Rotary` rotates q and k,
  `ALiBi` biases the attention logits. Nothing is fused at the input for them (fusion must be 'none').

Fixed tables are built once for `max_len` positions as non-persistent buffers: they follow `.to(device)` but stay
out of checkpoints (they are rebuilt from the model config). In a stack of S seeds' models
(`pefusion.fusion.stacked`) the learned tables are (S, max_len, d) and give P of shape (S, 1, T, d); the fixed
ones stay one table that every seed shares.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from pefusion.fusion.config import ModelConfig


def _inverse_frequencies(dim: int) -> torch.Tensor:
    """f_i = 10000^(-2i/dim) for i < dim/2."""  # (dim/2,)
    return torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def _angles(max_len: int, dim: int) -> torch.Tensor:
    """t * f_i for every position t < max_len."""  # (max_len, dim/2), float64 so long tables stay exact
    return torch.arange(max_len, dtype=torch.float64)[:, None] * _inverse_frequencies(dim)[None, :]


class _FixedTable(nn.Module):
    """An input PE given by a fixed (max_len, d) table, sliced to the first T positions."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("table", table.float(), persistent=False)  # (max_len, d)

    def forward(self, T: int) -> torch.Tensor:
        return self.table[:T].unsqueeze(0)  # (1, T, d)


# ---------------------------------------------------------------------------------------------------------
# sinusoidal: Vaswani et al., interleaved sin/cos
# ---------------------------------------------------------------------------------------------------------


class Sinusoidal(_FixedTable):
    """P[t, 2i] = sin(t / 10000^(2i/d)), P[t, 2i+1] = cos(t / 10000^(2i/d))."""

    def __init__(self, max_len: int, d: int):
        angles = _angles(max_len, d)
        super().__init__(torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(max_len, d))


# ---------------------------------------------------------------------------------------------------------
# learned: one trainable vector per absolute position
# ---------------------------------------------------------------------------------------------------------


class Learned(nn.Module):
    """nn.Embedding(max_len, d) looked up at positions 0..T-1."""

    def __init__(self, max_len: int, d: int):
        super().__init__()
        self.embed = nn.Embedding(max_len, d)

    def forward(self, T: int) -> torch.Tensor:
        # (1, T, d), the same as embed(arange(T)) without the gather; stacked (S, 1, T, d)
        return self.embed.weight[..., :T, :].unsqueeze(-3)


# ---------------------------------------------------------------------------------------------------------
# rope: the PAPER's "RoPE" — NOT rotary attention
# ---------------------------------------------------------------------------------------------------------


class PaperRope(_FixedTable):
    """The paper's `rope`: features concat(sin(t·f), cos(t·f)), f_i = 10000^(-2i/d), i < d/2.

    Despite the name this does NOT rotate q/k: it is an absolute, sinusoid-like table (sin block then cos block)
    fused at the input like any other P. The name is kept to reproduce the paper; true rotary embedding is
    `pe_type='rotary'` (class `Rotary`).
    """

    def __init__(self, max_len: int, d: int):
        angles = _angles(max_len, d)
        super().__init__(torch.cat((angles.sin(), angles.cos()), dim=-1))


# ---------------------------------------------------------------------------------------------------------
# relative: the PAPER's "relative" — an absolute learned table
# ---------------------------------------------------------------------------------------------------------


class PaperRelative(nn.Module):
    """The paper's `relative`: a learned (max_len, d) table initialised N(0, 1), sliced to T.

    Despite the name it is ABSOLUTE: row t belongs to position t and no pairwise distance is involved, so it is
    `learned` under another name (nn.Embedding is N(0, 1)-initialised too). The name is kept to reproduce the
    paper.
    """

    def __init__(self, max_len: int, d: int):
        super().__init__()
        self.table = nn.Parameter(torch.randn(max_len, d))

    def forward(self, T: int) -> torch.Tensor:
        return self.table[..., :T, :].unsqueeze(-3)  # (1, T, d); stacked (S, 1, T, d)


# ---------------------------------------------------------------------------------------------------------
# none: the order-blind ablation
# ---------------------------------------------------------------------------------------------------------


class NoPosition(nn.Module):
    """P = 0: no position information (only reached with fusions that take a P; fusion='none' skips it)."""

    def __init__(self, d: int):
        super().__init__()
        self.d = d
        self.register_buffer("anchor", torch.zeros(()), persistent=False)  # carries device and dtype

    def forward(self, T: int) -> torch.Tensor:
        return self.anchor.expand(1, T, self.d)  # (1, T, d) of zeros, no allocation


# ---------------------------------------------------------------------------------------------------------
# rotary (beyond the paper): true RoPE, Su et al., on q and k of every attention layer
# ---------------------------------------------------------------------------------------------------------


class Rotary(nn.Module):
    """Rotate each (x_j, x_{j+hd/2}) pair of a head by angle t·f_j (GPT-NeoX "rotate half" layout).

    q_m·k_n then depends on the positions only through m − n. Applied in every layer to q and k, per head.
    """

    def __init__(self, max_len: int, head_dim: int):
        super().__init__()
        angles = _angles(max_len, head_dim).repeat(1, 2)  # (max_len, hd)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., T, hd) -> rotated x (..., T, hd)."""
        T, half = x.shape[-2], x.shape[-1] // 2
        rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * self.cos[:T] + rotated_half * self.sin[:T]


# ---------------------------------------------------------------------------------------------------------
# alibi (beyond the paper): Press et al., linear distance bias on the logits
# ---------------------------------------------------------------------------------------------------------


def alibi_slopes(nhead: int) -> torch.Tensor:
    """The standard ALiBi head slopes: 2^(-8/n), 2^(-16/n), ... for n a power of two; otherwise the slopes of
    the nearest lower power of two followed by every other slope of the next one (Press et al.'s recipe)."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    low = 2 ** math.floor(math.log2(nhead))
    slopes = geometric(low) + geometric(2 * low)[0::2][: nhead - low]
    return torch.tensor(slopes)  # (nhead,)


class ALiBi(nn.Module):
    """Bias −slope_h·|i − j| on the logits of head h. Bidirectional (|i − j|) because this is an encoder."""

    def __init__(self, nhead: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(nhead), persistent=False)
        self._cache: tuple[tuple, torch.Tensor] | None = None

    def forward(self, T: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The bias for T positions in `dtype` (default the slopes' float32), computed in float32 and kept for the
        next call with the same T and dtype (bucketed batches repeat T)."""
        key = (T, self.slopes.device, dtype or self.slopes.dtype)
        if self._cache is None or self._cache[0] != key:
            pos = torch.arange(T, device=self.slopes.device)
            distance = (pos[:, None] - pos[None, :]).abs()  # (T, T)
            self._cache = (key, (-self.slopes[:, None, None] * distance).to(key[2]))  # (H, T, T)
        return self._cache[1].unsqueeze(0)  # (1, H, T, T)


# ---------------------------------------------------------------------------------------------------------
# factory
# ---------------------------------------------------------------------------------------------------------


def build_positional(cfg: ModelConfig) -> nn.Module:
    """The positional module of `cfg.pe_type` (input PE: forward(T) -> (1, T, d); Rotary; ALiBi)."""
    d, max_len = cfg.d_model, cfg.max_len
    builders = {
        "sinusoidal": lambda: Sinusoidal(max_len, d),
        "learned": lambda: Learned(max_len, d),
        "rope": lambda: PaperRope(max_len, d),
        "relative": lambda: PaperRelative(max_len, d),
        "none": lambda: NoPosition(d),
        "rotary": lambda: Rotary(max_len, d // cfg.nhead),
        "alibi": lambda: ALiBi(cfg.nhead),
    }
    return builders[cfg.pe_type]()
