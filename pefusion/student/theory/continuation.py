"""Continuation in α: each branch of each problem is followed from an anchor over a fixed lattice of α, so that a
point's value depends only on its problem, branch and α.

Each branch is followed by continuation in α from an anchor, over a fixed lattice (α = 2 ± 0.05 k): a point is
solved from the lattice point before it (towards the anchor), predicted by the quadratic through the last three,
so its value does not depend on which other points were asked for (to the solver's tolerance: points solved in
one batch share vectorised arithmetic), and a curve never jumps between branches. The anchor is α = 2 (the
paper's anchors), or where the branch does not reach it the first of α = 1, 0.5, 4 where it is found: there the
authors' damped iteration on a 4-D tensor Gauss–Hermite rule brings the branch's starting point to within 1e-3,
then Newton finishes on the split rule. Where the continuation leaves a branch (its coordinate, θ or m, falls to
0), the branch has ended: that point and those beyond it are reported as such.

The solver runs on one torch thread whatever the caller's setting. Its tensors are 1e3-1e5 elements and it
compacts them by index every Newton step; there a second intra-op thread costs more than it gives, and on a busy
machine far more (docs/benchmarks.md).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple, Sequence

import numpy as np
import pandas as pd
import torch

from pefusion.errors import ConfigError, check_choice
from pefusion.student.theory.channel import ORDER, Params, channel, make_params, prior, valid
from pefusion.student.theory.fixed_point import (BRANCH_ENDED, CONVERGED, NO_ANCHOR, NOT_CONVERGED, Solved,
                                                 free_coordinates, newton)
from pefusion.student.theory.quadrature import OuterRule, Quadrature
from pefusion.student.theory.settings import ContinuationSettings, Solver

# The damped iteration's starting points, (q, m, θ, V) per branch: the authors'.
BRANCH_START = {"semantic": (0.9068, 2e-4, 0.3472, 14.575), "positional": (0.0207, 0.2, 0.0, 14.575)}
BRANCHES = tuple(BRANCH_START)
COLUMNS = ("alpha", "branch", *ORDER, "eps_g", "phi", "iterations", "converged", "status")


class Track(NamedTuple):
    """One branch of one problem."""

    sigma: float
    lam: float
    omega: float
    teacher_A: str
    branch: str


class Step(NamedTuple):
    """A point to solve, α on `track`, from the lattice points of `path` (the last one solved)."""

    track: Track
    alpha: float
    path: Sequence[float]


class Approach(NamedTuple):
    """The states (4, P) the damped iteration reached and each point's iterations (P,)."""

    state: torch.Tensor
    spent: torch.Tensor


def approach(state: torch.Tensor, p: Params, solver: Solver) -> Approach:
    """The authors' damped iteration x ← damping·x + (1 − damping)·F(x) on the 4-D tensor Gauss–Hermite rule
    (each proximal step starting where the last one ended), from state (4, P), each point until its step changes
    q, m and θ by less than continuation.approach_tol (or would leave the channel's domain, or
    continuation.approach_iters pass): a start for Newton near the branch's fixed point."""
    settings = solver.continuation
    quad = Quadrature.gauss_hermite(solver.nodes, solver.quadrature)
    warm = None
    done = torch.zeros(state.shape[1], dtype=torch.bool)
    spent = torch.zeros(state.shape[1], dtype=torch.long)
    for _ in range(settings.approach_iters):
        hat = channel(state, p, quad, warm, solver.proximal)
        new = solver.damping * state + (1 - solver.damping) * prior(hat, p)
        leaves = ~valid(new, p)
        spent += ~done
        small = (new[:3] - state[:3]).abs().amax(0) < settings.approach_tol
        state = torch.where(done | leaves, state, new)
        done |= leaves | small
        warm = hat.prox
        if bool(done.all()):
            break
    return Approach(state, spent)


def _lattice_next(alpha: float, up: bool, settings: ContinuationSettings) -> float:
    """The lattice point after `alpha` (a lattice point) going away from the anchor, up or down."""
    step, linear_max = settings.lattice_step, settings.lattice_linear_max
    if not up:
        return round(alpha - step, 12)
    return round(alpha + step if alpha < linear_max - 1e-9 else alpha * (1 + step / linear_max), 12)


def lattice_path(alpha: float, anchor: float, settings: ContinuationSettings = ContinuationSettings()
                 ) -> list[float]:
    """The lattice points a point at α is reached through, from the anchor (included) to the last one before α,
    or to α itself when it is one: e.g. 2.0, 1.95, ..., then α is solved from the last of them."""
    path, up = [anchor], alpha > anchor
    while True:
        if abs(path[-1] - alpha) < 1e-9:
            return path
        nxt = _lattice_next(path[-1], up, settings)
        if (nxt > alpha + 1e-9) if up else (nxt < alpha - 1e-9 or nxt < settings.lattice_step - 1e-9):
            return path
        path.append(nxt)


