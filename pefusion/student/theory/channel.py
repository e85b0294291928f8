"""The channel: each point's parameters, the loss, the proximal step, the hat and prior updates and Φ.

Order parameters (L = 2, r = 1, ρ = σ²): q = σ²‖Q‖²/d, m = 1ᵀQ/d, θ = σ² Q·Q*/d, V; the state (4, P) holds them
in that order (ORDER) for P points at once. Every proximal step, at every node of every point, is solved at once,
as (P, N) tensors, by a damped Newton iteration: the Hessian is shifted to be positive definite and each step
backtracks until the objective decreases (Armijo), so every node descends into a local minimum even where the
loss is not convex.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Iterable, NamedTuple, Sequence

import torch

from pefusion.errors import ConfigError, check_choice, check_positive
from pefusion.student.config import TEACHER_A
from pefusion.student.theory.quadrature import Quadrature
from pefusion.student.theory.settings import ProximalSettings

ORDER = ("q", "m", "theta", "V")  # the state's rows


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
        return Params(*(getattr(self, f.name)[keep] for f in fields(self)))


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


def attention_diagonal(h1: torch.Tensor, h2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The diagonal of the row-wise softmax of the 2×2 logits h_l h_k: sig(h₁(h₁ − h₂)), sig(h₂(h₂ − h₁))."""
    return torch.sigmoid(h1 * (h1 - h2)), torch.sigmoid(h2 * (h2 - h1))


class Node(NamedTuple):
    """A node's inputs to the proximal objective, flattened (all (S,)): the student's w₁, w₂, the teacher's mixing
    diagonal Y₁₁, Y₂₂, 1/V and 2σ²."""

    w1: torch.Tensor
    w2: torch.Tensor
    y11: torch.Tensor
    y22: torch.Tensor
    inv_v: torch.Tensor
    two_sigma2: torch.Tensor

    def rows(self, keep: torch.Tensor) -> "Node":
        return Node(*(v[keep] for v in self))


def _objective(x1: torch.Tensor, x2: torch.Tensor, node: Node) -> torch.Tensor:
    """Σ_l (x_l − w_l)²/V + 2ℓ(x; h*), ℓ = σ²[(s₁ − Y₁₁)² + (s₂ − Y₂₂)²]: all of one shape."""
    s1, s2 = attention_diagonal(x1, x2)
    return (((x1 - node.w1) ** 2 + (x2 - node.w2) ** 2) * node.inv_v
            + node.two_sigma2 * ((s1 - node.y11) ** 2 + (s2 - node.y22) ** 2))


class Proximal(NamedTuple):
    """The proximal points (2, P, N), the objective there (P, N) and, per point, whether every node converged
    (P,) bool."""

    point: torch.Tensor
    value: torch.Tensor
    ok: torch.Tensor


