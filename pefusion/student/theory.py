"""Study B's d → ∞ prediction: the replica fixed point of SPEC §11, its test error ε_g, free energy Φ and α_c(ω).

Owns the proximal step, the hat and prior updates, the damped iteration from each branch's starting point, ε_g
and Φ at the fixed point, the root α_c(ω) of Φ_semantic − Φ_positional, and a small on-disk cache of computed
points, so that the reports can put the theory beside every simulated point without recomputing it.

Order parameters (L = 2, r = 1, ρ = σ²): q = σ²‖Q‖²/d, m = 1ᵀQ/d, θ = σ² Q·Q*/d, V. Note θ here carries the σ²
of SPEC §11: the simulations' θ = |Q*ᵀQ|/d is θ/σ² (`simulation_theta`).

Why it looks as it does: the expensive part is the proximal point p = argmin_x Σ_l (x_l − w_l)²/V + 2ℓ(x; h*),
needed at every quadrature node of every point at every iteration. It is solved for all of them at once, as
(P, N) tensors (P points, N nodes), by a damped Newton iteration: the Hessian is shifted to be positive definite
and each step backtracks until the objective decreases (Armijo), so every node descends into a local minimum even
where the loss is not convex. The equations ask for the minimum reached from (0, 0); from (0, 0) that takes ~15
Newton steps, from the previous iteration's minimum 2-4, so the damped iteration starts each node where it ended
before and, once a point has converged so, takes one more step from (0, 0): the point is finished only if that
step, too, changes q, m and θ by less than the tolerance. All α values and both branches are rows of one batch; a
point leaves the batch when it has converged (or failed), so the slowest point costs only its own rows. The
expectations over ξ, y ~ N(0, I₂) are one 4-D tensor Gauss–Hermite rule (numpy's `hermgauss`) with the nodes
lighter than 1e-10 dropped (at 12 nodes per axis 58 % of the 20 736 nodes, 1e-7 of the mass). ε_g's expectation
is the same 4-D integral at x = w (no proximal step).
Convergence in the node count is not smooth on the positional branch: where w ≈ 0 the start (0, 0) sits at the
loss's symmetric point x → −x, and which of the two mirror minima a node falls into flips there, a discontinuity
that tensor rules sample unevenly (the README gives the measured spread).

A point whose iteration does not converge within max_iter, or leaves the region where the equations are defined
(q ≤ 0, θ²/q > ρ, non-finite values, a proximal step that did not converge), or a semantic start that settles at
θ = 0 (off its branch), is returned with converged=False and NaN values, never as numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from numpy.polynomial.hermite import hermgauss
from scipy.optimize import brentq

from pefusion.errors import ConfigError, check_choice, check_positive
from pefusion.student.config import ALPHA_C_PUBLISHED, TEACHER_A

# SPEC §11's starting points, (q, m, θ, V) per branch.
BRANCH_START = {"semantic": (0.9068, 2e-4, 0.3472, 14.575), "positional": (0.0207, 0.2, 0.0, 14.575)}
BRANCHES = tuple(BRANCH_START)
COLUMNS = ("alpha", "branch", "q", "m", "theta", "V", "eps_g", "phi", "iterations", "converged")
ORDER = ("q", "m", "theta", "V")  # the state vector's rows

DEFAULT_NODES = 12  # Gauss–Hermite nodes per axis (the README: ε_g moves < 0.2 % when doubled at α = 2)
DEFAULT_DAMPING = 0.8  # x <- damping·x + (1 − damping)·F(x), SPEC §11's 0.8 x + 0.2 F(x)
DEFAULT_TOL = 1e-6  # on the change of q, m and θ in one damped step
DEFAULT_MAX_ITER = 1000
# A point whose smallest change has not improved for this many steps is cycling, not converging: the proximal
# step is discontinuous where a node flips between mirror minima, so a state can hop between a few values forever.
STALL_ITERS = 200
WEIGHT_FLOOR = 1e-10  # quadrature nodes lighter than this are dropped
LOST_THETA = 1e-4  # |θ| below this on the semantic branch: it fell to a θ = 0 fixed point (θ ≈ 0.16 on the branch)

# The proximal Newton iteration: a node is done when its gradient's largest component is below NEWTON_TOL (the
# objective is O(0.01-1), so its minimiser is then known to ~1e-8); a point whose nodes are not all done after
# NEWTON_ITERS steps is not trusted (converged=False).
NEWTON_TOL, NEWTON_ITERS, ARMIJO, HALVINGS, ROUNDOFF = 1e-8, 100, 1e-4, 40, 1e-15
STEP_CAP = 0.25  # per coordinate and Newton step
# ONE_THREAD: the solver runs on one torch thread whatever the caller's setting. Its tensors are 1e4-1e6 elements
# and it compacts them by index every Newton step; there a second intra-op thread costs more than it gives, and on
# a busy machine far more (a curve's first 60 steps: 0.65 s of CPU on one thread against 19 s on two, load 6 on 2
# cores).


@dataclass(frozen=True)
class Solver:
    """How the fixed point is computed: Gauss–Hermite nodes per axis, damping, tolerance, iteration budget."""

    nodes: int = DEFAULT_NODES
    damping: float = DEFAULT_DAMPING
    tol: float = DEFAULT_TOL
    max_iter: int = DEFAULT_MAX_ITER

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, (int, np.integer)) or self.nodes < 2:
            raise ConfigError(f"nodes={self.nodes!r} is out of range; it must be an integer >= 2")
        if not (math.isfinite(self.damping) and 0 <= self.damping < 1):
            raise ConfigError(f"damping={self.damping!r} is out of range; it must be in [0, 1) "
                              f"(x <- damping*x + (1-damping)*F(x))")
        check_positive("tol", self.tol)
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, (int, np.integer)) or self.max_iter < 1:
            raise ConfigError(f"max_iter={self.max_iter!r} is out of range; it must be an integer >= 1")


@dataclass(frozen=True)
class Quadrature:
    """A 4-D tensor Gauss–Hermite rule for (ξ₁, ξ₂, y₁, y₂) ~ N(0, I₄): nodes (4, N), weights (N,) summing to 1."""

    nodes: torch.Tensor
    weights: torch.Tensor

    @classmethod
    def gauss_hermite(cls, n: int) -> "Quadrature":
        t, w = hermgauss(n)  # ∫ e^{-t²} f(t) dt: the standard normal is t·√2 with weights w/√π
        t, w = t * math.sqrt(2.0), w / math.sqrt(math.pi)
        grid = np.stack(np.meshgrid(t, t, t, t, indexing="ij")).reshape(4, -1)
        weight = np.einsum("i,j,k,l->ijkl", w, w, w, w).reshape(-1)
        keep = weight >= WEIGHT_FLOOR
        return cls(torch.from_numpy(grid[:, keep]).double(), torch.from_numpy(weight[keep]).double())

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """E[values] over the nodes: (P, N) -> (P,)."""
        return values @ self.weights


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
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The local minimum of Σ_l (x_l − w_l)²/V + 2ℓ(x; h*) reached from `start` (default x = (0, 0)), for every
    node at once.

    w1, w2, y11, y22 (P, N); V, sigma (P, 1); start (2, P, N). Returns p (2, P, N), the objective there (P, N)
    and, per point, whether every node converged (P,) bool. Damped Newton: with a = x₁(x₁ − x₂), b = x₂(x₂ − x₁)
    and s = sig(a), sig(b), the loss's Hessian is 2σ²·2·Σ[(s'² + r s'')∇a∇aᵀ + r s' ∇²a], shifted where the
    objective's is not positive definite, and each step is halved until the objective decreases by the Armijo
    margin. Nodes leave the batch as they converge (most take 5-8 steps, a few in flat regions 20)."""
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
        # Nodes already converged take this step too (a tiny one) and leave afterwards: cheaper than compacting
        # the twenty intermediate arrays now.
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
        x[0, idx], x[1, idx] = x1, x2
        if not bool(moving.any()):
            idx = idx[:0]
            break
        if not bool(moving.all()):
            idx, x1, x2, w1_, w2_, y11_, y22_, inv_v, c = (
                v[moving] for v in (idx, x1, x2, w1_, w2_, y11_, y22_, inv_v, c))
    ok = torch.ones(shape[0], dtype=torch.bool)
    ok[idx // shape[1]] = False  # a point with a node that did not converge
    x = x.reshape(2, *shape)
    return x, _objective(x[0], x[1], w1, w2, y11, y22, 1.0 / V, 2.0 * sigma ** 2), ok


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
    """The hat update of SPEC §11 and ε_g at state (4, P) = (q, m, θ, V); the proximal steps start at (0, 0),
    or at `start` (2, P, N)."""
    q, m, theta, V = (s[:, None] for s in state)  # (P, 1) each
    xi1, xi2, y1, y2 = quad.nodes  # (N,) each
    rho = p.sigma ** 2
    sq = torch.sqrt(q)
    v_star = torch.sqrt(rho - theta ** 2 / q)
    w1, w2 = sq * xi1 + m, sq * xi2 - m  # (P, N)
    h1, h2 = v_star * y1 + theta / sq * xi1, v_star * y2 + theta / sq * xi2
    t1, t2 = attention_diagonal(h1, h2)
    y11 = (1 - p.omega) * t1 + p.omega * p.a11  # the teacher's mixing diagonal Y₁₁, Y₂₂
    y22 = (1 - p.omega) * t2 + p.omega * p.a22
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
        eps_g=rho[:, 0] * quad.mean((s1 - y11) ** 2 + (s2 - y22) ** 2),
        ok=ok, prox=prox)


