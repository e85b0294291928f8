"""The quadrature rules: tensor Gauss–Hermite rules, Gauss rules for the normal density on an interval, and the
split rule that integrates each line along ζ = (ξ₁ − ξ₂)/√2 on both sides of the proximal point's switch.

A fixed tensor rule in (ξ₁, ξ₂, y₁, y₂) samples the proximal point's jump between mirror minima unevenly (on the
semantic branch, m = 0, a quarter of a 12-node rule's mass lies on ξ₁ = ξ₂ itself) and cannot see the jump move
with the state: its map is a staircase, on which the damped iteration cycles (no fixed point) or stops on a step
(a jagged curve, ε_g off: docs/theory.md has the numbers). So the expectations are taken in (ζ, η, y₁, y₂), with
η = (ξ₁ + ξ₂)/√2: a tensor Gauss–Hermite rule in (η, y₁, y₂) and, on each of its lines, a Gauss rule for the
normal density on each side of the switch ζ* (`switches`). The integrand is smooth on each side, so a few nodes
per side converge, and the map is continuous in the state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from numpy.polynomial.hermite import hermgauss
from numpy.polynomial.legendre import leggauss

from pefusion.student.theory.settings import QuadratureSettings


class Rule(NamedTuple):
    """Nodes (dim, N) or (S..., k) and their weights (N,) or (S..., k)."""

    nodes: torch.Tensor
    weights: torch.Tensor


def tensor_gauss_hermite(n: int, dim: int, settings: QuadratureSettings = QuadratureSettings()) -> Rule:
    """An n-node-per-axis tensor Gauss–Hermite rule for N(0, I_dim): nodes (dim, N), weights (N,) summing to 1,
    nodes lighter than settings.weight_floor dropped."""
    t, w = hermgauss(n)  # ∫ e^{-t²} f(t) dt: the standard normal is t·√2 with weights w/√π
    t, w = t * math.sqrt(2.0), w / math.sqrt(math.pi)
    grid = np.stack(np.meshgrid(*[t] * dim, indexing="ij")).reshape(dim, -1)
    weight = np.prod(np.stack(np.meshgrid(*[w] * dim, indexing="ij")).reshape(dim, -1), axis=0)
    keep = weight >= settings.weight_floor
    return Rule(torch.from_numpy(grid[:, keep]).double(), torch.from_numpy(weight[keep] / weight[keep].sum()).double())


@dataclass(frozen=True)
class Quadrature:
    """A rule for (ξ₁, ξ₂, y₁, y₂) ~ N(0, I₄): nodes (4, N) shared by every point or (4, P, N) per point, weights
    (N,) or (P, N), summing to 1."""

    nodes: torch.Tensor
    weights: torch.Tensor

    @classmethod
    def gauss_hermite(cls, n: int, settings: QuadratureSettings = QuadratureSettings()) -> "Quadrature":
        """The 4-D tensor Gauss–Hermite rule (shared nodes): the anchor's approach iteration."""
        return cls(*tensor_gauss_hermite(n, 4, settings))

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """E[values] over the nodes: (P, N) -> (P,)."""
        return (values * self.weights).sum(-1)


def normal_gauss_rules(a: torch.Tensor, b: torch.Tensor, k: int,
                       settings: QuadratureSettings = QuadratureSettings()) -> Rule:
    """k-node Gauss rules for the standard normal density on [a, b] (a < b, tensors of one shape S): nodes and
    weights (S..., k), the weights summing to the interval's normal mass. Exact for polynomials of degree 2k − 1:
    the recurrence coefficients by the Stieltjes procedure on a settings.density_nodes-point Gauss–Legendre
    discretisation of the density, the nodes and weights by Golub–Welsch."""
    x, w = (torch.from_numpy(v) for v in leggauss(settings.density_nodes))
    a_, b_ = a[..., None], b[..., None]
    t = (a_ + b_) / 2 + (b_ - a_) / 2 * x
    density = (b_ - a_) / 2 * w * torch.exp(-t * t / 2) / math.sqrt(2 * math.pi)
    mass = density.sum(-1)
    density = density / mass[..., None]
    diag, off = [], []
    before, poly, norm = torch.zeros_like(t), torch.ones_like(t), torch.ones_like(mass)
    for j in range(k):
        centre = (density * t * poly * poly).sum(-1) / norm
        after = (t - centre[..., None]) * poly - (off[-1][..., None] ** 2 * before if j else 0.0)
        after_norm = (density * after * after).sum(-1)
        diag.append(centre)
        off.append(torch.sqrt(after_norm / norm))
        before, poly, norm = poly, after, after_norm
    jacobi = torch.diag_embed(torch.stack(diag, -1))
    if k > 1:
        band = torch.stack(off[:-1], -1)
        jacobi = jacobi + torch.diag_embed(band, 1) + torch.diag_embed(band, -1)
    nodes, vectors = torch.linalg.eigh(jacobi)
    return Rule(nodes, mass[..., None] * vectors[..., 0, :] ** 2)


@dataclass(frozen=True)
class OuterRule:
    """The tensor Gauss–Hermite rule for (η, y₁, y₂) ~ N(0, I₃) whose lines along ζ the split rule integrates:
    nodes (3, N_o), weights (N_o,)."""

    nodes: torch.Tensor
    weights: torch.Tensor

    @classmethod
    def gauss_hermite(cls, n: int, settings: QuadratureSettings = QuadratureSettings()) -> "OuterRule":
        return cls(*tensor_gauss_hermite(n, 3, settings))


def split_quadrature(switch: torch.Tensor, outer: OuterRule, k: int,
                     settings: QuadratureSettings = QuadratureSettings()) -> Quadrature:
    """The rule for P points whose proximal point switches at ζ = switch (P, N_o) on the outer rule's lines: k
    Gauss nodes for the normal density on each side, [−zeta_span, ζ*] and [ζ*, zeta_span]. Nodes
    (4, P, 2k·N_o) in (ξ₁, ξ₂, y₁, y₂), weights (P, 2k·N_o)."""
    inside = switch.clamp(-settings.zeta_span + settings.zeta_margin, settings.zeta_span - settings.zeta_margin)
    span = torch.full_like(inside, settings.zeta_span)
    zeta, weight = normal_gauss_rules(torch.stack([-span, inside]), torch.stack([inside, span]), k, settings)
    zeta, weight = torch.cat(list(zeta), -1), torch.cat(list(weight), -1)  # (P, N_o, 2k): left, then right
    weight = (outer.weights[:, None] * weight).flatten(1)
    eta, y1, y2 = (v[:, None].expand(zeta.shape[1:]) for v in outer.nodes)
    n_points = switch.shape[0]
    nodes = torch.stack([((eta + zeta) / math.sqrt(2)).flatten(1), ((eta - zeta) / math.sqrt(2)).flatten(1),
                         y1.reshape(1, -1).expand(n_points, -1), y2.reshape(1, -1).expand(n_points, -1)])
    return Quadrature(nodes, weight / weight.sum(1, keepdim=True))
