"""The student model's d → ∞ prediction: the replica fixed point, its test error ε_g, free energy Φ and α_c(ω).

Each module owns one concern, each reading its settings from one frozen `Solver` (`settings`):
- `quadrature`: tensor Gauss–Hermite rules and the split rule along ζ = (ξ₁ − ξ₂)/√2;
- `channel`: the problem's parameters, the loss, the proximal step, the hat and prior updates, Φ;
- `switches`: where the proximal point flips between the loss's mirror minima on each line of the split rule;
- `fixed_point`: Newton's method on F(x) − x, batched over points;
- `continuation`: each branch followed in α from an anchor over a fixed lattice; the curves;
- `crossing`: α_c(ω), the root of Φ_semantic − Φ_positional;
- `cache`: computed points and α_c on disk, keyed by their parameters and a hash of the settings.

Order parameters (L = 2, r = 1, ρ = σ²): q = σ²‖Q‖²/d, m = 1ᵀQ/d, θ = σ² Q·Q*/d, V. Note θ here carries σ²:
the simulations' θ = |Q*ᵀQ|/d is θ/σ² (`simulation_theta`).
"""
from pefusion.student.theory.cache import (CACHE_ALPHA_C, CACHE_POINTS, THEORY_VERSION, cached_alpha_c,
                                           cached_points, settings_key)
from pefusion.student.theory.channel import (ORDER, Channel, Params, attention_diagonal, channel, free_energy,
                                             make_params, prior, proximal)
from pefusion.student.theory.continuation import (BRANCH_START, BRANCHES, COLUMNS, Continuation, fixed_points,
                                                  lattice_path, simulation_theta, theory_curve)
from pefusion.student.theory.crossing import alpha_c, phi_gap
from pefusion.student.theory.fixed_point import BRANCH_ENDED, CONVERGED, NO_ANCHOR, NOT_CONVERGED
from pefusion.student.theory.quadrature import (OuterRule, Quadrature, normal_gauss_rules, split_quadrature,
                                                tensor_gauss_hermite)
from pefusion.student.theory.settings import (ContinuationSettings, CrossingSettings, NewtonSettings,
                                              ProximalSettings, QuadratureSettings, Solver, SwitchSettings)
from pefusion.student.theory.switches import locate_switches

__all__ = [
    "BRANCHES", "BRANCH_ENDED", "BRANCH_START", "CACHE_ALPHA_C", "CACHE_POINTS", "COLUMNS", "CONVERGED",
    "Channel", "Continuation", "ContinuationSettings", "CrossingSettings", "NOT_CONVERGED", "NO_ANCHOR",
    "NewtonSettings", "ORDER", "OuterRule", "Params", "ProximalSettings", "Quadrature", "QuadratureSettings",
    "Solver", "SwitchSettings", "THEORY_VERSION", "alpha_c", "attention_diagonal", "cached_alpha_c",
    "cached_points", "channel", "fixed_points", "free_energy", "lattice_path", "locate_switches", "make_params",
    "normal_gauss_rules", "phi_gap", "prior", "proximal", "settings_key", "simulation_theta", "split_quadrature",
    "tensor_gauss_hermite", "theory_curve",
]