def prior(hat: Channel, p: Params) -> torch.Tensor:
    """The prior update of SPEC §11: the new state (4, P) = (q, m, θ, V) from the hats."""
    s2, lam = p.sigma[:, 0] ** 2, p.lam[:, 0]
    rho = s2
    D = lam + s2 * hat.V_hat
    q = s2 * (s2 * hat.q_hat + hat.m_hat ** 2 + s2 * rho * hat.theta_hat ** 2) / D ** 2
    return torch.stack([q, hat.m_hat / D, s2 * rho * hat.theta_hat / D, s2 / D])


def free_energy(state: torch.Tensor, hat: Channel, p: Params) -> torch.Tensor:
    """Φ of SPEC §11 at state (4, P) with its hats (the training loss is −Φ): (P,)."""
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
# The damped iteration, batched over points
# ---------------------------------------------------------------------------------------------------------


def fixed_points(alpha: Sequence[float], branch: Sequence[str], *, sigma: Sequence[float], lam: Sequence[float],
                 omega: Sequence[float], teacher_A: Sequence[str], solver: Solver = Solver()) -> pd.DataFrame:
    """The fixed point of P points (one value per point in each argument), iterated as one batch.

    Returns one row per point with COLUMNS: q, m, theta (σ² Q·Q*/d), V, eps_g, phi (Φ; the training loss is
    −Φ), the number of damped steps, and converged (False: every value NaN). The reported values are those of
    the state whose damped step changed q, m and θ by less than solver.tol, with that state's hats."""
    for b in branch:
        check_choice("branch", b, BRANCHES)
    p = make_params(alpha, sigma, lam, omega, teacher_A)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see ONE_THREAD
    try:
        return _iterate(p, branch, solver)
    finally:
        torch.set_num_threads(threads)


