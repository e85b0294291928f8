"""The fixed point of the map F (channel then prior) on the split rule: Newton's method on F(x) − x, batched over
points.

Where the switch moves with the state, it feeds back: on the semantic branch the response of F_θ to θ through it
puts an eigenvalue of the map near 1 towards the branch's end (θ → 0 at α ≈ 0.77 for ω = 0.3), so a damped
iteration converges slowly and amplifies any quadrature error. The fixed point is therefore solved by Newton's
method on F(x) − x (a finite-difference Jacobian, refined by Broyden updates), with the branch's symmetric
coordinate held at its symmetric value (semantic with a symmetric teacher A: m = 0, tokens 1 ↔ 2; positional:
θ = 0, y → −y).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from pefusion.student.theory.channel import Channel, Params, channel, free_energy, prior, valid
from pefusion.student.theory.quadrature import OuterRule, split_quadrature
from pefusion.student.theory.settings import Solver
from pefusion.student.theory.switches import locate_switches

# What a point's `status` says: on its branch and converged; the branch ends between its anchor and this α (the
# continuation left it: its coordinate, θ or m, fell to 0, or no fixed point was found near the last one even with
# the shortest steps, a fold); the branch was found at no anchor. NOT_CONVERGED is Newton's own verdict on one
# attempt, which the continuation turns into one of the others.
CONVERGED, BRANCH_ENDED, NO_ANCHOR, NOT_CONVERGED = "converged", "branch_ended", "no_anchor", "not_converged"


@dataclass
class Evaluation:
    """The map at a batch of states: F(x) (4, P), the hats there, and the switches (P, N_o) it was integrated
    with and their brackets."""

    new: torch.Tensor
    hat: Channel
    switch: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor

    def rows(self, keep: torch.Tensor) -> "Evaluation":
        """The points `keep` (the hats are not needed after the rows are chosen, so they are not cut)."""
        return Evaluation(self.new[:, keep], self.hat, self.switch[keep], self.lo[keep], self.hi[keep])


def evaluate(state: torch.Tensor, p: Params, outer: OuterRule, solver: Solver, centre: torch.Tensor | None,
             keep: tuple[torch.Tensor, torch.Tensor] | None = None, half: torch.Tensor | None = None) -> Evaluation:
    """F at state (4, P) on the split rule, every proximal step from (0, 0); `centre` ± `half` predicts the
    switches and brackets in `keep` that still hold them are kept (locate_switches)."""
    switch, lo, hi = locate_switches(state, p, outer, centre, keep, half, solver)
    quad = split_quadrature(switch, outer, solver.zeta_nodes, solver.quadrature)
    hat = channel(state, p, quad, settings=solver.proximal)
    return Evaluation(prior(hat, p), hat, switch, lo, hi)


def free_coordinates(branch: Sequence[str], p: Params) -> torch.Tensor:
    """(4, P) bool: the coordinates Newton solves for. A branch's symmetric coordinate stays at 0: θ on the
    positional branch (y → −y), m on the semantic branch when the teacher's A is symmetric (tokens 1 ↔ 2)."""
    free = torch.ones(4, len(branch), dtype=torch.bool)
    positional = torch.tensor([b == "positional" for b in branch])
    free[2] = ~positional
    free[1] = positional | (p.a11[:, 0] != p.a22[:, 0])
    return free


@dataclass
class Solved:
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


class Jacobians(NamedTuple):
    """Of F(x) − x (P, 4, 4) and of each switch in the state (P, N_o, 4)."""

    map: torch.Tensor
    switch: torch.Tensor


def _jacobians(state: torch.Tensor, base: Evaluation, p: Params, free: torch.Tensor, outer: OuterRule,
               solver: Solver) -> Jacobians:
    """By forward differences in the free coordinates (steps of newton.jacobian_step relative, far beyond the
    switches' tol in their movement, which is part of the map's response): the Jacobian of F(x) − x, −1 on the
    diagonal of the fixed coordinates, and each switch's gradient in the state."""
    n_points = state.shape[1]
    jac = -torch.eye(4, dtype=torch.float64).repeat(n_points, 1, 1)
    moves = torch.zeros(*base.switch.shape, 4, dtype=torch.float64)
    for j in range(4):
        if not free[j].any():
            continue
        step = solver.newton.jacobian_step * torch.clamp(state[j].abs(), min=solver.newton.step_floor)
        moved = state.clone()
        moved[j] += step
        ev = evaluate(moved, p, outer, solver, base.switch)
        column = (ev.new - base.new) / step - torch.eye(4, dtype=torch.float64)[:, j:j + 1]
        jac[:, :, j] = torch.where(free[j], column, jac[:, :, j].T).T
        moves[:, :, j] = torch.where(free[j][:, None], (ev.switch - base.switch) / step[:, None], 0.0)
    return Jacobians(jac, moves)


