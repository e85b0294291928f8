"""The switch: where, on each line along ζ = (ξ₁ − ξ₂)/√2 of the outer rule, the proximal point flips between the
loss's mirror minima.

The proximal point p = argmin_x Σ_l (x_l − w_l)²/V + 2ℓ(x; h*), the local minimum reached from (0, 0), jumps
between the loss's mirror minima (ℓ is even in x) where the sign of p₁ − p₂ flips: on a surface near w₁ = w₂,
i.e. near ζ = −√2 m/√q (every line of fixed η = (ξ₁ + ξ₂)/√2, y₁, y₂ crosses it once; where the central
stationary point is still a minimum the flip is a steep but continuous passage through p₁ = p₂). The hats'
integrands are discontinuous there, and where the switch sits depends on the state, so it is located on each line
by bisection on the sign of p₁ − p₂ (proximal steps from (0, 0)) and the split rule (`quadrature`) integrates
each side on its own.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from pefusion.student.theory.channel import Params, channel_inputs, proximal
from pefusion.student.theory.quadrature import OuterRule
from pefusion.student.theory.settings import Solver


class Switches(NamedTuple):
    """The switch ζ* on each outer line of each point and the bracket lo, hi that holds it (P, N_o each)."""

    at: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor


def _asymmetry(state: torch.Tensor, p: Params, outer: OuterRule, row: torch.Tensor, col: torch.Tensor,
               zeta: torch.Tensor, solver: Solver) -> torch.Tensor:
    """p₁ − p₂ of the proximal point reached from (0, 0) at S nodes: point `row`, outer node `col`, ζ = `zeta`
    (all (S,)). Its sign says which mirror minimum the node falls into."""
    q, m, theta, V = state[:, row]
    eta, y1, y2 = outer.nodes[:, col]
    pick = [getattr(p, k)[row, 0] for k in ("sigma", "omega", "a11", "a22")]
    _, _, w1, w2, y11, y22 = channel_inputs(q, m, theta, *pick, (eta + zeta) / math.sqrt(2),
                                            (eta - zeta) / math.sqrt(2), y1, y2)
    prox = proximal(w1[None], w2[None], y11[None], y22[None], V[None], pick[0][None], settings=solver.proximal).point
    return prox[0, 0] - prox[1, 0]


def locate_switches(state: torch.Tensor, p: Params, outer: OuterRule, centre: torch.Tensor | None = None,
                    keep: tuple[torch.Tensor, torch.Tensor] | None = None, half: torch.Tensor | None = None,
                    solver: Solver = Solver()) -> Switches:
    """The switch ζ* on each outer line of each point of `state` (4, P): where the sign of p₁ − p₂ changes.
    Returns ζ* and its bracket, no wider than solver.switch.tol.

    A bracket in `keep` (lo, hi) that the prediction `centre` stays inside, and that still holds the switch, is
    kept: F then stays a continuous function of the state while the switches move inside their brackets
    (Newton's last steps). Others are looked for in centre ± half (a prediction, e.g. from a nearby state, and
    its likely error (P, N_o); at least the switch's tol) or, without one, in ζ_c ± switch.start
    (ζ_c = −√2 m/√q); a bracket the switch is not in is moved past its wrong end and widened switch.grow-fold per
    try (up to ±zeta_span), then bisected (cut in up to switch.multisection pieces once few are left). ζ* is
    interpolated linearly in p₁ − p₂ inside its bracket: where the flip is a steep continuous passage, it follows
    the state smoothly. A line whose sign does not change inside ±zeta_span gets ζ* at that end."""
    s, span = solver.switch, solver.quadrature.zeta_span
    n_points, n_outer = state.shape[1], outer.weights.numel()
    row = torch.arange(n_points)[:, None].expand(n_points, n_outer).reshape(-1)
    col = torch.arange(n_outer)[None, :].expand(n_points, n_outer).reshape(-1)

    def asymmetry(rows: torch.Tensor, cols: torch.Tensor, zeta: torch.Tensor) -> torch.Tensor:
        return _asymmetry(state, p, outer, rows, cols, zeta, solver)

    def ends(at: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = asymmetry(torch.cat([row[at], row[at]]), torch.cat([col[at], col[at]]), torch.cat([lo, hi]))
        return u[:len(at)], u[len(at):]

    if centre is None:
        centre = (-math.sqrt(2) * state[1] / torch.sqrt(state[0]))[:, None].expand(n_points, n_outer)
        half = torch.tensor(s.start)
    else:  # a good prediction is still off by up to half a bracket: one halving follows
        half = torch.tensor(s.tol) if half is None else half.clamp(min=s.tol)
        lost = ~(torch.isfinite(centre) & torch.isfinite(half))  # a prediction gone wild: look afresh
        if lost.any():
            fresh = (-math.sqrt(2) * state[1] / torch.sqrt(state[0]))[:, None].expand(n_points, n_outer)
            centre = torch.where(lost, fresh, centre)
            half = torch.where(lost, s.start, half.expand(n_points, n_outer))
    new_lo = (centre - half).clamp(-span, span).reshape(-1)
    new_hi = (centre + half).clamp(-span, span).reshape(-1)
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
        left = (u_lo >= 0) & (lo > -span)
        right = (u_hi < 0) & (hi < span) & ~left
        grow = s.grow * torch.clamp(hi - lo, min=s.tol)
        hi, u_hi = torch.where(left, lo, hi), torch.where(left, u_lo, u_hi)
        lo = torch.where(left, (lo - grow).clamp(min=-span), lo)
        lo, u_lo = torch.where(right, hi, lo), torch.where(right, u_hi, u_lo)
        hi = torch.where(right, (hi + grow).clamp(max=span), hi)
        moved = torch.nonzero(left | right).reshape(-1)
        if len(moved) == 0:
            break
        u = asymmetry(row[moved], col[moved], torch.where(left[moved], lo[moved], hi[moved]))
        u_lo[moved] = torch.where(left[moved], u, u_lo[moved])
        u_hi[moved] = torch.where(left[moved], u_hi[moved], u)
    none = (u_lo >= 0) | (u_hi < 0)  # no sign change inside ±zeta_span
    edge = torch.where(u_lo >= 0, lo, hi)
    lo, hi = torch.where(none, edge, lo), torch.where(none, edge, hi)
    while True:  # bisection, or K-section once few brackets are left (a call costs about the same either way)
        todo = torch.nonzero(hi - lo > s.tol).reshape(-1)
        if len(todo) == 0:
            break
        k = max(2, min(s.multisection, s.section_points // len(todo)))
        inner = lo[todo, None] + (hi - lo)[todo, None] * torch.arange(1, k, dtype=lo.dtype) / k  # (T, k − 1)
        u = asymmetry(row[todo].repeat_interleave(k - 1), col[todo].repeat_interleave(k - 1),
                      inner.reshape(-1)).reshape(len(todo), k - 1)
        below = (u < 0).sum(1)  # the switch lies past this many inner points (the sign changes once)
        at_lo, at_hi = (below - 1).clamp(min=0), below.clamp(max=k - 2)
        pick = torch.arange(len(todo))
        new_lo = torch.where(below > 0, inner[pick, at_lo], lo[todo])
        new_u_lo = torch.where(below > 0, u[pick, at_lo], u_lo[todo])
        new_hi = torch.where(below < k - 1, inner[pick, at_hi], hi[todo])
        new_u_hi = torch.where(below < k - 1, u[pick, at_hi], u_hi[todo])
        lo[todo], u_lo[todo], hi[todo], u_hi[todo] = new_lo, new_u_lo, new_hi, new_u_hi
    width = u_hi - u_lo
    inside = torch.where(width > 0, -u_lo / torch.where(width > 0, width, 1.0), 0.0).clamp(0, 1)
    shape = (n_points, n_outer)
    return Switches((lo + (hi - lo) * inside).reshape(shape), lo.reshape(shape), hi.reshape(shape))
