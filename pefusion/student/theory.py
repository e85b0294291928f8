"""Study B's d → ∞ prediction: the replica fixed point of docs/theory.md, its test error ε_g, free energy Φ and α_c(ω).

Owns the proximal step, the hat and prior updates, the quadrature of the hats, the fixed point of each branch
followed by continuation in α from an anchor, ε_g and Φ there, the root α_c(ω) of Φ_semantic − Φ_positional,
and a small on-disk cache of computed points, so that the reports can put the theory beside every simulated point
without recomputing it.

Order parameters (L = 2, r = 1, ρ = σ²): q = σ²‖Q‖²/d, m = 1ᵀQ/d, θ = σ² Q·Q*/d, V. Note θ here carries the σ²
of docs/theory.md: the simulations' θ = |Q*ᵀQ|/d is θ/σ² (`simulation_theta`).

Why it looks as it does.

The proximal point p = argmin_x Σ_l (x_l − w_l)²/V + 2ℓ(x; h*), the local minimum reached from (0, 0), jumps
between the loss's mirror minima (ℓ is even in x) where the sign of p₁ − p₂ flips: on a surface near w₁ = w₂,
i.e. near ζ = (ξ₁ − ξ₂)/√2 = −√2 m/√q (every line of fixed η = (ξ₁ + ξ₂)/√2, y₁, y₂ crosses it once; where
the central stationary point is still a minimum the flip is a steep but continuous passage through p₁ = p₂). The
hats' integrands are discontinuous there, and where the switch sits depends on the state. A fixed tensor rule in
(ξ₁, ξ₂, y₁, y₂) samples the jump unevenly (on the semantic branch, m = 0, a quarter of a 12-node rule's mass lies
on ξ₁ = ξ₂ itself) and cannot see the switch move with the state: its map is a staircase, on which the damped
iteration cycles (no fixed point) or stops on a step (a jagged curve, ε_g off: docs/theory.md
has the numbers). So the expectations are taken in (ζ, η, y₁, y₂): a tensor Gauss–Hermite rule in (η, y₁, y₂)
and, on each of its lines, the switch ζ* located by bisection on the sign of p₁ − p₂ (proximal steps from (0, 0))
and a Gauss rule for the normal density on each side of it (`normal_gauss_rules`). The integrand is smooth on each
side, so a few nodes per side converge, and the map is continuous in the state.

Where the switch moves with the state, it feeds back: on the semantic branch the response of F_θ to θ through it
puts an eigenvalue of the map near 1 towards the branch's end (θ → 0 at α ≈ 0.77 for ω = 0.3), so a damped
iteration converges slowly and amplifies any quadrature error. The fixed point is solved by Newton's method on
F(x) − x (a finite-difference Jacobian, refined by Broyden updates), with the branch's symmetric coordinate held
at its symmetric value (semantic with a symmetric teacher A: m = 0, tokens 1 ↔ 2; positional: θ = 0, y → −y).
Each branch is followed by continuation in α from an anchor, over a fixed lattice (α = 2 ± 0.05 k): a point is
solved from the lattice point before it (towards the anchor), predicted by the quadratic through the last three,
so its value does not depend on which other points were asked for (to the solver's tolerance: points solved in
one batch share vectorised arithmetic), and a curve never jumps between branches. The anchor is α = 2 (the
anchors of docs/theory.md), or where the branch does not reach it the first of α = 1, 0.5, 4 where it is found:
there the documented damped iteration on a 4-D tensor Gauss–Hermite rule brings the branch's starting point to within
1e-3, then Newton finishes on the split rule. Where the continuation leaves a branch (its coordinate, θ or m, falls to
0), the branch has ended: that point and those beyond it are reported as such.

Every proximal step, at every node of every point, is solved at once, as (P, N) tensors, by a damped Newton
iteration: the Hessian is shifted to be positive definite and each step backtracks until the objective decreases
(Armijo), so every node descends into a local minimum even where the loss is not convex.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from numpy.polynomial.hermite import hermgauss
from numpy.polynomial.legendre import leggauss
from scipy.optimize import brentq

from pefusion.errors import ConfigError, check_choice, check_positive
from pefusion.student.config import ALPHA_C_PUBLISHED, TEACHER_A

# docs/theory.md's starting points, (q, m, θ, V) per branch.
BRANCH_START = {"semantic": (0.9068, 2e-4, 0.3472, 14.575), "positional": (0.0207, 0.2, 0.0, 14.575)}
BRANCHES = tuple(BRANCH_START)
ORDER = ("q", "m", "theta", "V")  # the state vector's rows
# What a point's `status` says: on its branch and converged; the branch ends between its anchor and this α (the
# continuation left it: its coordinate, θ or m, fell to 0, or no fixed point was found near the last one even with
# steps of 0.05/8, a fold); the branch was found at no anchor. NOT_CONVERGED is Newton's own verdict on one
# attempt, which the continuation turns into one of the others.
CONVERGED, BRANCH_ENDED, NO_ANCHOR, NOT_CONVERGED = "converged", "branch_ended", "no_anchor", "not_converged"
COLUMNS = ("alpha", "branch", "q", "m", "theta", "V", "eps_g", "phi", "iterations", "converged", "status")
# Part of every cache key: points computed by an earlier algorithm are recomputed, never served. 1: each point
# alone by the damped iteration on a 4-D tensor rule; 2: the switch-split rule, Newton and continuation.
THEORY_VERSION = 2

DEFAULT_NODES = 12  # Gauss–Hermite nodes per axis of the (η, y₁, y₂) rule (docs/theory.md: doubling moves ε_g < 0.3 %)
DEFAULT_ZETA_NODES = 8  # Gauss nodes along ζ on each side of the switch
DEFAULT_DAMPING = 0.8  # the anchor's approach: x <- damping·x + (1 − damping)·F(x), docs/theory.md's 0.8 x + 0.2 F(x)
# On |F(x) − x| in q, m and θ at the fixed point: F itself is known to ~3e-7 (relative, SWITCH_TOL), 1e-8-5e-8
# absolute here; Newton's last steps, on switches held in their brackets, converge only linearly below that.
DEFAULT_TOL = 1e-7
DEFAULT_MAX_ITER = 20  # evaluations of the map per Newton attempt (a failed step is retried in halves)

# A branch is anchored at the first of these where the documented starting point, iterated, lands on it: α = 2 is the
# documented anchor, the others catch branches that do not reach it (the positional one ends below α = 2 for ω ≤ 0.1)
ANCHORS = (2.0, 1.0, 0.5, 4.0)
LATTICE_STEP = 0.05  # the continuation lattice, through every anchor: α = 2 ± 0.05 k, down to 0.05 and up to 4 ...
LATTICE_LINEAR_MAX = 4.0  # ... then geometric steps of ratio 1 + 0.05/4 (alpha_c may search up to α = 50)
APPROACH_TOL, APPROACH_ITERS = 1e-3, 500  # the anchor's damped iteration: until its change is below APPROACH_TOL
LOST = 1e-4  # a branch's coordinate (θ semantic, m positional) below this: the continuation has left the branch
WEIGHT_FLOOR = 1e-10  # tensor-rule nodes lighter than this are dropped (1e-7 of the mass at 12 nodes per axis)
ZETA_SPAN = 10.0  # the ζ rules cover [−10, 10] (the normal mass outside is 1e-23)
SWITCH_START = 0.5  # a switch with no bracket yet is looked for in ζ_c ± 0.5 first (ζ_c = −√2 m/√q), then wider
# Bisection stops at brackets this narrow and the switch is interpolated inside: at α = 0.8 the map then moves
# by 3e-7 (relative) against brackets of 1e-9, 6e-6 at 1e-4.
SWITCH_TOL = 1e-5
SWITCH_GROW = 4  # a bracket the switch has left is moved past its wrong end and widened this much per try
# Below SECTION_POINTS / MULTISECTION brackets, each is cut into up to MULTISECTION pieces per proximal solve
# instead of two: the solve's cost is then its fixed overhead, and the last few brackets take a quarter the calls
MULTISECTION, SECTION_POINTS = 16, 2048
FIRST_STEP_HALF = 0.01  # the first step from the anchor has no prediction: its switches are looked for ±0.01
# A predicted switch is looked for first within this fraction of its predicted movement (Newton) or of the last
# term of its extrapolation (continuation): both overestimate the error ~10-100-fold
PREDICTION_ERROR = 0.1
DENSITY_NODES = 48  # Gauss–Legendre nodes discretising the normal density for the Stieltjes procedure (32 are
# not enough on [−10, 9], 48 agree with 128 to 1e-12)
JACOBIAN_STEP = 1e-3  # relative finite-difference step: moves the switches 100-fold beyond SWITCH_TOL
REFRESH_AFTER = 8  # Newton steps on a Broyden-updated Jacobian before a fresh finite-difference one
PREDICTOR_POINTS = 3  # a continuation step starts from the quadratic through the last three points
STEP_HALVINGS = 3  # a continuation step Newton cannot finish is retried as two halves, down to 0.05/8
NOISE_STEP = 1e-5  # Newton steps smaller than this (relative) do not update the Jacobian: F's noise dominates

# The proximal Newton iteration: a node is done when its gradient's largest component is below NEWTON_TOL (the
# objective is O(0.01-1), so its minimiser is then known to ~1e-8); a point whose nodes are not all done after
# NEWTON_ITERS steps is not trusted (converged=False).
NEWTON_TOL, NEWTON_ITERS, ARMIJO, HALVINGS, ROUNDOFF = 1e-8, 100, 1e-4, 40, 1e-15
STEP_CAP = 0.25  # per coordinate and Newton step
COMPACT = 0.75  # the still-moving fraction of the batch below which converged nodes are dropped from it
# ONE_THREAD: the solver runs on one torch thread whatever the caller's setting. Its tensors are 1e3-1e5 elements
# and it compacts them by index every Newton step; there a second intra-op thread costs more than it gives, and on
# a busy machine far more (a curve's first 60 steps: 0.65 s of CPU on one thread against 19 s on two, load 6 on 2
# cores).


@dataclass(frozen=True)
class Solver:
    """How the fixed point is computed: Gauss–Hermite nodes per axis of the (η, y₁, y₂) rule, Gauss nodes along ζ
    on each side of the switch, the anchor's damping, the tolerance on |F(x) − x| and the evaluations per point."""

    nodes: int = DEFAULT_NODES
    zeta_nodes: int = DEFAULT_ZETA_NODES
    damping: float = DEFAULT_DAMPING
    tol: float = DEFAULT_TOL
    max_iter: int = DEFAULT_MAX_ITER

    def __post_init__(self) -> None:
        for key in ("nodes", "zeta_nodes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
                raise ConfigError(f"{key}={value!r} is out of range; it must be an integer >= 2")
        if not (math.isfinite(self.damping) and 0 <= self.damping < 1):
            raise ConfigError(f"damping={self.damping!r} is out of range; it must be in [0, 1) "
                              f"(x <- damping*x + (1-damping)*F(x))")
        check_positive("tol", self.tol)
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, (int, np.integer)) or self.max_iter < 1:
            raise ConfigError(f"max_iter={self.max_iter!r} is out of range; it must be an integer >= 1")


