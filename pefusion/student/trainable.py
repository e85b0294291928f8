"""The student-attention study on Ray Tune: presets, the rules of a point, and the trainables (one trial per point,
λ cross-validation or a fixed-λ phase diagram).

A λ-CV trial fits every λ × fold (and the refits) of its point as one batched tensor program
(`pefusion.student.cv.run_cv_point`); a phase-diagram trial fits the semantic and positional initialisations
together (`run_phase_point`). Each ends with one `tune.report` of its record; the CV curve travels as a CSV in
the trial's checkpoint and becomes an MLflow artifact.
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from ray import tune

from pefusion import record as R
from pefusion.errors import NONNEGATIVE, POSITIVE, UNIT_INTERVAL, ConfigError, KeyRule, Rules
from pefusion.student.config import DTYPES, INITS, OPTIMS, TEACHER_A, StudentConfig
from pefusion.student.cv import run_cv_point, run_phase_point

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
                    "50 000 fresh test samples, 5-fold CV over 5 lambdas in [1e-4, 1] (one per decade)",
        point=dict(d=1000, sigma=0.5, omega=0.3, optim="gd", n_test=50_000),
        # one λ per decade: the 60-trial default measured 16 min on 2 cores (9 values: ~22 min); see lambda_cv.yaml
        cv=dict(lam_grid_min=1e-4, lam_grid_max=1.0, lam_grid_n=5, folds=5)),
    "demo": StudentPreset(
        description="a couple of minutes on a laptop CPU: d=200, 1500 GD steps, 10 000 test samples",
        point=dict(d=200, sigma=0.5, omega=0.3, optim="gd", iters=1500, n_test=10_000),
        cv=dict(lam_grid_min=1e-4, lam_grid_max=1.0, lam_grid_n=5, folds=5)),
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
    grid = tuple(float(x) for x in np.logspace(np.log10(lo), np.log10(hi), n))
    point = StudentConfig(**{k: v for k, v in merged.items() if k in POINT_KEYS})
    return point, grid, int(merged["folds"])


def with_status(result: dict[str, Any]) -> dict[str, Any]:
    """The record with status ok, or 'diverged' naming its non-finite metrics (a fit that blew up, e.g. lr too
    large): recorded like a diverged PE-fusion trial, never reported as a result."""
    bad = sorted(k for k, v in result.items() if isinstance(v, float) and not math.isfinite(v))
    if bad:
        return {**result, R.STATUS: R.STATUS_DIVERGED,
                R.ERROR: f"non-finite {', '.join(bad)}: the fit diverged (a smaller lr, or fewer iterations)"}
    return {**result, R.STATUS: R.STATUS_OK}


def lambda_cv_trainable(config: dict[str, Any], *, preset: StudentPreset, cpus: float) -> None:
    """One λ-CV point: CV over the λ grid, refit at λ*, report the record; the curve goes in the checkpoint."""
    torch.set_num_threads(max(1, int(cpus)))
    point, grid, folds = point_config(config, preset)
    result = run_cv_point(point, grid, folds)
    curve = pd.DataFrame(result.pop(R.CV_CURVE))
    with tempfile.TemporaryDirectory() as tmp:
        curve.to_csv(Path(tmp) / R.CV_CURVE_ARTIFACT, index=False)
        tune.report(with_status(result), checkpoint=tune.Checkpoint.from_directory(tmp))


def phase_trainable(config: dict[str, Any], *, preset: StudentPreset, cpus: float) -> None:
    """One phase-diagram point at a fixed λ: both initialisations, batched."""
    torch.set_num_threads(max(1, int(cpus)))
    point, _, _ = point_config(config, preset)
    extra = {k: getattr(point, k) for k in ("optim", "lr", "iters", "n_test", "teacher_A", "r", "dtype")}
    result = run_phase_point(alpha=point.alpha, omega=point.omega, sigma=point.sigma, lam=point.lam,
                             seed=point.seed, d=point.d, **extra)
    tune.report(with_status(result))


def student_run_name(config: dict[str, Any]) -> str:
    parts = [f"a{config[R.ALPHA]:.3g}" if R.ALPHA in config else "", f"w{config[R.OMEGA]:g}" if R.OMEGA in config
             else "", str(config.get(R.INIT, "")), f"s{config.get(R.SEED, 0)}"]
    return "-".join(p for p in parts if p)
