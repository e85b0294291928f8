"""The classifier's layers with weights, each also runnable as S seeds' layers fused into one (HFTA's horizontal
fusion, arXiv 2102.02344).

A layer of a plain model holds its PyTorch parameters as they are (`Linear.weight` (out, in), ...): these classes
are nn.Linear, nn.LayerNorm, nn.Embedding and nn.Conv1d with the same names, shapes and initialisation, so a plain
model's state_dict and its random draws at construction do not change. The same layer in a stack of S seeds
(`pefusion.fusion.stacked.stack_models`) holds every parameter with a leading seed dimension, (S, out, in), ...,
row s being seed s's own tensor, and takes inputs with a leading seed dimension too. It then computes all S seeds'
layers in the kernels of one:

- `Linear`: one batched matmul, (S, N, in) × (S, in, out) plus the (S, 1, out) biases (`torch.baddbmm`);
- `LayerNorm`: one normalisation of every seed's rows, then each seed's own affine (one `addcmul`);
- `Embedding`: one lookup in the (S·V, d) table of every seed's rows, each seed's ids offset by s·V;
- `Conv1d`: one grouped convolution, the seeds' channels side by side and the groups S times as many.

A layer tells which it is from its weight's number of dimensions: there is one model definition, and a stack is
that model with stacked parameters.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _seed_view(t: torch.Tensor, dims: int) -> torch.Tensor:
    """A per-seed (S, k) tensor as (S, 1, ..., 1, k), to broadcast over an input of `dims` dimensions."""
    return t.view(t.shape[0], *(1,) * (dims - 2), t.shape[-1])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear: x (..., in), weight (out, in), bias (out,) -> (..., out); or stacked: x (S, ..., in), weight
    (S, out, in), bias (S, out) -> (S, ..., out), every seed's product in one batched matmul."""
    if weight.dim() == 2:
        return F.linear(x, weight, bias)
    S, out = weight.shape[:2]
    rows = x.reshape(S, -1, x.shape[-1])  # (S, N, in)
    y = torch.bmm(rows, weight.transpose(1, 2)) if bias is None else \
        torch.baddbmm(bias.unsqueeze(1), rows, weight.transpose(1, 2))  # (S, N, out)
    return y.view(*x.shape[:-1], out)


class Linear(nn.Linear):
    """nn.Linear; stacked, one batched matmul over the seeds (see `linear`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm over the last dimension; stacked (weight and bias (S, d), x (S, ..., d)), the normalisation
    of every seed's rows at once and each seed's own affine."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dim() == 1:
            return super().forward(x)
        y = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        return torch.addcmul(_seed_view(self.bias, x.dim()), y, _seed_view(self.weight, x.dim()))


class Embedding(nn.Embedding):
    """nn.Embedding; stacked (weight (S, V, d), ids (S, ...)), one lookup of every seed's ids in its own rows.

    Stacked, `padding_idx` zeroes no gradient: the classifier masks padding out of attention and pooling, so the
    padding rows receive an exact zero gradient anyway."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dim() == 2:
            return super().forward(x)
        S, V = self.weight.shape[:2]
        offsets = torch.arange(0, S * V, V, device=x.device).view(S, *(1,) * (x.dim() - 1))
        return F.embedding(x + offsets, self.weight.flatten(0, 1))  # (S, ..., d)


class Conv1d(nn.Conv1d):
    """nn.Conv1d over (B, C, T); stacked (weight (S, out, in/groups, K), x (S, B, C, T)), one convolution with the
    seeds' channels side by side, (B, S·C, T), and S times the groups, so no group mixes two seeds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dim() == 3:
            return super().forward(x)
        S, B, C, T = x.shape
        y = F.conv1d(x.transpose(0, 1).reshape(B, S * C, T), self.weight.flatten(0, 1),
                     None if self.bias is None else self.bias.flatten(), self.stride, self.padding, self.dilation,
                     S * self.groups)  # (B, S·out, T')
        return y.view(B, S, -1, y.shape[-1]).transpose(0, 1)  # (S, B, out, T')
