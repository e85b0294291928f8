"""Fusion operators H = fuse(E, P) (docs/model.md), the object of the PE-fusion study.

Every operator is an nn.Module with `forward(E, P, pad_mask) -> H`: E (B, T, d) token embeddings, P (1 or B, T, d)
position features, pad_mask (B, T) bool with True at padding. Parameter shapes follow the paper's code exactly
(concat = Linear(2d, d), gate_scalar = Linear(2d, 1), mlp = Linear(2d, d) -> ReLU -> Linear(d, d)). In a stack
of S seeds' models (`pefusion.fusion.layers`) every shape gains a leading S (P: S or 1).
"""
from __future__ import annotations

import torch
from torch import nn

from pefusion.fusion.config import ModelConfig
from pefusion.fusion.layers import Conv1d, Linear


def _stack(E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    return torch.cat((E, P.expand_as(E)), dim=-1)  # (B, T, 2d)


class Add(nn.Module):
    """H = E + P."""

    def forward(self, E: torch.Tensor, P: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        return E + P


class Mul(nn.Module):
    """H = E ⊙ P."""

    def forward(self, E: torch.Tensor, P: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        return E * P


class NoFusion(nn.Module):
    """H = E (position enters inside attention, or nowhere)."""

    def forward(self, E: torch.Tensor, P: torch.Tensor | None = None, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        return E


class Project(nn.Module):
    """H = net([E; P]): `concat` (net = Linear(2d, d)) and `mlp` (net = Linear(2d, d) -> ReLU -> Linear(d, d))."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, E: torch.Tensor, P: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(_stack(E, P))


class Gate(nn.Module):
    """g = σ(net([E; P])), H = g ⊙ E + (1 − g) ⊙ P.

    net = Linear(2d, 1) gives `gate_scalar` (one g per position), Linear(2d, d) `gate_vector` and the MLP
    `mlp_gate` (one g per feature).
    """

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, E: torch.Tensor, P: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        g = torch.sigmoid(self.net(_stack(E, P)))  # (B, T, 1 or d)
        return P + g * (E - P)  # = g E + (1 - g) P with one product fewer


class ConvGate(nn.Module):
    """`gate_cnn`: g = σ(depthwise Conv1d over the positions of P, odd kernel, "same" padding), per feature;
    H = g ⊙ E + (1 − g) ⊙ P.

    P is zeroed at padding before the convolution, so the last real positions see the same zeros whether the
    document is followed by no padding (the conv's own zero padding) or by any amount of it: a document's output
    does not depend on how its batch was padded.
    """

    def __init__(self, d: int, kernel: int):
        super().__init__()
        self.conv = Conv1d(d, d, kernel, padding=kernel // 2, groups=d)

    def forward(self, E: torch.Tensor, P: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        P = P.expand_as(E)
        if pad_mask is not None:
            P = P.masked_fill(pad_mask.unsqueeze(-1), 0.0)
        g = torch.sigmoid(self.conv(P.transpose(-1, -2))).transpose(-1, -2)  # (B, T, d)
        return P + g * (E - P)


def _mlp(d: int) -> nn.Sequential:
    return nn.Sequential(Linear(2 * d, d), nn.ReLU(), Linear(d, d))


def build_fusion(cfg: ModelConfig) -> nn.Module:
    """The fusion operator of `cfg.fusion`."""
    d = cfg.d_model
    builders = {
        "add": Add,
        "mul": Mul,
        "none": NoFusion,
        "concat": lambda: Project(Linear(2 * d, d)),
        "mlp": lambda: Project(_mlp(d)),
        "gate_scalar": lambda: Gate(Linear(2 * d, 1)),
        "gate_vector": lambda: Gate(Linear(2 * d, d)),
        "mlp_gate": lambda: Gate(_mlp(d)),
        "gate_cnn": lambda: ConvGate(d, cfg.gate_kernel),
    }
    return builders[cfg.fusion]()
