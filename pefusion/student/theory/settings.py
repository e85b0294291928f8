"""Every numerical setting of the theory's solver, in one frozen `Solver`: the cache key hashes it whole, so a
point computed under other settings is never served.

The five top-level fields are the command line's (`--nodes`, `--zeta-nodes`, `--damping`, `--tol`,
`--max-iter`); the groups below them hold the rest, each used by one module of the package (quadrature, channel,
switches, fixed_point, continuation, crossing).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pefusion.errors import ConfigError, check_positive


@dataclass(frozen=True)
class QuadratureSettings:
    """The rules' construction (`quadrature`)."""

    weight_floor: float = 1e-10  # tensor-rule nodes lighter than this are dropped (1e-7 of the mass at 12 per axis)
    zeta_span: float = 10.0  # the ζ rules cover [−10, 10] (the normal mass outside is 1e-23)
    zeta_margin: float = 1e-3  # a switch is held this far inside ±zeta_span, so neither side's interval is empty
    # Gauss–Legendre nodes discretising the normal density for the Stieltjes procedure (32 are not enough on
    # [−10, 9], 48 agree with 128 to 1e-12)
    density_nodes: int = 48


@dataclass(frozen=True)
class ProximalSettings:
    """The proximal step's damped Newton iteration (`channel.proximal`): a node is done when its gradient's largest
    component is below `tol` (the objective is O(0.01-1), so its minimiser is then known to ~1e-8); a point whose
    nodes are not all done after `iters` steps is not trusted (converged=False)."""

    tol: float = 1e-8
    iters: int = 100
    armijo: float = 1e-4  # the backtracking's sufficient-decrease margin
    halvings: int = 40  # backtracking halvings per step
    roundoff: float = 1e-15  # near the minimum a step may only win rounding noise: this much relative slack
    step_cap: float = 0.25  # per coordinate and Newton step
    curvature_floor: float = 1e-3  # the shifted Hessian's lowest eigenvalue is at least this over V
    compact: float = 0.75  # the still-moving fraction of the batch below which converged nodes are dropped from it


@dataclass(frozen=True)
class SwitchSettings:
    """Where the proximal point flips between mirror minima on each line along ζ (`switches`)."""

    start: float = 0.5  # a switch with no bracket yet is looked for in ζ_c ± 0.5 first (ζ_c = −√2 m/√q)
    # Bisection stops at brackets this narrow and the switch is interpolated inside: at α = 0.8 the map then moves
    # by 3e-7 (relative) against brackets of 1e-9, 6e-6 at 1e-4. At 1e-5, on the positional branch at ω = 0.2,
    # m moved by ±5e-7 as brackets were re-found, above the fixed point's tol: Newton cycled there and the
    # continuation reported the branch ended at α 1.65, where it goes on to 1.8.
    tol: float = 1e-6
    grow: int = 4  # a bracket the switch has left is moved past its wrong end and widened this much per try
    # Below section_points / multisection brackets, each is cut into up to multisection pieces per proximal solve
    # instead of two: the solve's cost is then its fixed overhead, and the last few brackets take a quarter the calls
    multisection: int = 16
    section_points: int = 2048
    # A predicted switch is looked for first within this fraction of its predicted movement (Newton) or of the last
    # term of its extrapolation (continuation): both overestimate the error ~10-100-fold
    prediction_error: float = 0.1
    first_step_half: float = 0.01  # the first step from the anchor has no prediction: its switches are looked for ±0.01
    # A switch that moved less than this many times `tol` in a Newton step leaves its Jacobian row as it was
    jacobian_move: int = 100


@dataclass(frozen=True)
class NewtonSettings:
    """Newton's method on F(x) − x (`fixed_point`)."""

    jacobian_step: float = 1e-3  # relative finite-difference step: moves the switches 100-fold beyond their tol
    step_floor: float = 1e-2  # relative steps are relative to max(|x|, this)
    refresh_after: int = 8  # Newton steps on a Broyden-updated Jacobian before a fresh finite-difference one
    noise_step: float = 1e-5  # smaller Newton steps (relative) leave the Jacobian as it was: F's noise dominates
    domain_halvings: int = 30  # a step that leaves the channel's domain is halved up to this many times
    lost: float = 1e-4  # a branch's coordinate (θ semantic, m positional) below this: the point has left the branch


@dataclass(frozen=True)
class ContinuationSettings:
    """The anchors and the lattice the branches are followed on (`continuation`)."""

    # A branch is anchored at the first of these where its starting point, iterated, lands on it: α = 2 is the
    # paper's anchor, the others catch branches that do not reach it (the positional one ends below α = 2 for
    # ω ≤ 0.1 and at ω = 0.2)
    anchors: tuple[float, ...] = (2.0, 1.0, 0.5, 4.0)
    lattice_step: float = 0.05  # the lattice, through every anchor: α = 2 ± 0.05 k, down to 0.05 and up to 4 ...
    lattice_linear_max: float = 4.0  # ... then geometric steps of ratio 1 + 0.05/4 (alpha_c may search up to α = 50)
    approach_tol: float = 1e-3  # the anchor's damped iteration runs until its change is below this ...
    approach_iters: int = 500  # ... or for this many iterations
    predictor_points: int = 3  # a continuation step starts from the quadratic through the last three points
    step_halvings: int = 3  # a continuation step Newton cannot finish is retried as two halves, down to 0.05/8


@dataclass(frozen=True)
class CrossingSettings:
    """The root search for α_c(ω) (`crossing`): the bracket grows from its start by `step`, 2·step, 4·step, ...
    within [alpha_min, alpha_max], then brentq to `xtol`."""

    step: float = 0.05
    alpha_min: float = 1e-2
    alpha_max: float = 50.0
    xtol: float = 1e-4


@dataclass(frozen=True)
class Solver:
    """How the fixed point is computed: Gauss–Hermite nodes per axis of the (η, y₁, y₂) rule, Gauss nodes along ζ
    on each side of the switch, the anchor's damping (x <- damping·x + (1 − damping)·F(x), the authors' 0.8), the
    tolerance on |F(x) − x| and the map's evaluations per Newton attempt; then every other setting, by module."""

    nodes: int = 12  # doubling moves ε_g by < 0.3 % (docs/theory.md)
    zeta_nodes: int = 8
    damping: float = 0.8
    # On |F(x) − x| in q, m and θ at the fixed point: F itself is known to within the switches' noise (switch.tol),
    # below 1e-7 absolute; Newton's last steps, on switches held in their brackets, converge only linearly below that.
    tol: float = 1e-7
    max_iter: int = 20  # a failed continuation step is retried in halves
    quadrature: QuadratureSettings = field(default_factory=QuadratureSettings)
    proximal: ProximalSettings = field(default_factory=ProximalSettings)
    switch: SwitchSettings = field(default_factory=SwitchSettings)
    newton: NewtonSettings = field(default_factory=NewtonSettings)
    continuation: ContinuationSettings = field(default_factory=ContinuationSettings)
    crossing: CrossingSettings = field(default_factory=CrossingSettings)

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
