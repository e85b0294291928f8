"""The student-attention study on Ray Tune: presets, the rules of a point, and the trainables (one trial per point,
λ cross-validation or a fixed-λ phase diagram).

A λ-CV trial fits every λ × fold (and the refits) of its point as one batched tensor program
(`pefusion.student.cv.run_cv_point`); a phase-diagram trial fits the semantic and positional initialisations
together (`run_phase_point`). Each ends with one `tune.report` of its record; the CV curve travels as a CSV in
the trial's checkpoint and becomes an MLflow artifact.
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import ray
import torch
from ray import tune

from pefusion import record as R
from pefusion.student.config import StudentPreset, point_config
from pefusion.student.cv import run_cv_point, run_phase_point

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
        tune.report(with_status(_with_node(result)), checkpoint=tune.Checkpoint.from_directory(tmp))


def phase_trainable(config: dict[str, Any], *, preset: StudentPreset, cpus: float) -> None:
    """One phase-diagram point at a fixed λ: both initialisations, batched."""
    torch.set_num_threads(max(1, int(cpus)))
    point, _, _ = point_config(config, preset)
    extra = {k: getattr(point, k) for k in ("optim", "lr", "iters", "n_test", "teacher_A", "r", "dtype")}
    result = run_phase_point(alpha=point.alpha, omega=point.omega, sigma=point.sigma, lam=point.lam,
                             seed=point.seed, d=point.d, **extra)
    tune.report(with_status(_with_node(result)))


def _with_node(result: dict[str, Any]) -> dict[str, Any]:
    """The record with the Ray node that computed it (a tag of its MLflow run)."""
    return {**result, R.NODE: ray.get_runtime_context().get_node_id()}


def student_run_name(config: dict[str, Any]) -> str:
    parts = [f"a{config[R.ALPHA]:.3g}" if R.ALPHA in config else "", f"w{config[R.OMEGA]:g}" if R.OMEGA in config
             else "", str(config.get(R.INIT, "")), f"s{config.get(R.SEED, 0)}"]
    return "-".join(p for p in parts if p)


def lambda_trial_trainable(config: dict[str, Any], *, preset: StudentPreset, cpus: float) -> None:
    """One λ of a λ search at a fixed point: the K-fold CV error at the config's `lam` (what the search
    minimises, `cv_error_mean`) and the refit at that λ on all n samples, in one report."""
    torch.set_num_threads(max(1, int(cpus)))
    point, _, folds = point_config(config, preset)
    result = run_cv_point(point, (point.lam,), folds)
    (score,) = result.pop(R.CV_CURVE)  # this λ's CV error; λ* is the search's, not a trial's
    del result[R.LAMBDA_STAR]
    tune.report(with_status(_with_node({**result, **score})))
