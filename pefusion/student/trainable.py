"""The student-attention study on Ray Tune: one trial per point, λ cross-validation or a fixed-λ phase diagram.

A λ-CV trial fits every λ × fold (and the refits) of its point as one batched tensor program
(`pefusion.student.cv.run_cv_point`); a phase-diagram trial fits the semantic and positional initialisations
together (`run_phase_point`). Each ends with one `tune.report` of its record; the CV curve travels as a CSV in
the trial's checkpoint and becomes an MLflow artifact.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from ray import tune

from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.student.config import StudentConfig
from pefusion.student.cv import run_cv_point, run_phase_point
from pefusion.sweep.driver import SweepOptions, result_rows, run_tune

# Keys of a λ-CV search space that are not StudentConfig fields: the λ grid and the number of folds.
CV_KEYS = ("lam_grid_min", "lam_grid_max", "lam_grid_n", "folds")
POINT_KEYS = tuple(f.name for f in dataclasses.fields(StudentConfig))


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


def run_student_sweep(trainable: Callable, preset: StudentPreset, preset_name: str, param_space: dict[str, Any],
                      opts: SweepOptions) -> tuple[pd.DataFrame, Any, str]:
    """Run the points of `param_space`; returns (rows, recorder, experiment path)."""
    fn = tune.with_parameters(trainable, preset=preset, cpus=opts.cpus_per_trial)
    results, recorder, exp_path, _ = run_tune(fn, param_space, opts, preset=preset_name,
                                              static_params={**preset.point, **preset.cv},
                                              run_name=student_run_name)
    rows = pd.DataFrame(result_rows(results))
    for key, value in preset.point.items():  # the fixed settings, for trials whose space did not vary them
        rows[key] = rows[key].fillna(value) if key in rows else value
    keys = [k for k in (R.OMEGA, R.ALPHA, R.INIT, R.SEED) if k in rows]
    return rows.sort_values(keys, kind="stable").reset_index(drop=True), recorder, exp_path


def write_student_results(rows: pd.DataFrame, name: str, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}_results.csv"
    rows.to_csv(path, index=False)
    return path


# ---------------------------------------------------------------------------------------------------------
# The command lines (sweeps/lambda_cv.py, sweeps/phase_diagram.py)
# ---------------------------------------------------------------------------------------------------------

SWEEPS = {
    "lambda_cv": (lambda_cv_trainable, "lambda_cv.yaml",
                  "K-fold cross-validation of the weight decay lambda at each (alpha, omega, sigma, init, seed) "
                  "point, refit at lambda*, test on fresh samples (SPEC section 5)."),
    "phase_diagram": (phase_trainable, "phase_diagram.yaml",
                      "Fixed lambda, a grid over alpha x omega; both initialisations at every point, which one is "
                      "the global minimum, and the linear baseline (the paper's Fig. 3)."),
}


def student_main(sweep: str, argv: Sequence[str] | None = None) -> int:
    """The whole command line of a student sweep: parse, validate, run on Ray, write the CSV, print a summary."""
    from pefusion.cli.flags import add_preset_flag, add_sweep_flags, csv_list, search_space_path, sweep_options
    from pefusion.sweep.space import STUDENT_RULES, grid_size, load_search_space, to_tune
    from pefusion.sweep.tracking import STUDENT_EXPERIMENT

    trainable, space_file, description = SWEEPS[sweep]
    parser = argparse.ArgumentParser(prog=f"sweeps/{sweep}.py", description=description)
    add_preset_flag(parser, default="paper", presets=STUDENT_PRESETS)
    narrowing = (("--alphas", float, "alpha = n/d", "0.5,1,2"), ("--omegas", float, "omega", "0,0.3"),
                 ("--seeds", int, "data seed", "0,1"), ("--inits", str, "initialisation", "semantic,positional"))
    for flag, kind, what, example in narrowing:
        parser.add_argument(flag, type=csv_list(kind), help=f"narrow the {what} grid, e.g. {flag} {example}")
    parser.add_argument("--d", type=int, help="embedding dimension (default: the preset's)")
    parser.add_argument("--iters", type=int, help="optimiser iterations (default: the preset's)")
    add_sweep_flags(parser, experiment=STUDENT_EXPERIMENT, search_space=space_file)
    args = parser.parse_args(argv)

    preset = STUDENT_PRESETS[args.preset]
    if args.smoke:
        preset = smoke_student(preset)
    overrides = {k: v for k, v in (("d", args.d), ("iters", args.iters)) if v is not None}
    preset = dataclasses.replace(preset, point={**preset.point, **overrides})
    space = load_search_space(search_space_path(args), STUDENT_RULES)
    for key, values in ((R.ALPHA, args.alphas), (R.OMEGA, args.omegas), (R.SEED, args.seeds),
                        (R.INIT, args.inits)):
        if values:
            space = space.override_values(key, values)
    if args.smoke:  # the smoke budget wins over the space file's CV settings too
        from pefusion.sweep.space import Constant

        for key in CV_KEYS:
            if key in space:
                space = space.override(key, Constant(preset.cv[key]))
    if sweep == "phase_diagram" and R.INIT in space:
        raise ConfigError("init: a phase-diagram trial fits both initialisations; remove 'init' from the space")
    for combo in _grid_points(space):  # every point must be valid before Ray starts
        point_config(combo, preset)

    opts = sweep_options(args, sweep, argv)
    print(f"{grid_size(space)} points ({sweep}, preset {args.preset})", flush=True)
    rows, recorder, exp_path = run_student_sweep(trainable, preset, args.preset, to_tune(space), opts)
    name = exp_path.rstrip("/").split("/")[-1]
    path = write_student_results(rows, name, args.out)
    recorder.log_parent_artifacts([path])
    n_failed = int((rows[R.STATUS] != R.STATUS_OK).sum())
    recorder.finish_sweep({"n_trials": len(rows), "n_failed": n_failed})
    print(student_summary(rows))
    print(f"{len(rows)} trials, {len(rows) - n_failed} ok, {n_failed} failed\nresults: {path}\n"
          f"Ray experiment: {exp_path}")
    return 0


def _grid_points(space) -> list[dict[str, Any]]:
    from pefusion.sweep.space import Choice, Constant, Grid

    axes = [[(k, v) for v in d.values] if isinstance(d, (Grid, Choice)) else [(k, d.value)]
            for k, d in space.items() if isinstance(d, (Grid, Choice, Constant))]
    return [dict(c) for c in itertools.product(*axes)]


def student_summary(rows: pd.DataFrame) -> str:
    """The columns a reader checks first, one row per point."""
    cols = [c for c in (R.OMEGA, R.ALPHA, R.INIT, R.SEED, R.LAMBDA_STAR, R.EPS_G, R.EPS_T, R.M, R.THETA, R.EPS_LIN,
                        "eps_t_semantic", "eps_t_positional", R.GLOBAL_MIN, R.STATUS) if c in rows]
    with pd.option_context("display.width", 160, "display.max_rows", 400, "display.float_format", "{:.4g}".format):
        return rows[cols].to_string(index=False)
