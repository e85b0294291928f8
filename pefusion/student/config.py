"""Study B's configuration, published facts and rules (Cui, Behrens, Krzakala & Zdeborová, NeurIPS 2024;
docs/student.md).

Owns `StudentConfig` (one point: data, student, optimiser) and its validation, the allowed options (INITS,
OPTIMS, DTYPES, TEACHER_A), the authors' optimiser settings (attention and linear baseline), and the paper's
numbers that the reproduction and the tables are checked against.

Why it looks as it does: everything here is a fact or a rule, no computation, so the sweeps, the scripts and
analysis can read it without the model. The config is frozen and validated on construction: a bad trial config
is one ConfigError before any data is drawn, integral numpy values (as Ray Tune passes them) become int, and
lr/iters left at None become the optimiser's defaults, so a config always says what was run.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from pefusion import record as R
from pefusion.errors import (NONNEGATIVE, POSITIVE, UNIT_INTERVAL, ConfigError, KeyRule, Rules, check_choice,
                             check_positive)

# ---------------------------------------------------------------------------------------------------------
# Published facts (σ = 0.5, λ = 0.01): ω -> α
# ---------------------------------------------------------------------------------------------------------

# α_c(ω): the training losses of the semantic and positional solutions cross (positional lower below it).
ALPHA_C_PUBLISHED: dict[float, float] = {
    0.0: 0.548, 0.1: 0.707, 0.15: 0.818, 0.2: 0.928, 0.25: 1.06, 0.3: 1.241, 0.35: 1.454, 0.4: 1.751, 0.425: 1.939,
}
# α_l(ω): semantic attention starts to beat the dense linear baseline in ε_g.
ALPHA_L_PUBLISHED: dict[float, float] = {0.0: 0.722, 0.1: 0.851, 0.2: 1.071, 0.3: 1.4506, 0.35: 1.750, 0.38: 1.993}
# The reproduction point (scripts/reproduce_student.py): d = 1000, σ = 0.5, ω = 0.3, λ = 0.01, α = 2, full-batch
# GD, 50 000 test samples, mean over 3 data seeds; and which initialisation reaches the lower training loss at two α.
REPRODUCTION_POINT = {"d": 1000, "sigma": 0.5, "omega": 0.3, "lam": 0.01, "alpha": 2.0, "n_test": 50_000}
REPRODUCTION_PUBLISHED = {"eps_g_semantic": 0.00144, "eps_g_positional": 0.00349, "eps_lin": 0.0020,
                          "theta_semantic": 0.63, "m_positional": 0.26}
REPRODUCTION_ORDER = {1.0: "positional", 1.6: "semantic"}  # α -> the init with the lower training loss

# Where a fit ended, named from its overlaps, not from its start: the semantic solution aligns Q with the teacher
# (θ = |Q*ᵀQ|/d ≈ 0.25–0.7, m ≈ 0.01 at σ 0.5, λ 0.01, d = 1000), the positional one with the positional
# encodings (m = |1ᵀQ|/d ≈ 0.2–0.26, θ ≈ 0.003–0.04); a start that escaped to the other solution is named by
# where it went.
SOLUTIONS = ("semantic", "positional")


def solution_reached(m: float | np.ndarray, theta: float | np.ndarray) -> str | np.ndarray:
    """'semantic' where θ > m, else 'positional' (elementwise for arrays; NaN overlaps give 'unknown')."""
    m, theta = np.asarray(m, dtype=float), np.asarray(theta, dtype=float)
    out = np.where(theta > m, SOLUTIONS[0], SOLUTIONS[1]).astype(object)
    out[np.isnan(m) | np.isnan(theta)] = "unknown"
    return out.item() if out.ndim == 0 else out

# ---------------------------------------------------------------------------------------------------------
# Names and configuration
# ---------------------------------------------------------------------------------------------------------

TEACHER_A: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "default": ((0.6, 0.4), (0.4, 0.6)),
    "alt": ((0.3, 0.7), (0.8, 0.2)),
}
INITS = ("semantic", "positional", "random")
OPTIMS = ("gd", "adam")
OPTIM_DEFAULTS = {"gd": (0.15, 5000), "adam": (0.01, 2500)}  # (lr, iterations), the authors' settings
DTYPES = ("float32", "float64")  # torch dtypes by name: the config is read before torch loads (--help)

# Linear baseline protocol (the authors'): Adam lr 0.5, 200 full-batch epochs, weight decay 1e-4.
LINEAR_LR, LINEAR_EPOCHS, LINEAR_WEIGHT_DECAY = 0.5, 200, 1e-4


@dataclass(frozen=True)
class StudentConfig:
    """One point of the student study: data (d, L, σ, ω, A, α, seed), student (r, init) and optimiser."""

    # the teacher's data: token dimension, tokens per sample, token std, positional weight, positional matrix
    d: int = 1000
    L: int = 2
    sigma: float = 0.5
    omega: float = 0.3
    teacher_A: str = "default"
    r: int = 1  # rank of Q, the teacher's and the student's
    alpha: float = 2.0  # samples per dimension, n = α d
    lam: float = 0.01  # weight decay λ
    init: str = "semantic"  # where the student starts: the semantic or the positional solution, or random
    seed: int = 0
    optim: str = "gd"
    lr: float | None = None  # None: the optimiser's default (0.15 GD, 0.01 Adam)
    iters: int | None = None  # None: the optimiser's default (5000 GD, 2500 Adam)
    n_test: int = 50_000
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for key, minimum in (("d", 2), ("L", 2), ("r", 1), ("seed", 0), ("n_test", 1)):
            self._integer(key, minimum)
        if self.L != 2:
            raise ConfigError(f"L={self.L!r} is not supported; the student model is implemented for L=2 tokens")
        check_positive("sigma", self.sigma)
        check_positive("alpha", self.alpha)
        if not (math.isfinite(self.omega) and 0.0 <= self.omega <= 1.0):
            raise ConfigError(f"omega={self.omega!r} is out of range; it must be in [0, 1]")
        check_positive("lam", self.lam, allow_zero=True)
        if self.n < 1:
            raise ConfigError(f"alpha*d={self.alpha * self.d:g} gives no training sample; increase alpha or d")
        for key, allowed in (("teacher_A", TEACHER_A), ("init", INITS), ("optim", OPTIMS), ("dtype", DTYPES)):
            check_choice(key, getattr(self, key), allowed)
        if self.lr is None:
            object.__setattr__(self, "lr", OPTIM_DEFAULTS[self.optim][0])
        if self.iters is None:
            object.__setattr__(self, "iters", OPTIM_DEFAULTS[self.optim][1])
        check_positive("lr", self.lr)
        self._integer("iters", 0)

    def _integer(self, key: str, minimum: int) -> None:
        """Integral values (also numpy's, as Ray Tune may pass) become int; others are a ConfigError."""
        value = getattr(self, key)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            raise ConfigError(f"{key}={value!r} is out of range; it must be an integer >= {minimum}")
        object.__setattr__(self, key, int(value))

    @property
    def n(self) -> int:
        """Training samples, n = round(α·d)."""
        return int(round(self.alpha * self.d))

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch
        return getattr(torch, self.dtype)


# ---------------------------------------------------------------------------------------------------------
# The cross-validation protocol, presets and the rules of a sweep's point
# ---------------------------------------------------------------------------------------------------------


def lam_grid(lo: float, hi: float, n: int) -> tuple[float, ...]:
    """n weight decays log-spaced over [lo, hi]."""
    return tuple(float(x) for x in np.logspace(np.log10(lo), np.log10(hi), n))


# The default protocol: 5-fold CV over one λ per decade in [1e-4, 1]; a trial fits lam_grid_n × (folds + 1) students,
# so 9 values (half-decades) cost 9/5 as much (the default sweep's time: docs/benchmarks.md, Student).
DEFAULT_CV = dict(lam_grid_min=1e-4, lam_grid_max=1.0, lam_grid_n=5, folds=5)
DEFAULT_FOLDS = DEFAULT_CV["folds"]
DEFAULT_LAM_GRID = lam_grid(DEFAULT_CV["lam_grid_min"], DEFAULT_CV["lam_grid_max"], DEFAULT_CV["lam_grid_n"])

# Keys of a λ-CV search space that are not StudentConfig fields: the λ grid and the number of folds.
CV_KEYS = ("lam_grid_min", "lam_grid_max", "lam_grid_n", "folds")
POINT_KEYS = tuple(f.name for f in dataclasses.fields(StudentConfig))

# What each key of a student search space accepts; the option names are StudentConfig's own tuples.
RULES = Rules({
    R.ALPHA: KeyRule(float, **POSITIVE),  # alpha = n/d
    R.OMEGA: KeyRule(float, **UNIT_INTERVAL),  # weight of the positional part of the teacher
    R.SIGMA: KeyRule(float, **POSITIVE),  # token standard deviation
    R.INIT: KeyRule(str, choices=INITS),
    R.SEED: KeyRule(int, **NONNEGATIVE),  # data seed (teacher Q*, samples)
    R.LAMBDA: KeyRule(float, **NONNEGATIVE),  # a fixed weight decay (no cross-validation)
    R.D: KeyRule(int, lo=2),
    "L": KeyRule(int, choices=(2,), note="the model has two tokens: A is 2x2 and p = +-1/sqrt(d)"),
    "r": KeyRule(int, lo=1),  # rank of Q
    "teacher_A": KeyRule(str, choices=tuple(TEACHER_A)),
    "optim": KeyRule(str, choices=OPTIMS),
    "iters": KeyRule(int, lo=1),
    "lr": KeyRule(float, **POSITIVE),
    "n_test": KeyRule(int, lo=1),
    "dtype": KeyRule(str, choices=tuple(DTYPES)),
    "folds": KeyRule(int, lo=2),
    "lam_grid_min": KeyRule(float, **POSITIVE),  # log-spaced lambda grid of the cross-validation
    "lam_grid_max": KeyRule(float, **POSITIVE),
    "lam_grid_n": KeyRule(int, lo=1),
})


@dataclass(frozen=True)
class StudentPreset:
    """Defaults of a student sweep: the point's fixed settings and the CV protocol."""

    point: dict[str, Any]
    cv: dict[str, Any]
    description: str


STUDENT_PRESETS: dict[str, StudentPreset] = {
    "paper": StudentPreset(
        description="Cui et al.'s setting: d=1000, sigma=0.5, full-batch GD lr 0.15 for 5000 steps, "
                    "50 000 fresh test samples",
        point=dict(d=1000, sigma=0.5, omega=0.3, optim="gd", n_test=50_000),
        cv=DEFAULT_CV),
    "demo": StudentPreset(
        description="~20 s on 2 CPU cores: d=200, 1500 GD steps, 10 000 test samples",
        point=dict(d=200, sigma=0.5, omega=0.3, optim="gd", iters=1500, n_test=10_000),
        cv=DEFAULT_CV),
}

# The phase diagram's own presets (sweeps/phase_diagram.py). Its demo must show the transition, not only run: at
# d = 200 a semantic start keeps an over-fitted minimum whose training loss ties the positional one, and 1 500
# steps are not converged at small α, so the d = 200 map alternated along α and its seed mean crossed near
# α 0.7 at ω 0.2 (d → ∞: 0.947). At d = 500 with the authors' 5 000 steps, 4 seeds (phase_diagram_demo.yaml)
# decide every point but the nearest to α_c at each ω and one 0.25 from it, and the seed mean crosses within 0.05
# of the theory's α_c at ω 0.2 and 0.3 (docs/student.md has the measured map).
PHASE_PRESETS: dict[str, StudentPreset] = {
    "paper": STUDENT_PRESETS["paper"],
    "demo": StudentPreset(
        description="a few minutes on 2 CPU cores: d=500, the authors' 5000 GD steps, 10 000 test samples",
        point=dict(d=500, sigma=0.5, omega=0.3, optim="gd", iters=5000, n_test=10_000),
        cv=DEFAULT_CV),
}


def smoke_student(preset: StudentPreset) -> StudentPreset:
    """Seconds per trial, for `--smoke` and tests."""
    return dataclasses.replace(preset, point={**preset.point, "d": 32, "iters": 100, "n_test": 500},
                               cv={**preset.cv, "lam_grid_n": 3, "folds": 2})


def point_config(config: dict[str, Any], preset: StudentPreset) -> tuple[StudentConfig, tuple[float, ...], int]:
    """The StudentConfig, λ grid and fold count of one trial config over a preset (a ConfigError if invalid)."""
    merged = {**preset.point, **preset.cv, **config}
    unknown = sorted(set(merged) - set(POINT_KEYS) - set(CV_KEYS))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; allowed: {', '.join(POINT_KEYS + CV_KEYS)}")
    lo, hi, n = merged["lam_grid_min"], merged["lam_grid_max"], int(merged["lam_grid_n"])
    if not 0 < lo <= hi or n < 1:
        raise ConfigError(f"the lambda grid needs 0 < lam_grid_min <= lam_grid_max and lam_grid_n >= 1, "
                          f"got [{lo}, {hi}] x {n}")
    grid = lam_grid(lo, hi, n)
    point = StudentConfig(**{k: v for k, v in merged.items() if k in POINT_KEYS})
    return point, grid, int(merged["folds"])