def _iterate(p: Params, branch: Sequence[str], solver: Solver) -> pd.DataFrame:
    """fixed_points' damped iteration, batched over the points of `p`."""
    quad = Quadrature.gauss_hermite(solver.nodes)
    n_points = len(branch)
    state = torch.tensor([BRANCH_START[b] for b in branch], dtype=torch.float64).T  # (4, P)
    out = torch.full((6, n_points), math.nan, dtype=torch.float64)  # q, m, θ, V, ε_g, Φ
    iterations = np.zeros(n_points, dtype=int)
    converged = np.zeros(n_points, dtype=bool)
    active = torch.arange(n_points)
    # Warm starts: a point's proximal steps start where its previous iteration's ended, which takes 2-4 Newton
    # steps instead of ~15. A point that converges so is iterated once more from (0, 0), as the equations ask,
    # and is finished only if that step also changes q, m and θ by less than tol (else it goes on from there).
    warm = torch.zeros(2, n_points, quad.weights.numel(), dtype=torch.float64)
    cold = torch.ones(n_points, dtype=torch.bool)
    best = torch.full((n_points,), math.inf, dtype=torch.float64)  # each point's smallest change so far
    best_at = torch.zeros(n_points, dtype=torch.long)
    for it in range(1, solver.max_iter + 1):
        pa = p.rows(active)
        hat = channel(state, pa, quad, torch.where(cold[None, :, None], 0.0, warm))
        new = solver.damping * state + (1 - solver.damping) * prior(hat, pa)
        change = (new[:3] - state[:3]).abs().amax(0)
        small = change < solver.tol
        best_at = torch.where(change < best, it, best_at)
        best = torch.minimum(best, change)
        failed = ~(hat.ok & _valid(new, pa) & torch.isfinite(hat.eps_g)) | (it - best_at > STALL_ITERS)
        finished = small & cold & ~failed
        if finished.any():
            idx = active[finished]
            out[:4, idx] = state[:, finished]
            out[4, idx] = hat.eps_g[finished]
            out[5, idx] = free_energy(state, hat, pa)[finished]
            converged[idx.numpy()] = True
        iterations[active.numpy()] = it
        keep = ~(finished | failed)
        active, state, warm, cold = active[keep], new[:, keep], hat.prox[:, keep], (small & ~cold)[keep]
        best, best_at = best[keep], best_at[keep]
        if len(active) == 0:
            break
    # A semantic start that settles where θ vanishes has left its branch (at small α the semantic solution does
    # not exist and the iteration falls to a θ = 0 fixed point): not the semantic value, so not converged.
    lost = np.array([b == "semantic" for b in branch]) & converged & (np.abs(out[2].numpy()) < LOST_THETA)
    out[:, torch.from_numpy(lost)] = math.nan
    converged &= ~lost
    values = out.numpy()
    return pd.DataFrame({"alpha": p.alpha[:, 0].numpy(), "branch": list(branch),
                         **{k: values[i] for i, k in enumerate((*ORDER, "eps_g", "phi"))},
                         "iterations": iterations, "converged": converged})[list(COLUMNS)]