def _broyden(jac: torch.Tensor, step: torch.Tensor, change: torch.Tensor, use: torch.Tensor) -> torch.Tensor:
    """Broyden's update of a batch of Jacobians (P, R, 4) from a step (P, 4) that changed the values by
    `change` (P, R), in the rows where `use` (P, R) holds: the others (steps whose effect is lost in the noise
    of the switches' location) are left as they were."""
    size = (step * step).sum(1)
    miss = change - (jac @ step[:, :, None])[:, :, 0]
    update = miss[:, :, None] * step[:, None, :] / torch.where(size > 0, size, 1.0)[:, None, None]
    return jac + torch.where((use & (size > 0)[:, None])[:, :, None], update, 0.0)


def newton(state: torch.Tensor, p: Params, free: torch.Tensor, jacobian: torch.Tensor | None,
           switch_jacobian: torch.Tensor | None, centre: torch.Tensor | None, outer: OuterRule, solver: Solver,
           guard: torch.Tensor | None = None, half: torch.Tensor | None = None) -> list[Solved]:
    """Newton's method on G(x) = F(x) − x from state (4, P) for P points at once (each leaves the batch when it
    has converged or failed). The Jacobians (of G, (P, 4, 4), and of the switches, (P, N_o, 4)) are given or
    computed by finite differences, updated by Broyden's rule after each step and recomputed every
    newton.refresh_after steps without convergence; each step keeps the last step's switch brackets that still
    hold and predicts the other switches from the last ones by their Jacobian, looking first within
    switch.prediction_error of the movement (`centre` ± `half` (P, N_o) predicts the first); a step that leaves
    the region where the channel is defined is halved. Converged: |G| < solver.tol in q, m and θ, with every
    proximal step converged; a point that is not within solver.max_iter evaluations has status NOT_CONVERGED.
    With `guard` (4, P), a point whose guard·x falls below newton.lost (its branch's coordinate, signed) has left
    its branch: it stops there, BRANCH_ENDED."""
    settings = solver.newton
    n_points = state.shape[1]
    results: list[Solved | None] = [None] * n_points
    active = torch.arange(n_points)
    x = torch.where(free, state, 0.0)
    ev = evaluate(x, p, outer, solver, centre, half=half)
    used = torch.ones(n_points, dtype=torch.long)
    jac, sjac = jacobian, switch_jacobian
    since = torch.zeros(n_points, dtype=torch.long)  # Newton steps since the Jacobians were computed
    while True:
        pa, fa = p.rows(active), free[:, active]
        G = torch.where(fa, ev.new - x, 0.0)
        ok = ev.hat.ok & valid(x, pa) & torch.isfinite(ev.new).all(0)
        done = ok & (G[:3].abs().amax(0) < solver.tol)
        lost = (guard * x).sum(0) < settings.lost if guard is not None else torch.zeros_like(done)
        failed = ~ok | lost | (used >= solver.max_iter) & ~done
        if (done | failed).any():
            phi = free_energy(x, ev.hat, pa)
            for i in torch.nonzero(done | failed).reshape(-1).tolist():
                status = BRANCH_ENDED if bool(lost[i]) else CONVERGED if bool(done[i]) else NOT_CONVERGED
                results[int(active[i])] = Solved(
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
        stale = torch.ones_like(since, dtype=torch.bool) if jac is None else since >= settings.refresh_after
        if stale.any():  # only the stale points take the new Jacobians: no point's numbers depend on the others
            fresh, fresh_s = _jacobians(x, ev, pa, fa, outer, solver)
            jac = fresh if jac is None else torch.where(stale[:, None, None], fresh, jac)
            sjac = fresh_s if sjac is None else torch.where(stale[:, None, None], fresh_s, sjac)
            used += torch.where(stale, fa.sum(0), 0)
            since = torch.where(stale, 0, since)
        step = torch.where(fa, -torch.linalg.solve(jac, G.T).T, 0.0)  # (4, P'); zero in the fixed coordinates
        for _ in range(settings.domain_halvings):  # halve the steps that leave the channel's domain
            bad = ~valid(x + step, pa)
            if not bad.any():
                break
            step = torch.where(bad, step / 2, step)
        x_new = x + step
        movement = (sjac @ step.T[:, :, None])[:, :, 0]
        new = evaluate(x_new, pa, outer, solver, ev.switch + movement, (ev.lo, ev.hi),
                       solver.switch.prediction_error * movement.abs())
        used += 1
        since += 1
        # A step below noise_step (relative) changes F by less than the switches' location noise does
        big = ((step.abs() / torch.clamp(x.abs(), min=settings.step_floor)).amax(0) > settings.noise_step)[:, None]
        jac = _broyden(jac, step.T, torch.where(fa, new.new - x_new, 0.0).T - G.T, big.expand(-1, 4))
        moved = new.switch - ev.switch
        sjac = _broyden(sjac, step.T, moved, moved.abs() > solver.switch.jacobian_move * solver.switch.tol)
        x, ev = x_new, new
