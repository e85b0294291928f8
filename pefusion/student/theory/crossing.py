"""α_c(ω): where the two branches' training losses −Φ cross."""
from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq

from pefusion.errors import ConfigError
from pefusion.student.config import ALPHA_C_PUBLISHED
from pefusion.student.theory.continuation import BRANCHES, Continuation, continuation_for
from pefusion.student.theory.settings import Solver


def phi_gap(alpha: float, omega: float, sigma: float = 0.5, lam: float = 0.01, teacher_A: str = "default",
            solver: Solver = Solver(), continuation: Continuation | None = None) -> float:
    """Φ_semantic − Φ_positional at one α: > 0 where the semantic branch has the lower training loss −Φ; NaN
    where either branch has no converged point. `continuation` keeps the points solved on the way for later
    calls."""
    cont = continuation_for(solver, continuation)
    rows = cont.solve([alpha] * 2, BRANCHES, [sigma] * 2, [lam] * 2, [omega] * 2, [teacher_A] * 2)
    rows = rows.set_index("branch")
    return float(rows.loc["semantic", "phi"] - rows.loc["positional", "phi"])


def alpha_c(omega: float, sigma: float = 0.5, lam: float = 0.01, teacher_A: str = "default",
            solver: Solver = Solver(), start: float | None = None,
            continuation: Continuation | None = None) -> float:
    """α_c(ω), the root of Φ_semantic − Φ_positional (negative below α_c: the positional branch has the lower
    training loss there), by brentq on a bracket found by stepping from `start` (default: the published α_c(ω)
    read at ω, else 1) by crossing.step, twice that, four times, ...: upwards while the gap is negative or a
    branch has no point (the semantic branch ends at small α), downwards while it is positive. A ConfigError when
    no sign change is found or a branch has no point inside the bracket. `continuation` (of the same solver) may
    hold points solved before, and keeps those solved here."""
    settings = solver.crossing
    if start is None:
        omegas = sorted(ALPHA_C_PUBLISHED)
        start = float(np.interp(omega, omegas, [ALPHA_C_PUBLISHED[o] for o in omegas]))
    where = f"omega={omega:g} (sigma={sigma:g}, lam={lam:g}, A={teacher_A})"
    cont = continuation_for(solver, continuation)

    def gap(a: float) -> float:
        return phi_gap(a, omega, sigma, lam, teacher_A, solver, cont)

    lo, g_lo = start, gap(start)
    hi, g_hi, step = lo, g_lo, settings.step
    while not g_hi > 0:  # upwards: the last point with a finite negative gap is the lower end
        if g_hi < 0:
            lo, g_lo = hi, g_hi
        hi, step = hi + step, 2 * step
        if hi > settings.alpha_max:
            raise ConfigError(f"no alpha_c up to alpha={settings.alpha_max:g} for {where}: "
                              f"Phi_semantic - Phi_positional stays negative or a branch has no point")
        g_hi = gap(hi)
    while not g_lo < 0:  # downwards from a positive start
        if math.isnan(g_lo) or lo < settings.alpha_min:
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

    return float(brentq(finite_gap, lo, hi, xtol=settings.xtol))