def proximal(w1: torch.Tensor, w2: torch.Tensor, y11: torch.Tensor, y22: torch.Tensor, V: torch.Tensor,
             sigma: torch.Tensor, start: torch.Tensor | None = None,
             settings: ProximalSettings = ProximalSettings()) -> Proximal:
    """The local minimum of Σ_l (x_l − w_l)²/V + 2ℓ(x; h*) reached from `start` (default x = (0, 0)), for every
    node at once.

    w1, w2, y11, y22 (P, N); V, sigma (P, 1) or (P, N); start (2, P, N). Damped Newton: with a = x₁(x₁ − x₂),
    b = x₂(x₂ − x₁) and s = sig(a), sig(b), the loss's Hessian is 2σ²·2·Σ[(s'² + r s'')∇a∇aᵀ + r s' ∇²a],
    shifted where the objective's is not positive definite, and each step is halved until the objective decreases
    by the Armijo margin. Nodes leave the batch as they converge (most take 5-8 steps, a few in flat regions 20)."""
    shape = w1.shape
    node = Node(*(t.expand(shape).reshape(-1) for t in (w1, w2, y11, y22, 1.0 / V, 2.0 * sigma ** 2)))
    x = torch.zeros(2, w1.numel(), dtype=w1.dtype) if start is None else start.reshape(2, -1).clone()
    idx = torch.arange(w1.numel())  # the nodes still iterating, and their inputs (compacted as nodes finish)
    x1, x2 = x[0], x[1]
    for _ in range(settings.iters):
        inv_v, c = node.inv_v, node.two_sigma2
        s1, s2 = attention_diagonal(x1, x2)
        r1, r2 = s1 - node.y11, s2 - node.y22
        d1, d2 = s1 * (1 - s1), s2 * (1 - s2)  # sig'
        a1, a2, b1, b2 = 2 * x1 - x2, -x1, -x2, 2 * x2 - x1  # ∇a, ∇b
        k1, k2 = r1 * d1, r2 * d2
        e1, e2 = x1 - node.w1, x2 - node.w2
        g1 = 2 * e1 * inv_v + 2 * c * (k1 * a1 + k2 * b1)
        g2 = 2 * e2 * inv_v + 2 * c * (k1 * a2 + k2 * b2)
        moving = torch.maximum(g1.abs(), g2.abs()) >= settings.tol
        c1 = 2 * c * (d1 * d1 + r1 * d1 * (1 - 2 * s1))  # 2σ²·2·(s'² + r s'')
        c2 = 2 * c * (d2 * d2 + r2 * d2 * (1 - 2 * s2))
        h11 = 2 * inv_v + c1 * a1 * a1 + c2 * b1 * b1 + 4 * c * k1  # ∇²a = [[2, −1], [−1, 0]]
        h22 = 2 * inv_v + c1 * a2 * a2 + c2 * b2 * b2 + 4 * c * k2  # ∇²b = [[0, −1], [−1, 2]]
        h12 = c1 * a1 * a2 + c2 * b1 * b2 - 2 * c * (k1 + k2)
        lowest = 0.5 * (h11 + h22 - torch.sqrt((h11 - h22) * (h11 - h22) + 4 * h12 * h12))
        # Where the Hessian is not positive definite, shift it so that its lowest eigenvalue becomes |lowest|
        # (at least curvature_floor/V): a descent direction whose length along negative curvature stays moderate.
        floor = settings.curvature_floor * inv_v
        shift = torch.where(lowest < floor, torch.clamp(-lowest, min=floor) - lowest, 0.0)
        h11, h22 = h11 + shift, h22 + shift
        det = h11 * h22 - h12 * h12
        p1, p2 = (h12 * g2 - h22 * g1) / det, (h12 * g1 - h11 * g2) / det
        # Short steps: a long one can jump a barrier into a lower basin that descent from the start never reaches
        cap = torch.clamp(settings.step_cap / torch.maximum(p1.abs(), p2.abs()), max=1.0)
        p1, p2 = p1 * cap, p2 * cap
        f = (e1 * e1 + e2 * e2) * inv_v + c * (r1 * r1 + r2 * r2)
        bound = f + settings.roundoff * f.abs()  # near the minimum a step may only win rounding noise
        slope = settings.armijo * (g1 * p1 + g2 * p2)
        t = torch.ones_like(x1)
        trial = _objective(x1 + p1, x2 + p2, node)
        todo = torch.nonzero(trial > bound + slope).reshape(-1)
        for _ in range(settings.halvings):  # backtracking: only the nodes whose step is still too long are re-evaluated
            if len(todo) == 0:
                break
            t[todo] *= 0.5
            t_, p1_, p2_ = t[todo], p1[todo], p2[todo]
            trial = _objective(x1[todo] + t_ * p1_, x2[todo] + t_ * p2_, node.rows(todo))
            todo = todo[trial > bound[todo] + t_ * slope[todo]]
        x1, x2 = x1 + t * p1, x2 + t * p2
        still = int(moving.sum())
        if still == 0:
            break
        # Nodes that have converged leave the batch once they are a quarter of it: until then they take
        # vanishing steps, cheaper than compacting nine arrays every step
        if still < settings.compact * len(idx):
            x[0, idx], x[1, idx] = x1, x2
            idx, x1, x2, node = idx[moving], x1[moving], x2[moving], node.rows(moving)
            moving = moving[moving]
    x[0, idx], x[1, idx] = x1, x2
    ok = torch.ones(shape[0], dtype=torch.bool)
    ok[idx[moving] // shape[1]] = False  # a point with a node that did not converge
    x = x.reshape(2, *shape)
    return Proximal(x, _objective(x[0], x[1], Node(w1, w2, y11, y22, 1.0 / V, 2.0 * sigma ** 2)), ok)


class ChannelInputs(NamedTuple):
    """At nodes (ξ, y) of a state (all broadcast together): √q, V* = √(ρ − θ²/q), the student's w₁, w₂ and the
    teacher's mixing diagonal Y₁₁, Y₂₂."""

    sq: torch.Tensor
    v_star: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    y11: torch.Tensor
    y22: torch.Tensor


def channel_inputs(q, m, theta, sigma, omega, a11, a22, xi1, xi2, y1, y2) -> ChannelInputs:
    """ChannelInputs at the nodes (ξ₁, ξ₂, y₁, y₂) of the state (q, m, θ) with the problem's σ, ω, A₁₁, A₂₂."""
    sq = torch.sqrt(q)
    v_star = torch.sqrt(sigma ** 2 - theta ** 2 / q)
    w1, w2 = sq * xi1 + m, sq * xi2 - m
    h1, h2 = v_star * y1 + theta / sq * xi1, v_star * y2 + theta / sq * xi2
    t1, t2 = attention_diagonal(h1, h2)
    return ChannelInputs(sq, v_star, w1, w2, (1 - omega) * t1 + omega * a11, (1 - omega) * t2 + omega * a22)


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


def channel(state: torch.Tensor, p: Params, quad: Quadrature, start: torch.Tensor | None = None,
            settings: ProximalSettings = ProximalSettings()) -> Channel:
    """The hat update and ε_g at state (4, P) = (q, m, θ, V); the proximal steps start at (0, 0), or at `start`
    (2, P, N)."""
    q, m, theta, V = (s[:, None] for s in state)  # (P, 1) each
    xi1, xi2, y1, y2 = quad.nodes  # (N,) or (P, N) each
    sq, v_star, w1, w2, y11, y22 = channel_inputs(q, m, theta, p.sigma, p.omega, p.a11, p.a22, xi1, xi2, y1, y2)
    prox, energy, ok = proximal(w1, w2, y11, y22, V, p.sigma, start, settings)
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
    """The prior update: the new state (4, P) = (q, m, θ, V) from the hats."""
    s2, lam = p.sigma[:, 0] ** 2, p.lam[:, 0]
    rho = s2
    D = lam + s2 * hat.V_hat
    q = s2 * (s2 * hat.q_hat + hat.m_hat ** 2 + s2 * rho * hat.theta_hat ** 2) / D ** 2
    return torch.stack([q, hat.m_hat / D, s2 * rho * hat.theta_hat / D, s2 / D])


def free_energy(state: torch.Tensor, hat: Channel, p: Params) -> torch.Tensor:
    """Φ at state (4, P) with its hats (the training loss is −Φ): (P,)."""
    q, m, theta, V = state
    s2, lam, alpha = p.sigma[:, 0] ** 2, p.lam[:, 0], p.alpha[:, 0]
    rho = s2
    D = lam + s2 * hat.V_hat
    return ((hat.V_hat * q - hat.q_hat * V) / 2 - m * hat.m_hat - theta * hat.theta_hat
            + (s2 * hat.q_hat + hat.m_hat ** 2 + s2 * rho * hat.theta_hat ** 2) / (2 * D) - alpha / 2 * hat.energy)


def valid(state: torch.Tensor, p: Params) -> torch.Tensor:
    """(P,) bool: the state is finite and inside the region where the channel is defined."""
    q, _, theta, V = state
    return torch.isfinite(state).all(0) & (q > 0) & (V > 0) & (theta ** 2 < p.sigma[:, 0] ** 2 * q)