def theory_curve(alphas: Sequence[float], sigma: float = 0.5, lam: float = 0.01, omega: float = 0.3,
                 teacher_A: str = "default", branches: Sequence[str] = BRANCHES,
                 solver: Solver = Solver()) -> pd.DataFrame:
    """Every α on every branch as one batch: len(alphas)·len(branches) rows, α-major."""
    pairs = [(a, b) for a in alphas for b in branches]
    n = len(pairs)
    return fixed_points([a for a, _ in pairs], [b for _, b in pairs], sigma=[sigma] * n, lam=[lam] * n,
                        omega=[omega] * n, teacher_A=[teacher_A] * n, solver=solver)


def simulation_theta(theta: float | np.ndarray, sigma: float | np.ndarray) -> float | np.ndarray:
    """The simulations' θ = |Q*ᵀQ|/d from the theory's θ = σ² Q·Q*/d (sign dropped, as the simulations do)."""
    return np.abs(theta) / np.asarray(sigma) ** 2


# ---------------------------------------------------------------------------------------------------------
# α_c(ω): where the two branches' training losses −Φ cross
# ---------------------------------------------------------------------------------------------------------


def phi_gap(alpha: float, omega: float, sigma: float = 0.5, lam: float = 0.01, teacher_A: str = "default",
            solver: Solver = Solver()) -> float:
    """Φ_semantic − Φ_positional at one α (both branches in one batch): > 0 where the semantic branch has the
    lower training loss −Φ; NaN where either branch does not converge."""
    rows = theory_curve([alpha], sigma, lam, omega, teacher_A, solver=solver).set_index("branch")
    return float(rows.loc["semantic", "phi"] - rows.loc["positional", "phi"])