# ---------------------------------------------------------------------------------------------------------
# Quadrature rules
# ---------------------------------------------------------------------------------------------------------


def tensor_gauss_hermite(n: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An n-node-per-axis tensor Gauss–Hermite rule for N(0, I_dim): nodes (dim, N), weights (N,) summing to 1,
    nodes lighter than WEIGHT_FLOOR dropped."""
    t, w = hermgauss(n)  # ∫ e^{-t²} f(t) dt: the standard normal is t·√2 with weights w/√π
    t, w = t * math.sqrt(2.0), w / math.sqrt(math.pi)
    grid = np.stack(np.meshgrid(*[t] * dim, indexing="ij")).reshape(dim, -1)
    weight = np.prod(np.stack(np.meshgrid(*[w] * dim, indexing="ij")).reshape(dim, -1), axis=0)
    keep = weight >= WEIGHT_FLOOR
    return torch.from_numpy(grid[:, keep]).double(), torch.from_numpy(weight[keep] / weight[keep].sum()).double()


@dataclass(frozen=True)
class Quadrature:
    """A rule for (ξ₁, ξ₂, y₁, y₂) ~ N(0, I₄): nodes (4, N) shared by every point or (4, P, N) per point, weights
    (N,) or (P, N), summing to 1."""

    nodes: torch.Tensor
    weights: torch.Tensor

    @classmethod
    def gauss_hermite(cls, n: int) -> "Quadrature":
        """The 4-D tensor Gauss–Hermite rule (shared nodes): the anchor's approach iteration."""
        return cls(*tensor_gauss_hermite(n, 4))

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """E[values] over the nodes: (P, N) -> (P,)."""
        return (values * self.weights).sum(-1)


def normal_gauss_rules(a: torch.Tensor, b: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k-node Gauss rules for the standard normal density on [a, b] (a < b, tensors of one shape S): nodes and
    weights (S..., k), the weights summing to the interval's normal mass. Exact for polynomials of degree 2k − 1:
    the recurrence coefficients by the Stieltjes procedure on a DENSITY_NODES-point Gauss–Legendre discretisation
    of the density, the nodes and weights by Golub–Welsch."""
    x, w = (torch.from_numpy(v) for v in leggauss(DENSITY_NODES))
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
    return nodes, mass[..., None] * vectors[..., 0, :] ** 2


@dataclass(frozen=True)
class OuterRule:
    """The tensor Gauss–Hermite rule for (η, y₁, y₂) ~ N(0, I₃) whose lines along ζ the split rule integrates:
    nodes (3, N_o), weights (N_o,)."""

    nodes: torch.Tensor
    weights: torch.Tensor

    @classmethod
    def gauss_hermite(cls, n: int) -> "OuterRule":
        return cls(*tensor_gauss_hermite(n, 3))


def split_quadrature(switch: torch.Tensor, outer: OuterRule, k: int) -> Quadrature:
    """The rule for P points whose proximal point switches at ζ = switch (P, N_o) on the outer rule's lines: k
    Gauss nodes for the normal density on each side, [−ZETA_SPAN, ζ*] and [ζ*, ZETA_SPAN]. Nodes (4, P, 2k·N_o)
    in (ξ₁, ξ₂, y₁, y₂), weights (P, 2k·N_o)."""
    inside = switch.clamp(-ZETA_SPAN + 1e-3, ZETA_SPAN - 1e-3)
    span = torch.full_like(inside, ZETA_SPAN)
    zeta, weight = normal_gauss_rules(torch.stack([-span, inside]), torch.stack([inside, span]), k)
    zeta, weight = torch.cat(list(zeta), -1), torch.cat(list(weight), -1)  # (P, N_o, 2k): left, then right
    weight = (outer.weights[:, None] * weight).flatten(1)
    eta, y1, y2 = (v[:, None].expand(zeta.shape[1:]) for v in outer.nodes)
    n_points = switch.shape[0]
    nodes = torch.stack([((eta + zeta) / math.sqrt(2)).flatten(1), ((eta - zeta) / math.sqrt(2)).flatten(1),
                         y1.reshape(1, -1).expand(n_points, -1), y2.reshape(1, -1).expand(n_points, -1)])
    return Quadrature(nodes, weight / weight.sum(1, keepdim=True))


# ---------------------------------------------------------------------------------------------------------
# The problem's parameters
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """Each point's problem as (P, 1) columns: α, σ, λ, ω and the teacher's diagonal A₁₁, A₂₂."""

    alpha: torch.Tensor
    sigma: torch.Tensor
    lam: torch.Tensor
    omega: torch.Tensor
    a11: torch.Tensor
    a22: torch.Tensor

    def rows(self, keep: torch.Tensor) -> "Params":
        return Params(*(getattr(self, k)[keep] for k in self.__dataclass_fields__))


def make_params(alpha: Sequence[float], sigma: Sequence[float], lam: Sequence[float], omega: Sequence[float],
                teacher_A: Sequence[str]) -> Params:
    """Validated (P, 1) parameter columns from P values each (a ConfigError names a bad one)."""
    for a in alpha:
        check_positive("alpha", a)
    for s in sigma:
        check_positive("sigma", s)
    for x in lam:
        check_positive("lam", x, allow_zero=True)
    for w in omega:
        if not (math.isfinite(w) and 0 <= w <= 1):
            raise ConfigError(f"omega={w!r} is out of range; it must be in [0, 1]")
    for name in teacher_A:
        check_choice("teacher_A", name, TEACHER_A)

    def col(values: Iterable[float]) -> torch.Tensor:
        return torch.tensor([float(v) for v in values], dtype=torch.float64)[:, None]

    return Params(col(alpha), col(sigma), col(lam), col(omega), col(TEACHER_A[a][0][0] for a in teacher_A),
                  col(TEACHER_A[a][1][1] for a in teacher_A))


# ---------------------------------------------------------------------------------------------------------
# The channel: the loss, the proximal step, the hat update
# ---------------------------------------------------------------------------------------------------------


def attention_diagonal(h1: torch.Tensor, h2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The diagonal of the row-wise softmax of the 2×2 logits h_l h_k: sig(h₁(h₁ − h₂)), sig(h₂(h₂ − h₁))."""
    return torch.sigmoid(h1 * (h1 - h2)), torch.sigmoid(h2 * (h2 - h1))


def _objective(x1, x2, w1, w2, y11, y22, inv_v, two_sigma2):
    """Σ_l (x_l − w_l)²/V + 2ℓ(x; h*), ℓ = σ²[(s₁ − Y₁₁)² + (s₂ − Y₂₂)²]: all (P, N)."""
    s1, s2 = attention_diagonal(x1, x2)
    return ((x1 - w1) ** 2 + (x2 - w2) ** 2) * inv_v + two_sigma2 * ((s1 - y11) ** 2 + (s2 - y22) ** 2)


def proximal(w1: torch.Tensor, w2: torch.Tensor, y11: torch.Tensor, y22: torch.Tensor, V: torch.Tensor,
             sigma: torch.Tensor, start: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The local minimum of Σ_l (x_l − w_l)²/V + 2ℓ(x; h*) reached from `start` (default x = (0, 0)), for every
    node at once.

    w1, w2, y11, y22 (P, N); V, sigma (P, 1) or (P, N); start (2, P, N). Returns p (2, P, N), the objective there
    (P, N) and, per point, whether every node converged (P,) bool. Damped Newton: with a = x₁(x₁ − x₂),
    b = x₂(x₂ − x₁) and s = sig(a), sig(b), the loss's Hessian is 2σ²·2·Σ[(s'² + r s'')∇a∇aᵀ + r s' ∇²a],
    shifted where the objective's is not positive definite, and each step is halved until the objective decreases
    by the Armijo margin. Nodes leave the batch as they converge (most take 5-8 steps, a few in flat regions 20)."""
    shape = w1.shape
    w1_, w2_, y11_, y22_, inv_v, c = (t.expand(shape).reshape(-1) for t in (w1, w2, y11, y22, 1.0 / V,
                                                                            2.0 * sigma ** 2))
    x = torch.zeros(2, w1.numel(), dtype=w1.dtype) if start is None else start.reshape(2, -1).clone()
    idx = torch.arange(w1.numel())  # the nodes still iterating, and their inputs (compacted as nodes finish)
    x1, x2 = x[0], x[1]
    for _ in range(NEWTON_ITERS):
        s1, s2 = attention_diagonal(x1, x2)
        r1, r2 = s1 - y11_, s2 - y22_
        d1, d2 = s1 * (1 - s1), s2 * (1 - s2)  # sig'
        a1, a2, b1, b2 = 2 * x1 - x2, -x1, -x2, 2 * x2 - x1  # ∇a, ∇b
        k1, k2 = r1 * d1, r2 * d2
        e1, e2 = x1 - w1_, x2 - w2_
        g1 = 2 * e1 * inv_v + 2 * c * (k1 * a1 + k2 * b1)
        g2 = 2 * e2 * inv_v + 2 * c * (k1 * a2 + k2 * b2)
        moving = torch.maximum(g1.abs(), g2.abs()) >= NEWTON_TOL
        c1 = 2 * c * (d1 * d1 + r1 * d1 * (1 - 2 * s1))  # 2σ²·2·(s'² + r s'')
        c2 = 2 * c * (d2 * d2 + r2 * d2 * (1 - 2 * s2))
        h11 = 2 * inv_v + c1 * a1 * a1 + c2 * b1 * b1 + 4 * c * k1  # ∇²a = [[2, −1], [−1, 0]]
        h22 = 2 * inv_v + c1 * a2 * a2 + c2 * b2 * b2 + 4 * c * k2  # ∇²b = [[0, −1], [−1, 2]]
        h12 = c1 * a1 * a2 + c2 * b1 * b2 - 2 * c * (k1 + k2)
        lowest = 0.5 * (h11 + h22 - torch.sqrt((h11 - h22) * (h11 - h22) + 4 * h12 * h12))
        # Where the Hessian is not positive definite, shift it so that its lowest eigenvalue becomes |lowest|
        # (at least 1e-3/V): a descent direction whose length along negative curvature stays moderate.
        shift = torch.where(lowest < 1e-3 * inv_v, torch.clamp(-lowest, min=1e-3 * inv_v) - lowest, 0.0)
        h11, h22 = h11 + shift, h22 + shift
        det = h11 * h22 - h12 * h12
        p1, p2 = (h12 * g2 - h22 * g1) / det, (h12 * g1 - h11 * g2) / det
        # Short steps: a long one can jump a barrier into a lower basin that descent from the start never reaches
        cap = torch.clamp(STEP_CAP / torch.maximum(p1.abs(), p2.abs()), max=1.0)
        p1, p2 = p1 * cap, p2 * cap
        f = (e1 * e1 + e2 * e2) * inv_v + c * (r1 * r1 + r2 * r2)
        bound = f + ROUNDOFF * f.abs()  # near the minimum a step may only win rounding noise
        slope = ARMIJO * (g1 * p1 + g2 * p2)
        t = torch.ones_like(x1)
        trial = _objective(x1 + p1, x2 + p2, w1_, w2_, y11_, y22_, inv_v, c)
        todo = torch.nonzero(trial > bound + slope).reshape(-1)
        for _ in range(HALVINGS):  # backtracking: only the nodes whose step is still too long are re-evaluated
            if len(todo) == 0:
                break
            t[todo] *= 0.5
            sub = [v[todo] for v in (x1, x2, p1, p2, w1_, w2_, y11_, y22_, inv_v, c, t, bound, slope)]
            trial = _objective(sub[0] + sub[10] * sub[2], sub[1] + sub[10] * sub[3], *sub[4:10])
            todo = todo[trial > sub[11] + sub[10] * sub[12]]
        x1, x2 = x1 + t * p1, x2 + t * p2
        still = int(moving.sum())
        if still == 0:
            break
        # Nodes that have converged leave the batch once they are a quarter of it: until then they take
        # vanishing steps, cheaper than compacting nine arrays every step
        if still < COMPACT * len(idx):
            x[0, idx], x[1, idx] = x1, x2
            idx, x1, x2, w1_, w2_, y11_, y22_, inv_v, c = (
                v[moving] for v in (idx, x1, x2, w1_, w2_, y11_, y22_, inv_v, c))
            moving = moving[moving]
    x[0, idx], x[1, idx] = x1, x2
    ok = torch.ones(shape[0], dtype=torch.bool)
    ok[idx[moving] // shape[1]] = False  # a point with a node that did not converge
    x = x.reshape(2, *shape)
    return x, _objective(x[0], x[1], w1, w2, y11, y22, 1.0 / V, 2.0 * sigma ** 2), ok


def _channel_inputs(q, m, theta, sigma, omega, a11, a22, xi1, xi2, y1, y2):
    """At nodes (ξ, y) of a state (all broadcast together): √q, V* = √(ρ − θ²/q), the student's w₁, w₂ and the
    teacher's mixing diagonal Y₁₁, Y₂₂."""
    sq = torch.sqrt(q)
    v_star = torch.sqrt(sigma ** 2 - theta ** 2 / q)
    w1, w2 = sq * xi1 + m, sq * xi2 - m
    h1, h2 = v_star * y1 + theta / sq * xi1, v_star * y2 + theta / sq * xi2
    t1, t2 = attention_diagonal(h1, h2)
    return sq, v_star, w1, w2, (1 - omega) * t1 + omega * a11, (1 - omega) * t2 + omega * a22


@dataclass
class Channel:
    """What one evaluation of the channel gives per point (all (P,)): the hats, E[min_x ...] and ε_g."""

    q_hat: torch.Tensor
    m_hat: torch.Tensor
    theta_hat: torch.Tensor
    V_hat: torch.Tensor
    energy: torch.Tensor  # E[min_x Σ_l (x_l − w_l)²/V + 2ℓ(x; h*)]
    eps_g: torch.Tensor
    ok: torch.Tensor  # bool: every node's proximal step converged
    prox: torch.Tensor  # (2, P, N): the proximal points


def channel(state: torch.Tensor, p: Params, quad: Quadrature, start: torch.Tensor | None = None) -> Channel:
    """The hat update of docs/theory.md and ε_g at state (4, P) = (q, m, θ, V); the proximal steps start at (0, 0),
    or at `start` (2, P, N)."""
    q, m, theta, V = (s[:, None] for s in state)  # (P, 1) each
    xi1, xi2, y1, y2 = quad.nodes  # (N,) or (P, N) each
    sq, v_star, w1, w2, y11, y22 = _channel_inputs(q, m, theta, p.sigma, p.omega, p.a11, p.a22, xi1, xi2, y1, y2)
    prox, energy, ok = proximal(w1, w2, y11, y22, V, p.sigma, start)
    f1, f2 = (prox[0] - w1) / V, (prox[1] - w2) / V
    alpha = p.alpha[:, 0]
    theta_hat = alpha * quad.mean(f1 * y1 + f2 * y2) / v_star[:, 0]
    s1, s2 = attention_diagonal(w1, w2)  # ε_g: the student's attention at h = w, no proximal step
    return Channel(
        q_hat=alpha * quad.mean(f1 * f1 + f2 * f2),
        m_hat=alpha * quad.mean(f1 - f2),
        theta_hat=theta_hat,
        V_hat=-alpha * quad.mean(f1 * xi1 + f2 * xi2) / sq[:, 0] + theta[:, 0] * theta_hat / q[:, 0],
        energy=quad.mean(energy),
        eps_g=p.sigma[:, 0] ** 2 * quad.mean((s1 - y11) ** 2 + (s2 - y22) ** 2),
        ok=ok, prox=prox)


def prior(hat: Channel, p: Params) -> torch.Tensor:
    """The prior update of docs/theory.md: the new state (4, P) = (q, m, θ, V) from the hats."""
    s2, lam = p.sigma[:, 0] ** 2, p.lam[:, 0]
    rho = s2
    D = lam + s2 * hat.V_hat
    q = s2 * (s2 * hat.q_hat + hat.m_hat ** 2 + s2 * rho * hat.theta_hat ** 2) / D ** 2
    return torch.stack([q, hat.m_hat / D, s2 * rho * hat.theta_hat / D, s2 / D])


def free_energy(state: torch.Tensor, hat: Channel, p: Params) -> torch.Tensor:
    """Φ of docs/theory.md at state (4, P) with its hats (the training loss is −Φ): (P,)."""
    q, m, theta, V = state
    s2, lam, alpha = p.sigma[:, 0] ** 2, p.lam[:, 0], p.alpha[:, 0]
    rho = s2
    D = lam + s2 * hat.V_hat
    return ((hat.V_hat * q - hat.q_hat * V) / 2 - m * hat.m_hat - theta * hat.theta_hat
            + (s2 * hat.q_hat + hat.m_hat ** 2 + s2 * rho * hat.theta_hat ** 2) / (2 * D) - alpha / 2 * hat.energy)


def _valid(state: torch.Tensor, p: Params) -> torch.Tensor:
    """(P,) bool: the state is finite and inside the region where the channel is defined."""
    q, _, theta, V = state
    return torch.isfinite(state).all(0) & (q > 0) & (V > 0) & (theta ** 2 < p.sigma[:, 0] ** 2 * q)


# ---------------------------------------------------------------------------------------------------------
# The switch: where, on each line along ζ, the proximal point flips between the mirror minima
# ---------------------------------------------------------------------------------------------------------


def _asymmetry(state: torch.Tensor, p: Params, outer: OuterRule, row: torch.Tensor, col: torch.Tensor,
               zeta: torch.Tensor) -> torch.Tensor:
    """p₁ − p₂ of the proximal point reached from (0, 0) at S nodes: point `row`, outer node `col`, ζ = `zeta`
    (all (S,)). Its sign says which mirror minimum the node falls into."""
    q, m, theta, V = state[:, row]
    eta, y1, y2 = outer.nodes[:, col]
    pick = [getattr(p, k)[row, 0] for k in ("sigma", "omega", "a11", "a22")]
    _, _, w1, w2, y11, y22 = _channel_inputs(q, m, theta, *pick, (eta + zeta) / math.sqrt(2),
                                             (eta - zeta) / math.sqrt(2), y1, y2)
    prox, _, _ = proximal(w1[None], w2[None], y11[None], y22[None], V[None], pick[0][None])
    return prox[0, 0] - prox[1, 0]


def locate_switches(state: torch.Tensor, p: Params, outer: OuterRule, centre: torch.Tensor | None = None,
                    keep: tuple[torch.Tensor, torch.Tensor] | None = None, half: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The switch ζ* on each outer line of each point of `state` (4, P): where the sign of p₁ − p₂ changes.
    Returns ζ* and its bracket lo, hi (P, N_o each), no wider than SWITCH_TOL.

    A bracket in `keep` (lo, hi) that the prediction `centre` stays inside, and that still holds the switch, is
    kept: F then stays a continuous function of the state while the switches move inside their brackets
    (Newton's last steps). Others are looked for in centre ± half (a prediction, e.g. from a nearby state, and
    its likely error (P, N_o); at least SWITCH_TOL) or, without one, in ζ_c ± SWITCH_START (ζ_c = −√2 m/√q); a
    bracket the switch is not in is moved past its wrong end and widened SWITCH_GROW-fold per try (up to
    ±ZETA_SPAN), then bisected (cut in up to MULTISECTION pieces once few are left). ζ* is interpolated linearly
    in p₁ − p₂ inside its bracket: where the flip is a steep continuous passage, it follows the state smoothly. A
    line whose sign does not change inside ±ZETA_SPAN gets ζ* at that end."""
    n_points, n_outer = state.shape[1], outer.weights.numel()
    row = torch.arange(n_points)[:, None].expand(n_points, n_outer).reshape(-1)
    col = torch.arange(n_outer)[None, :].expand(n_points, n_outer).reshape(-1)

    def ends(at: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = _asymmetry(state, p, outer, torch.cat([row[at], row[at]]), torch.cat([col[at], col[at]]),
                       torch.cat([lo, hi]))
        return u[:len(at)], u[len(at):]

    if centre is None:
        centre = (-math.sqrt(2) * state[1] / torch.sqrt(state[0]))[:, None].expand(n_points, n_outer)
        half = torch.tensor(SWITCH_START)
    else:  # a good prediction is still off by up to half a bracket: one halving follows
        half = torch.tensor(SWITCH_TOL) if half is None else half.clamp(min=SWITCH_TOL)
        lost = ~(torch.isfinite(centre) & torch.isfinite(half))  # a prediction gone wild: look afresh
        if lost.any():
            fresh = (-math.sqrt(2) * state[1] / torch.sqrt(state[0]))[:, None].expand(n_points, n_outer)
            centre = torch.where(lost, fresh, centre)
            half = torch.where(lost, SWITCH_START, half.expand(n_points, n_outer))
    new_lo = (centre - half).clamp(-ZETA_SPAN, ZETA_SPAN).reshape(-1)
    new_hi = (centre + half).clamp(-ZETA_SPAN, ZETA_SPAN).reshape(-1)
    lo, hi = new_lo.clone(), new_hi.clone()
    kept = torch.zeros(len(lo), dtype=torch.bool)
    if keep is not None:  # the brackets the prediction stays inside are tried as they are
        kept = (keep[0] <= centre).reshape(-1) & (centre <= keep[1]).reshape(-1)
        lo, hi = torch.where(kept, keep[0].reshape(-1), lo), torch.where(kept, keep[1].reshape(-1), hi)
    u_lo, u_hi = ends(torch.arange(len(lo)), lo, hi)
    lost = torch.nonzero(kept & ~((u_lo < 0) & (u_hi >= 0))).reshape(-1)
    if len(lost):  # a kept bracket the switch has left after all: the prediction's
        lo[lost], hi[lost] = new_lo[lost], new_hi[lost]
        u_lo[lost], u_hi[lost] = ends(lost, lo[lost], hi[lost])
    while True:  # move the brackets the switch is not in past their wrong end, wider each time
        left = (u_lo >= 0) & (lo > -ZETA_SPAN)
        right = (u_hi < 0) & (hi < ZETA_SPAN) & ~left
        grow = SWITCH_GROW * torch.clamp(hi - lo, min=SWITCH_TOL)
        hi, u_hi = torch.where(left, lo, hi), torch.where(left, u_lo, u_hi)
        lo = torch.where(left, (lo - grow).clamp(min=-ZETA_SPAN), lo)
        lo, u_lo = torch.where(right, hi, lo), torch.where(right, u_hi, u_lo)
        hi = torch.where(right, (hi + grow).clamp(max=ZETA_SPAN), hi)
        moved = torch.nonzero(left | right).reshape(-1)
        if len(moved) == 0:
            break
        u = _asymmetry(state, p, outer, row[moved], col[moved], torch.where(left[moved], lo[moved], hi[moved]))
        u_lo[moved] = torch.where(left[moved], u, u_lo[moved])
        u_hi[moved] = torch.where(left[moved], u_hi[moved], u)
    none = (u_lo >= 0) | (u_hi < 0)  # no sign change inside ±ZETA_SPAN
    edge = torch.where(u_lo >= 0, lo, hi)
    lo, hi = torch.where(none, edge, lo), torch.where(none, edge, hi)
    while True:  # bisection, or K-section once few brackets are left (a call costs about the same either way)
        todo = torch.nonzero(hi - lo > SWITCH_TOL).reshape(-1)
        if len(todo) == 0:
            break
        k = max(2, min(MULTISECTION, SECTION_POINTS // len(todo)))
        inner = lo[todo, None] + (hi - lo)[todo, None] * torch.arange(1, k, dtype=lo.dtype) / k  # (T, k − 1)
        u = _asymmetry(state, p, outer, row[todo].repeat_interleave(k - 1), col[todo].repeat_interleave(k - 1),
                       inner.reshape(-1)).reshape(len(todo), k - 1)
        below = (u < 0).sum(1)  # the switch lies past this many inner points (the sign changes once)
        at_lo, at_hi = (below - 1).clamp(min=0), below.clamp(max=k - 2)
        pick = torch.arange(len(todo))
        new_lo = torch.where(below > 0, inner[pick, at_lo], lo[todo])
        new_u_lo = torch.where(below > 0, u[pick, at_lo], u_lo[todo])
        new_hi = torch.where(below < k - 1, inner[pick, at_hi], hi[todo])
        new_u_hi = torch.where(below < k - 1, u[pick, at_hi], u_hi[todo])
        lo[todo], u_lo[todo], hi[todo], u_hi[todo] = new_lo, new_u_lo, new_hi, new_u_hi
    span = u_hi - u_lo
    inside = torch.where(span > 0, -u_lo / torch.where(span > 0, span, 1.0), 0.0).clamp(0, 1)
    shape = (n_points, n_outer)
    return (lo + (hi - lo) * inside).reshape(shape), lo.reshape(shape), hi.reshape(shape)


# ---------------------------------------------------------------------------------------------------------
# The fixed point: Newton's method on F(x) − x, batched over points
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Evaluation:
    """The map at a batch of states: F(x) (4, P), the hats there, and the switches (P, N_o) it was integrated
    with and their brackets."""

    new: torch.Tensor
    hat: Channel
    switch: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor

    def rows(self, keep: torch.Tensor) -> "_Evaluation":
        """The points `keep` (the hats are not needed after the rows are chosen, so they are not cut)."""
        return _Evaluation(self.new[:, keep], self.hat, self.switch[keep], self.lo[keep], self.hi[keep])


def _evaluate(state: torch.Tensor, p: Params, outer: OuterRule, k: int, centre: torch.Tensor | None,
              keep: tuple[torch.Tensor, torch.Tensor] | None = None, half: torch.Tensor | None = None
              ) -> _Evaluation:
    """F at state (4, P) on the split rule, every proximal step from (0, 0); `centre` ± `half` predicts the
    switches and brackets in `keep` that still hold them are kept (locate_switches)."""
    switch, lo, hi = locate_switches(state, p, outer, centre, keep, half)
    hat = channel(state, p, split_quadrature(switch, outer, k))
    return _Evaluation(prior(hat, p), hat, switch, lo, hi)


def _free(branch: Sequence[str], p: Params) -> torch.Tensor:
    """(4, P) bool: the coordinates Newton solves for. A branch's symmetric coordinate stays at 0: θ on the
    positional branch (y → −y), m on the semantic branch when the teacher's A is symmetric (tokens 1 ↔ 2)."""
    free = torch.ones(4, len(branch), dtype=torch.bool)
    positional = torch.tensor([b == "positional" for b in branch])
    free[2] = ~positional
    free[1] = positional | (p.a11[:, 0] != p.a22[:, 0])
    return free


@dataclass
class _Solved:
    """One point's outcome, kept to continue from: state (4,), the Jacobians of F − id (4, 4) and of the
    switches (N_o, 4), the switches (N_o,), ε_g, Φ, map evaluations spent, status."""

    state: torch.Tensor
    jacobian: torch.Tensor | None
    switch_jacobian: torch.Tensor | None
    switch: torch.Tensor | None
    eps_g: float
    phi: float
    iterations: int
    status: str


def _jacobians(state: torch.Tensor, base: _Evaluation, p: Params, free: torch.Tensor, outer: OuterRule,
               k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """By forward differences in the free coordinates (steps JACOBIAN_STEP relative, far beyond SWITCH_TOL in
    the switches' movement, which is part of the map's response): the Jacobian of F(x) − x (P, 4, 4), −1 on the
    diagonal of the fixed coordinates, and each switch's gradient in the state (P, N_o, 4)."""
    n_points = state.shape[1]
    jac = -torch.eye(4, dtype=torch.float64).repeat(n_points, 1, 1)
    moves = torch.zeros(*base.switch.shape, 4, dtype=torch.float64)
    for j in range(4):
        if not free[j].any():
            continue
        step = JACOBIAN_STEP * torch.clamp(state[j].abs(), min=1e-2)
        moved = state.clone()
        moved[j] += step
        ev = _evaluate(moved, p, outer, k, base.switch)
        column = (ev.new - base.new) / step - torch.eye(4, dtype=torch.float64)[:, j:j + 1]
        jac[:, :, j] = torch.where(free[j], column, jac[:, :, j].T).T
        moves[:, :, j] = torch.where(free[j][:, None], (ev.switch - base.switch) / step[:, None], 0.0)
    return jac, moves


def _broyden(jac: torch.Tensor, step: torch.Tensor, change: torch.Tensor, use: torch.Tensor) -> torch.Tensor:
    """Broyden's update of a batch of Jacobians (P, R, 4) from a step (P, 4) that changed the values by
    `change` (P, R), in the rows where `use` (P, R) holds: the others (steps whose effect is lost in the noise
    of the switches' location) are left as they were."""
    size = (step * step).sum(1)
    miss = change - (jac @ step[:, :, None])[:, :, 0]
    update = miss[:, :, None] * step[:, None, :] / torch.where(size > 0, size, 1.0)[:, None, None]
    return jac + torch.where((use & (size > 0)[:, None])[:, :, None], update, 0.0)


def _newton(state: torch.Tensor, p: Params, free: torch.Tensor, jacobian: torch.Tensor | None,
            switch_jacobian: torch.Tensor | None, centre: torch.Tensor | None, outer: OuterRule, solver: Solver,
            guard: torch.Tensor | None = None, half: torch.Tensor | None = None) -> list[_Solved]:
    """Newton's method on G(x) = F(x) − x from state (4, P) for P points at once (each leaves the batch when it
    has converged or failed). The Jacobians (of G, (P, 4, 4), and of the switches, (P, N_o, 4)) are given or
    computed by finite differences, updated by Broyden's rule after each step and recomputed every REFRESH_AFTER
    steps without convergence; each step keeps the last step's switch brackets that still hold and predicts the
    other switches from the last ones by their Jacobian, looking first within PREDICTION_ERROR of the movement
    (`centre` ± `half` (P, N_o) predicts the first); a step that leaves the region where the channel is defined
    is halved. Converged: |G| < solver.tol in q, m and θ, with every proximal step converged; a point that is
    not within solver.max_iter evaluations has status NOT_CONVERGED. With `guard` (4, P), a point whose guard·x
    falls below LOST (its branch's coordinate, signed) has left its branch: it stops there, BRANCH_ENDED."""
    n_points = state.shape[1]
    results: list[_Solved | None] = [None] * n_points
    active = torch.arange(n_points)
    x = torch.where(free, state, 0.0)
    ev = _evaluate(x, p, outer, solver.zeta_nodes, centre, half=half)
    used = torch.ones(n_points, dtype=torch.long)
    jac, sjac = jacobian, switch_jacobian
    since = torch.zeros(n_points, dtype=torch.long)  # Newton steps since the Jacobians were computed
    while True:
        pa, fa = p.rows(active), free[:, active]
        G = torch.where(fa, ev.new - x, 0.0)
        ok = ev.hat.ok & _valid(x, pa) & torch.isfinite(ev.new).all(0)
        done = ok & (G[:3].abs().amax(0) < solver.tol)
        lost = (guard * x).sum(0) < LOST if guard is not None else torch.zeros_like(done)
        failed = ~ok | lost | (used >= solver.max_iter) & ~done
        if (done | failed).any():
            phi = free_energy(x, ev.hat, pa)
            for i in torch.nonzero(done | failed).reshape(-1).tolist():
                status = BRANCH_ENDED if bool(lost[i]) else CONVERGED if bool(done[i]) else NOT_CONVERGED
                results[int(active[i])] = _Solved(
                    x[:, i].clone(), None if jac is None else jac[i].clone(), None if sjac is None else sjac[i],
                    ev.switch[i], float(ev.hat.eps_g[i]), float(phi[i]), int(used[i]), status)
            keep = ~(done | failed)
            if not keep.any():
                return results  # type: ignore[return-value]
            active, x, G, used, since, fa = active[keep], x[:, keep], G[:, keep], used[keep], since[keep], fa[:, keep]
            jac, sjac = (None, None) if jac is None else (jac[keep], sjac[keep])
            guard = guard[:, keep] if guard is not None else None
            ev = ev.rows(keep)
            pa = pa.rows(keep)
        stale = torch.ones_like(since, dtype=torch.bool) if jac is None else since >= REFRESH_AFTER
        if stale.any():  # only the stale points take the new Jacobians: no point's numbers depend on the others
            fresh, fresh_s = _jacobians(x, ev, pa, fa, outer, solver.zeta_nodes)
            jac = fresh if jac is None else torch.where(stale[:, None, None], fresh, jac)
            sjac = fresh_s if sjac is None else torch.where(stale[:, None, None], fresh_s, sjac)
            used += torch.where(stale, fa.sum(0), 0)
            since = torch.where(stale, 0, since)
        step = torch.where(fa, -torch.linalg.solve(jac, G.T).T, 0.0)  # (4, P'); zero in the fixed coordinates
        for _ in range(30):  # halve the steps that leave the channel's domain
            bad = ~_valid(x + step, pa)
            if not bad.any():
                break
            step = torch.where(bad, step / 2, step)
        x_new = x + step
        movement = (sjac @ step.T[:, :, None])[:, :, 0]
        new = _evaluate(x_new, pa, outer, solver.zeta_nodes, ev.switch + movement, (ev.lo, ev.hi),
                        PREDICTION_ERROR * movement.abs())
        used += 1
        since += 1
        # A step below NOISE_STEP (relative) changes F by less than the switches' location noise does
        big = ((step.abs() / torch.clamp(x.abs(), min=1e-2)).amax(0) > NOISE_STEP)[:, None]
        jac = _broyden(jac, step.T, torch.where(fa, new.new - x_new, 0.0).T - G.T, big.expand(-1, 4))
        moved = new.switch - ev.switch
        sjac = _broyden(sjac, step.T, moved, moved.abs() > 100 * SWITCH_TOL)
        x, ev = x_new, new


def _approach(state: torch.Tensor, p: Params, solver: Solver) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/theory.md's damped iteration on the 4-D tensor Gauss–Hermite rule (each proximal step starting where the
    last one ended), from state (4, P), each point until its step changes q, m and θ by less than APPROACH_TOL
    (or would leave the channel's domain, or APPROACH_ITERS pass): a start for Newton near the branch's fixed
    point. Returns the states and each point's iterations (P,)."""
    quad = Quadrature.gauss_hermite(solver.nodes)
    warm = None
    done = torch.zeros(state.shape[1], dtype=torch.bool)
    spent = torch.zeros(state.shape[1], dtype=torch.long)
    for _ in range(APPROACH_ITERS):
        hat = channel(state, p, quad, warm)
        new = solver.damping * state + (1 - solver.damping) * prior(hat, p)
        leaves = ~_valid(new, p)
        spent += ~done
        small = (new[:3] - state[:3]).abs().amax(0) < APPROACH_TOL
        state = torch.where(done | leaves, state, new)
        done |= leaves | small
        warm = hat.prox
        if bool(done.all()):
            break
    return state, spent


# ---------------------------------------------------------------------------------------------------------
# Continuation in α from the anchor
# ---------------------------------------------------------------------------------------------------------


def _lattice_next(alpha: float, up: bool) -> float:
    """The lattice point after `alpha` (a lattice point) going away from the anchor, up or down."""
    if not up:
        return round(alpha - LATTICE_STEP, 12)
    return round(alpha + LATTICE_STEP if alpha < LATTICE_LINEAR_MAX - 1e-9 else alpha * (1 + LATTICE_STEP / 4), 12)


def lattice_path(alpha: float, anchor: float) -> list[float]:
    """The lattice points a point at α is reached through, from the anchor (included) to the last one before α,
    or to α itself when it is one: e.g. 2.0, 1.95, ..., then α is solved from the last of them."""
    path, up = [anchor], alpha > anchor
    while True:
        if abs(path[-1] - alpha) < 1e-9:
            return path
        nxt = _lattice_next(path[-1], up)
        if (nxt > alpha + 1e-9) if up else (nxt < alpha - 1e-9 or nxt < LATTICE_STEP - 1e-9):
            return path
        path.append(nxt)


Track = tuple  # (sigma, lam, omega, teacher_A, branch): one branch of one problem


class Continuation:
    """Fixed points of docs/theory.md reached by continuation from an anchor (the first of ANCHORS where the branch is
    found; the module docstring says why), for any set of problems and branches. Solved points are kept, per
    track and α, so that later requests (e.g. alpha_c's root search) continue from them; a point's value depends
    only on its track and α."""

    def __init__(self, solver: Solver = Solver()) -> None:
        self.solver = solver
        self.outer = OuterRule.gauss_hermite(solver.nodes)
        self._done: dict[tuple[Track, float], _Solved] = {}
        self._anchors: dict[Track, float | None] = {}  # None: the branch is found at no anchor

    def solve(self, alpha: Sequence[float], branch: Sequence[str], sigma: Sequence[float], lam: Sequence[float],
              omega: Sequence[float], teacher_A: Sequence[str]) -> pd.DataFrame:
        """One row per point (one value per point in each argument) with COLUMNS."""
        for b in branch:
            check_choice("branch", b, BRANCHES)
        make_params(alpha, sigma, lam, omega, teacher_A)  # every value checked before any work
        points = [((float(s), float(la), float(o), str(a), b), round(float(x), 12))
                  for x, b, s, la, o, a in zip(alpha, branch, sigma, lam, omega, teacher_A)]
        unique = list(dict.fromkeys(points))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # see ONE_THREAD
        try:
            self._anchor(sorted({t for t, _ in points} - set(self._anchors)))
            for t, a in unique:
                if self._anchors[t] is None:
                    self._done[(t, a)] = _Solved(torch.full((4,), math.nan, dtype=torch.float64), None, None, None,
                                                 math.nan, math.nan, 0, NO_ANCHOR)
            anchored = [(t, a) for t, a in unique if self._anchors[t] is not None]
            paths = {(t, a): lattice_path(a, self._anchors[t]) for t, a in anchored}
            self._walk(paths)
            self._step([(t, a, paths[(t, a)]) for t, a in anchored if (t, a) not in self._done])
        finally:
            torch.set_num_threads(threads)
        rows = []
        for (track, a), asked in zip(points, alpha):
            got = self._done[(track, a)]
            ok = got.status == CONVERGED
            values = got.state.tolist() if ok else [math.nan] * 4
            rows.append({"alpha": float(asked), "branch": track[4], **dict(zip(ORDER, values)),
                         "eps_g": got.eps_g if ok else math.nan, "phi": got.phi if ok else math.nan,
                         "iterations": got.iterations, "converged": ok, "status": got.status})
        return pd.DataFrame(rows, columns=list(COLUMNS))

    def _params(self, batch: Sequence[tuple[Track, float]]) -> Params:
        return make_params([a for _, a in batch], [t[0] for t, _ in batch], [t[1] for t, _ in batch],
                           [t[2] for t, _ in batch], [t[3] for t, _ in batch])

    def _anchor(self, tracks: Sequence[Track]) -> None:
        """Each track's anchor and its fixed point there: at each of ANCHORS in turn, the documented damped iteration
        from the branch's start, then Newton; the first where that converges on the branch is the track's anchor."""
        todo = list(tracks)
        for anchor in ANCHORS:
            if not todo:
                return
            batch = [(t, anchor) for t in todo]
            p = self._params(batch)
            start = torch.tensor([BRANCH_START[t[4]] for t in todo], dtype=torch.float64).T
            near, spent = _approach(start, p, self.solver)
            solved = _newton(near, p, _free([t[4] for t in todo], p), None, None, None, self.outer, self.solver)
            missed = []
            for track, got, approach in zip(todo, solved, spent.tolist()):
                if got.status == CONVERGED and not _off_branch(track, got.state, None):
                    got.iterations += approach
                    self._anchors[track], self._done[(track, anchor)] = anchor, got
                else:
                    missed.append(track)
            todo = missed
        for track in todo:
            self._anchors[track] = None

    def _walk(self, paths: dict[tuple[Track, float], list[float]]) -> None:
        """Every lattice point on the given paths, in lockstep over the tracks: step i solves each path's i-th
        point from its (i−1)-th."""
        needed: dict[tuple[Track, float], list[float]] = {}
        for (track, _), path in paths.items():
            key = (track, path[-1] > path[0])
            if len(path) > len(needed.get(key, [])):
                needed[key] = path
        for i in range(1, max((len(p) for p in needed.values()), default=0)):
            self._step([(track, path[i], path[:i]) for (track, _), path in needed.items()
                        if len(path) > i and (track, path[i]) not in self._done])

    def _step(self, todo: Sequence[tuple[Track, float, Sequence[float]]], depth: int = 0) -> None:
        """Solve each (track, α) from the last point of its path, its state and switches extrapolated by the
        polynomial through the last PREDICTOR_POINTS converged ones. A point whose predecessor is not on the branch
        inherits that status. Where Newton fails, the step is halved (the midpoint solved first), up to
        STEP_HALVINGS times; failing still, the branch has ended there (a fold: no fixed point nearby)."""
        batch, starts, centres, halves = [], [], [], []
        for track, alpha, path in todo:
            before = self._done[(track, path[-1])]
            if before.status != CONVERGED:
                self._done[(track, alpha)] = replace(before, iterations=0, jacobian=None, switch_jacobian=None,
                                                     switch=None)
                continue
            known = path[-PREDICTOR_POINTS:]  # converged, as their successor `before` is
            weights = _lagrange(known, alpha)
            guess = sum(w * self._done[(track, a)].state for w, a in zip(weights, known))
            centre = sum(w * self._done[(track, a)].switch for w, a in zip(weights, known))
            # the last term's size (the change from one point fewer) bounds the prediction's error
            lower = sum(w * self._done[(track, a)].switch for w, a in zip(_lagrange(known[1:], alpha), known[1:]))
            batch.append((track, alpha, before, path))
            starts.append(guess)
            centres.append(centre)
            halves.append(PREDICTION_ERROR * (centre - lower).abs() if len(known) > 1
                          else torch.full_like(centre, FIRST_STEP_HALF))
        if not batch:
            return
        p = self._params([(t, a) for t, a, _, _ in batch])
        start = torch.stack(starts, 1)
        fallback = torch.stack([b.state for _, _, b, _ in batch], 1)
        valid = _valid(start, p)
        start = torch.where(valid, start, fallback)  # a secant that leaves the domain: no prediction
        centre = torch.where(valid[:, None], torch.stack(centres), torch.stack([b.switch for _, _, b, _ in batch]))
        guard = torch.zeros(4, len(batch), dtype=torch.float64)
        for i, (track, _, before, _) in enumerate(batch):
            j = _coordinate(track)
            guard[j, i] = math.copysign(1.0, float(before.state[j]))
        solved = _newton(start, p, _free([t[4] for t, _, _, _ in batch], p),
                         torch.stack([b.jacobian for _, _, b, _ in batch]),
                         torch.stack([b.switch_jacobian for _, _, b, _ in batch]), centre, self.outer, self.solver,
                         guard, torch.where(valid[:, None], torch.stack(halves), SWITCH_START))
        retry = []
        for (track, alpha, before, path), got in zip(batch, solved):
            if got.status == CONVERGED and _off_branch(track, got.state, before.state):
                got.status = BRANCH_ENDED
            if got.status == NOT_CONVERGED:  # no fixed point found: a shorter step may find one
                if depth < STEP_HALVINGS:
                    retry.append((track, alpha, path))
                    continue
                got.status = BRANCH_ENDED
            self._done[(track, alpha)] = got
        if retry:
            middle = [(track, round((path[-1] + alpha) / 2, 12), path) for track, alpha, path in retry]
            self._step([m for m in middle if (m[0], m[1]) not in self._done], depth + 1)
            self._step([(track, alpha, [*path, mid]) for (track, alpha, path), (_, mid, _) in zip(retry, middle)],
                       depth + 1)


def _lagrange(nodes: Sequence[float], at: float) -> list[float]:
    """The weights that extrapolate values at `nodes` to `at` by the polynomial through them."""
    return [math.prod((at - b) / (a - b) for b in nodes if b != a) for a in nodes]


def _coordinate(track: Track) -> int:
    """The state's row that is nonzero only on the track's branch: θ (semantic) or m (positional)."""
    return 2 if track[4] == "semantic" else 1


def _off_branch(track: Track, state: torch.Tensor, before: torch.Tensor | None) -> bool:
    """Whether a converged state has left its branch: its coordinate (θ semantic, m positional) fell below LOST
    or changed sign from the point it was continued from."""
    j = _coordinate(track)
    value = float(state[j])
    return abs(value) < LOST or (before is not None and value * float(before[j]) < 0)


def _continuation(solver: Solver, given: Continuation | None) -> Continuation:
    """`given`, which must be of `solver`, or a new one."""
    if given is None:
        return Continuation(solver)
    if given.solver != solver:
        raise ConfigError(f"the continuation's solver {given.solver} is not the one asked for, {solver}")
    return given


def fixed_points(alpha: Sequence[float], branch: Sequence[str], *, sigma: Sequence[float], lam: Sequence[float],
                 omega: Sequence[float], teacher_A: Sequence[str], solver: Solver = Solver()) -> pd.DataFrame:
    """The fixed point of P points (one value per point in each argument), each reached by continuation from
    its branch's anchor (`Continuation`), all problems' lattice steps batched together.

    Returns one row per point with COLUMNS: q, m, theta (σ² Q·Q*/d), V, eps_g, phi (Φ; the training loss is
    −Φ), the map evaluations spent on the point, converged and status (CONVERGED, BRANCH_ENDED or NO_ANCHOR;
    every value NaN unless converged)."""
    return Continuation(solver).solve(alpha, branch, sigma, lam, omega, teacher_A)


def theory_curve(alphas: Sequence[float], sigma: float = 0.5, lam: float = 0.01, omega: float = 0.3,
                 teacher_A: str = "default", branches: Sequence[str] = BRANCHES, solver: Solver = Solver(),
                 continuation: Continuation | None = None) -> pd.DataFrame:
    """Every α on every branch: len(alphas)·len(branches) rows, α-major. `continuation` (of the same solver)
    keeps the points solved on the way for later calls (e.g. alpha_c's on the same problem)."""
    pairs = [(a, b) for a in alphas for b in branches]
    n = len(pairs)
    cont = _continuation(solver, continuation)
    return cont.solve([a for a, _ in pairs], [b for _, b in pairs], [sigma] * n, [lam] * n, [omega] * n,
                      [teacher_A] * n)


def simulation_theta(theta: float | np.ndarray, sigma: float | np.ndarray) -> float | np.ndarray:
    """The simulations' θ = |Q*ᵀQ|/d from the theory's θ = σ² Q·Q*/d (sign dropped, as the simulations do)."""
    return np.abs(theta) / np.asarray(sigma) ** 2


# ---------------------------------------------------------------------------------------------------------
# α_c(ω): where the two branches' training losses −Φ cross
# ---------------------------------------------------------------------------------------------------------


def phi_gap(alpha: float, omega: float, sigma: float = 0.5, lam: float = 0.01, teacher_A: str = "default",
            solver: Solver = Solver(), continuation: Continuation | None = None) -> float:
    """Φ_semantic − Φ_positional at one α: > 0 where the semantic branch has the lower training loss −Φ; NaN
    where either branch has no converged point. `continuation` keeps the points solved on the way for later
    calls."""
    cont = _continuation(solver, continuation)
    rows = cont.solve([alpha] * 2, BRANCHES, [sigma] * 2, [lam] * 2, [omega] * 2, [teacher_A] * 2)
    rows = rows.set_index("branch")
    return float(rows.loc["semantic", "phi"] - rows.loc["positional", "phi"])


def alpha_c(omega: float, sigma: float = 0.5, lam: float = 0.01, teacher_A: str = "default",
            solver: Solver = Solver(), start: float | None = None, xtol: float = 1e-4,
            continuation: Continuation | None = None) -> float:
    """α_c(ω), the root of Φ_semantic − Φ_positional (negative below α_c: the positional branch has the lower
    training loss there), by brentq on a bracket found by stepping from `start` (default: the published α_c(ω)
    read at ω, else 1) by 0.05, 0.1, 0.2, ...: upwards while the gap is negative or a branch has no point
    (the semantic branch ends at small α), downwards while it is positive. A ConfigError when no sign change is
    found or a branch has no point inside the bracket. `continuation` (of the same solver) may hold points
    solved before, and keeps those solved here."""
    if start is None:
        omegas = sorted(ALPHA_C_PUBLISHED)
        start = float(np.interp(omega, omegas, [ALPHA_C_PUBLISHED[o] for o in omegas]))
    where = f"omega={omega:g} (sigma={sigma:g}, lam={lam:g}, A={teacher_A})"
    cont = _continuation(solver, continuation)

    def gap(a: float) -> float:
        return phi_gap(a, omega, sigma, lam, teacher_A, solver, cont)

    lo, g_lo = start, gap(start)
    hi, g_hi, step = lo, g_lo, 0.05
    while not g_hi > 0:  # upwards: the last point with a finite negative gap is the lower end
        if g_hi < 0:
            lo, g_lo = hi, g_hi
        hi, step = hi + step, 2 * step
        if hi > 50:
            raise ConfigError(f"no alpha_c up to alpha=50 for {where}: Phi_semantic - Phi_positional stays "
                              f"negative or a branch has no point")
        g_hi = gap(hi)
    while not g_lo < 0:  # downwards from a positive start
        if math.isnan(g_lo) or lo < 1e-2:
            raise ConfigError(f"no alpha_c below alpha={hi:g} for {where}: a branch has no point before "
                              f"Phi_semantic - Phi_positional changes sign")
        hi, g_hi = lo, g_lo
        lo, step = max(lo - step, lo / 2), 2 * step
        g_lo = gap(lo)

    def finite_gap(a: float) -> float:
        value = gap(a)
        if math.isnan(value):
            raise ConfigError(f"a branch has no point at alpha={a:g} inside the bracket [{lo:g}, {hi:g}] "
                              f"of alpha_c for {where}")
        return value

    return float(brentq(finite_gap, lo, hi, xtol=xtol))


# ---------------------------------------------------------------------------------------------------------
# The cache: computed points and α_c values, keyed by their parameters, the solver and THEORY_VERSION
# ---------------------------------------------------------------------------------------------------------

SOLVER_KEYS = ("nodes", "zeta_nodes", "damping", "tol", "max_iter", "version")
POINT_KEYS = ("sigma", "lam", "omega", "teacher_A", "alpha", "branch", *SOLVER_KEYS)
ALPHA_C_KEYS = ("sigma", "lam", "omega", "teacher_A", *SOLVER_KEYS)
CACHE_POINTS, CACHE_ALPHA_C = "student_theory_points.csv", "student_theory_alpha_c.csv"


def _solver_columns(solver: Solver) -> dict[str, object]:
    return {"nodes": solver.nodes, "zeta_nodes": solver.zeta_nodes, "damping": solver.damping, "tol": solver.tol,
            "max_iter": solver.max_iter, "version": THEORY_VERSION}


def _read(path: Path) -> pd.DataFrame | None:
    """A cache file, with the key columns an older version did not write added empty (so they match nothing)."""
    if not path.exists():
        return None
    frame = pd.read_csv(path)
    return frame.assign(**{k: "" for k in SOLVER_KEYS if k not in frame})


def _keyed(frame: pd.DataFrame, keys: Sequence[str]) -> pd.Series:
    """One string per row naming its parameters (floats at 12 significant digits, so CSV round trips match)."""
    parts = [frame[k].map(lambda v: f"{v:.12g}" if isinstance(v, (float, np.floating)) else str(v)) for k in keys]
    return pd.Series(["|".join(row) for row in zip(*parts)], index=frame.index)


def cached_points(points: pd.DataFrame, cache_dir: str | Path, solver: Solver = Solver()) -> pd.DataFrame:
    """The fixed points of `points` (columns sigma, lam, omega, teacher_A, alpha, branch), one row each with the
    point's columns and COLUMNS; those not in <cache_dir>/student_theory_points.csv (for this solver and
    THEORY_VERSION) are computed as one batch and added to it."""
    cache_dir = Path(cache_dir)
    path = cache_dir / CACHE_POINTS
    wanted = points[list(POINT_KEYS[:6])].drop_duplicates().assign(**_solver_columns(solver))
    wanted = wanted.assign(alpha=wanted["alpha"].astype(float), sigma=wanted["sigma"].astype(float),
                           lam=wanted["lam"].astype(float), omega=wanted["omega"].astype(float))
    cached = _read(path)
    known = set() if cached is None else set(_keyed(cached, POINT_KEYS))
    todo = wanted[~_keyed(wanted, POINT_KEYS).isin(known)] if len(wanted) else wanted
    if len(todo):
        solved = fixed_points(todo["alpha"].tolist(), todo["branch"].tolist(), sigma=todo["sigma"].tolist(),
                              lam=todo["lam"].tolist(), omega=todo["omega"].tolist(),
                              teacher_A=todo["teacher_A"].tolist(), solver=solver)
        new = pd.concat([todo.reset_index(drop=True), solved.drop(columns=["alpha", "branch"])], axis=1)
        cached = new if cached is None else pd.concat([cached, new], ignore_index=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
        cached.to_csv(path, index=False)
    if cached is None:
        return pd.DataFrame(columns=[*POINT_KEYS, *COLUMNS[2:]])
    found = cached[_keyed(cached, POINT_KEYS).isin(set(_keyed(wanted, POINT_KEYS)))]
    return found.drop_duplicates(subset=list(POINT_KEYS), keep="last").reset_index(drop=True)


def cached_alpha_c(omegas: Sequence[float], cache_dir: str | Path, sigma: float = 0.5, lam: float = 0.01,
                   teacher_A: str = "default", solver: Solver = Solver()) -> dict[float, float]:
    """α_c(ω) for each ω, from <cache_dir>/student_theory_alpha_c.csv (for this solver and THEORY_VERSION) or
    computed and added to it; an ω where no α_c is found maps to NaN (and is cached as such)."""
    cache_dir = Path(cache_dir)
    path = cache_dir / CACHE_ALPHA_C
    cached = _read(path)
    wanted = pd.DataFrame({"sigma": float(sigma), "lam": float(lam), "omega": [float(o) for o in omegas],
                           "teacher_A": teacher_A, **_solver_columns(solver)})
    found = {} if cached is None else dict(zip(_keyed(cached, ALPHA_C_KEYS), cached["alpha_c"]))
    rows = []
    for key, row in zip(_keyed(wanted, ALPHA_C_KEYS), wanted.itertuples(index=False)):
        if key not in found:
            try:
                found[key] = alpha_c(row.omega, sigma, lam, teacher_A, solver)
            except ConfigError:
                found[key] = math.nan
            rows.append({**row._asdict(), "alpha_c": found[key]})
    if rows:
        cache_dir.mkdir(parents=True, exist_ok=True)
        new = pd.DataFrame(rows)
        (new if cached is None else pd.concat([cached, new], ignore_index=True)).to_csv(path, index=False)
    return {float(o): float(found[k]) for o, k in zip(wanted["omega"], _keyed(wanted, ALPHA_C_KEYS))}