class Continuation:
    """Fixed points reached by continuation from an anchor (the first of the solver's anchors where the branch is
    found), for any set of problems and branches. Solved points are kept, per track and α, so that later
    requests (e.g. alpha_c's root search) continue from them; a point's value depends only on its track and α."""

    def __init__(self, solver: Solver = Solver()) -> None:
        self.solver = solver
        self.outer = OuterRule.gauss_hermite(solver.nodes, solver.quadrature)
        self._done: dict[tuple[Track, float], Solved] = {}
        self._anchors: dict[Track, float | None] = {}  # None: the branch is found at no anchor

    def solve(self, alpha: Sequence[float], branch: Sequence[str], sigma: Sequence[float], lam: Sequence[float],
              omega: Sequence[float], teacher_A: Sequence[str]) -> pd.DataFrame:
        """One row per point (one value per point in each argument) with COLUMNS."""
        for b in branch:
            check_choice("branch", b, BRANCHES)
        make_params(alpha, sigma, lam, omega, teacher_A)  # every value checked before any work
        points = [(Track(float(s), float(la), float(o), str(a), b), round(float(x), 12))
                  for x, b, s, la, o, a in zip(alpha, branch, sigma, lam, omega, teacher_A)]
        unique = list(dict.fromkeys(points))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # see the module's docstring
        try:
            self._anchor(sorted({t for t, _ in points} - set(self._anchors)))
            for t, a in unique:
                if self._anchors[t] is None:
                    self._done[(t, a)] = Solved(torch.full((4,), math.nan, dtype=torch.float64), None, None, None,
                                                math.nan, math.nan, 0, NO_ANCHOR)
            anchored = [(t, a) for t, a in unique if self._anchors[t] is not None]
            paths = {(t, a): lattice_path(a, self._anchors[t], self.solver.continuation) for t, a in anchored}
            self._walk(paths)
            self._step([Step(t, a, paths[(t, a)]) for t, a in anchored if (t, a) not in self._done])
        finally:
            torch.set_num_threads(threads)
        rows = []
        for (track, a), asked in zip(points, alpha):
            got = self._done[(track, a)]
            ok = got.status == CONVERGED
            values = got.state.tolist() if ok else [math.nan] * 4
            rows.append({"alpha": float(asked), "branch": track.branch, **dict(zip(ORDER, values)),
                         "eps_g": got.eps_g if ok else math.nan, "phi": got.phi if ok else math.nan,
                         "iterations": got.iterations, "converged": ok, "status": got.status})
        return pd.DataFrame(rows, columns=list(COLUMNS))

    def _params(self, batch: Sequence[tuple[Track, float]]) -> Params:
        return make_params([a for _, a in batch], [t.sigma for t, _ in batch], [t.lam for t, _ in batch],
                           [t.omega for t, _ in batch], [t.teacher_A for t, _ in batch])

    def _anchor(self, tracks: Sequence[Track]) -> None:
        """Each track's anchor and its fixed point there: at each anchor in turn, the damped iteration from the
        branch's start, then Newton; the first where that converges on the branch is the track's anchor."""
        todo = list(tracks)
        for anchor in self.solver.continuation.anchors:
            if not todo:
                return
            batch = [(t, anchor) for t in todo]
            p = self._params(batch)
            start = torch.tensor([BRANCH_START[t.branch] for t in todo], dtype=torch.float64).T
            near, spent = approach(start, p, self.solver)
            solved = newton(near, p, free_coordinates([t.branch for t in todo], p), None, None, None, self.outer,
                            self.solver)
            missed = []
            for track, got, iterations in zip(todo, solved, spent.tolist()):
                if got.status == CONVERGED and not self._off_branch(track, got.state, None):
                    got.iterations += iterations
                    self._anchors[track], self._done[(track, anchor)] = anchor, got
                else:
                    missed.append(track)
            todo = missed
        for track in todo:
            self._anchors[track] = None

    def _walk(self, paths: dict[tuple[Track, float], list[float]]) -> None:
        """Every lattice point on the given paths, in lockstep over the tracks: step i solves each path's i-th
        point from its (i−1)-th."""
        needed: dict[tuple[Track, bool], list[float]] = {}
        for (track, _), path in paths.items():
            key = (track, path[-1] > path[0])
            if len(path) > len(needed.get(key, [])):
                needed[key] = path
        for i in range(1, max((len(p) for p in needed.values()), default=0)):
            self._step([Step(track, path[i], path[:i]) for (track, _), path in needed.items()
                        if len(path) > i and (track, path[i]) not in self._done])

    def _step(self, todo: Sequence[Step], depth: int = 0) -> None:
        """Solve each (track, α) from the last point of its path, its state and switches extrapolated by the
        polynomial through the last predictor_points converged ones. A point whose predecessor is not on the
        branch inherits that status. Where Newton fails, the step is halved (the midpoint solved first), up to
        step_halvings times; failing still, the branch has ended there (a fold: no fixed point nearby)."""
        settings, switch = self.solver.continuation, self.solver.switch
        batch: list[tuple[Step, Solved]] = []
        starts, centres, halves = [], [], []
        for step in todo:
            track, alpha, path = step
            before = self._done[(track, path[-1])]
            if before.status != CONVERGED:
                self._done[(track, alpha)] = replace(before, iterations=0, jacobian=None, switch_jacobian=None,
                                                     switch=None)
                continue
            known = path[-settings.predictor_points:]  # converged, as their successor `before` is
            weights = _lagrange(known, alpha)
            guess = sum(w * self._done[(track, a)].state for w, a in zip(weights, known))
            centre = sum(w * self._done[(track, a)].switch for w, a in zip(weights, known))
            # the last term's size (the change from one point fewer) bounds the prediction's error
            lower = sum(w * self._done[(track, a)].switch for w, a in zip(_lagrange(known[1:], alpha), known[1:]))
            batch.append((step, before))
            starts.append(guess)
            centres.append(centre)
            halves.append(switch.prediction_error * (centre - lower).abs() if len(known) > 1
                          else torch.full_like(centre, switch.first_step_half))
        if not batch:
            return
        p = self._params([(s.track, s.alpha) for s, _ in batch])
        start = torch.stack(starts, 1)
        fallback = torch.stack([b.state for _, b in batch], 1)
        ok = valid(start, p)
        start = torch.where(ok, start, fallback)  # a secant that leaves the domain: no prediction
        centre = torch.where(ok[:, None], torch.stack(centres), torch.stack([b.switch for _, b in batch]))
        guard = torch.zeros(4, len(batch), dtype=torch.float64)
        for i, (s, before) in enumerate(batch):
            j = _coordinate(s.track)
            guard[j, i] = math.copysign(1.0, float(before.state[j]))
        solved = newton(start, p, free_coordinates([s.track.branch for s, _ in batch], p),
                        torch.stack([b.jacobian for _, b in batch]),
                        torch.stack([b.switch_jacobian for _, b in batch]), centre, self.outer, self.solver,
                        guard, torch.where(ok[:, None], torch.stack(halves), switch.start))
        retry: list[Step] = []
        for (s, before), got in zip(batch, solved):
            if got.status == CONVERGED and self._off_branch(s.track, got.state, before.state):
                got.status = BRANCH_ENDED
            if got.status == NOT_CONVERGED:  # no fixed point found: a shorter step may find one
                if depth < settings.step_halvings:
                    retry.append(s)
                    continue
                got.status = BRANCH_ENDED
            self._done[(s.track, s.alpha)] = got
        if retry:
            middle = [Step(s.track, round((s.path[-1] + s.alpha) / 2, 12), s.path) for s in retry]
            self._step([m for m in middle if (m.track, m.alpha) not in self._done], depth + 1)
            self._step([Step(s.track, s.alpha, [*s.path, m.alpha]) for s, m in zip(retry, middle)], depth + 1)

    def _off_branch(self, track: Track, state: torch.Tensor, before: torch.Tensor | None) -> bool:
        """Whether a converged state has left its branch: its coordinate (θ semantic, m positional) fell below
        newton.lost or changed sign from the point it was continued from."""
        j = _coordinate(track)
        value = float(state[j])
        return abs(value) < self.solver.newton.lost or (before is not None and value * float(before[j]) < 0)


def _lagrange(nodes: Sequence[float], at: float) -> list[float]:
    """The weights that extrapolate values at `nodes` to `at` by the polynomial through them."""
    return [math.prod((at - b) / (a - b) for b in nodes if b != a) for a in nodes]


def _coordinate(track: Track) -> int:
    """The state's row that is nonzero only on the track's branch: θ (semantic) or m (positional)."""
    return 2 if track.branch == "semantic" else 1


def continuation_for(solver: Solver, given: Continuation | None) -> Continuation:
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
    cont = continuation_for(solver, continuation)
    return cont.solve([a for a, _ in pairs], [b for _, b in pairs], [sigma] * n, [lam] * n, [omega] * n,
                      [teacher_A] * n)


def simulation_theta(theta: float | np.ndarray, sigma: float | np.ndarray) -> float | np.ndarray:
    """The simulations' θ = |Q*ᵀQ|/d from the theory's θ = σ² Q·Q*/d (sign dropped, as the simulations do)."""
    return np.abs(theta) / np.asarray(sigma) ** 2