def alpha_c(omega: float, sigma: float = 0.5, lam: float = 0.01, teacher_A: str = "default",
            solver: Solver = Solver(), start: float | None = None, xtol: float = 1e-4) -> float:
    """α_c(ω), the root of Φ_semantic − Φ_positional (negative below α_c: the positional branch has the lower
    training loss there), by brentq on a bracket found by stepping from `start` (default: the published α_c(ω)
    read at ω, else 1) by 0.05, 0.1, 0.2, ...: upwards while the gap is negative or a branch does not converge
    (the semantic branch has no fixed point at small α), downwards while it is positive. A ConfigError when no
    sign change is found or a branch does not converge inside the bracket."""
    if start is None:
        omegas = sorted(ALPHA_C_PUBLISHED)
        start = float(np.interp(omega, omegas, [ALPHA_C_PUBLISHED[o] for o in omegas]))
    where = f"omega={omega:g} (sigma={sigma:g}, lam={lam:g}, A={teacher_A})"

    def gap(a: float) -> float:
        return phi_gap(a, omega, sigma, lam, teacher_A, solver)

    lo, g_lo = start, gap(start)
    hi, g_hi, step = lo, g_lo, 0.05
    while not g_hi > 0:  # upwards: the last point with a finite negative gap is the lower end
        if g_hi < 0:
            lo, g_lo = hi, g_hi
        hi, step = hi + step, 2 * step
        if hi > 50:
            raise ConfigError(f"no alpha_c up to alpha=50 for {where}: Phi_semantic - Phi_positional stays "
                              f"negative or a branch does not converge")
        g_hi = gap(hi)
    while not g_lo < 0:  # downwards from a positive start
        if math.isnan(g_lo) or lo < 1e-2:
            raise ConfigError(f"no alpha_c below alpha={hi:g} for {where}: a branch does not converge before "
                              f"Phi_semantic - Phi_positional changes sign")
        hi, g_hi = lo, g_lo
        lo, step = max(lo - step, lo / 2), 2 * step
        g_lo = gap(lo)

    def finite_gap(a: float) -> float:
        value = gap(a)
        if math.isnan(value):
            raise ConfigError(f"a branch does not converge at alpha={a:g} inside the bracket [{lo:g}, {hi:g}] "
                              f"of alpha_c for {where}")
        return value

    return float(brentq(finite_gap, lo, hi, xtol=xtol))


# ---------------------------------------------------------------------------------------------------------
# The cache: computed points and α_c values, keyed by their parameters and the solver
# ---------------------------------------------------------------------------------------------------------

POINT_KEYS = ("sigma", "lam", "omega", "teacher_A", "alpha", "branch", "nodes", "damping", "tol", "max_iter")
CACHE_POINTS, CACHE_ALPHA_C = "student_theory_points.csv", "student_theory_alpha_c.csv"


def _read(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.exists() else None


def _keyed(frame: pd.DataFrame, keys: Sequence[str]) -> pd.Series:
    """One string per row naming its parameters (floats at 12 significant digits, so CSV round trips match)."""
    parts = [frame[k].map(lambda v: f"{v:.12g}" if isinstance(v, (float, np.floating)) else str(v)) for k in keys]
    return pd.Series(["|".join(row) for row in zip(*parts)], index=frame.index)


def cached_points(points: pd.DataFrame, cache_dir: str | Path, solver: Solver = Solver()) -> pd.DataFrame:
    """The fixed points of `points` (columns sigma, lam, omega, teacher_A, alpha, branch), one row each with the
    point's columns and COLUMNS; those not in <cache_dir>/student_theory_points.csv are computed as one batch
    and added to it."""
    cache_dir = Path(cache_dir)
    path = cache_dir / CACHE_POINTS
    wanted = points[list(POINT_KEYS[:6])].drop_duplicates().assign(
        nodes=solver.nodes, damping=solver.damping, tol=solver.tol, max_iter=solver.max_iter)
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
    """α_c(ω) for each ω, from <cache_dir>/student_theory_alpha_c.csv or computed and added to it; an ω where
    no α_c is found maps to NaN (and is cached as such)."""
    cache_dir = Path(cache_dir)
    path = cache_dir / CACHE_ALPHA_C
    keys = ("sigma", "lam", "omega", "teacher_A", "nodes", "damping", "tol", "max_iter")
    cached = _read(path)
    wanted = pd.DataFrame({"sigma": float(sigma), "lam": float(lam), "omega": [float(o) for o in omegas],
                           "teacher_A": teacher_A, "nodes": solver.nodes, "damping": solver.damping,
                           "tol": solver.tol, "max_iter": solver.max_iter})
    found = {} if cached is None else dict(zip(_keyed(cached, keys), cached["alpha_c"]))
    rows = []
    for key, row in zip(_keyed(wanted, keys), wanted.itertuples(index=False)):
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
    return {float(o): float(found[k]) for o, k in zip(wanted["omega"], _keyed(wanted, keys))}
