"""The student study's command lines, the library half: `pefusion-lambda-cv` and `pefusion-phase`
(`sweeps/lambda_cv.py`, `sweeps/phase_diagram.py`; `cli/commands.py`) add their flags with `add_student_flags`,
parse them and call `run_student_sweep`, which wires study B into the sweep engine and prints one row per point at
the end."""
from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Sequence

from pefusion import record as R
from pefusion.cli.flags import (add_preset_flag, add_search_flags, add_sweep_flags, csv_list, search_plan,
                                search_space_path, sweep_options)
from pefusion.errors import ConfigError
from pefusion.student.config import CV_KEYS, RULES, STUDENT_PRESETS, StudentPreset, point_config, smoke_student
from pefusion.sweep.console import counted
from pefusion.sweep.search import Objective, build, check
from pefusion.sweep.space import (Choice, Constant, Grid, LogUniform, SearchSpace, SearchSpaceError, grid_size,
                                  load_search_space, parse_search_space)

if TYPE_CHECKING:
    import pandas as pd

    from pefusion.sweep.study import StudySweep

# Flags that narrow a grid of the search-space file: (flag, type, what, example).
NARROWING = (("--alphas", float, "alpha = n/d", "0.5,1,2"), ("--omegas", float, "omega", "0,0.3"),
             ("--seeds", int, "data seed", "0,1"), ("--inits", str, "initialisation", "semantic,positional"))


def add_student_flags(parser: argparse.ArgumentParser, sweep: str) -> None:
    """The flags of both student sweeps: preset, grid narrowing, size, and every sweep's common flags."""
    add_preset_flag(parser, default="paper", presets=STUDENT_PRESETS)
    for flag, kind, what, example in NARROWING:
        parser.add_argument(flag, type=csv_list(kind), help=f"narrow the {what} grid, e.g. {flag} {example}")
    parser.add_argument("--d", type=int, help="embedding dimension (default: the preset's)")
    parser.add_argument("--iters", type=int, help="optimiser iterations (default: the preset's)")
    if sweep == "lambda_cv":  # the phase diagram optimises nothing: a grid of points, both inits at each
        add_search_flags(parser, searches=("grid", "random", "optuna", "cmaes"), default_search="grid",
                         default_samples=12)
    add_sweep_flags(parser, experiment=R.STUDENT_EXPERIMENT, search_space=f"{sweep}.yaml")


def run_student_sweep(sweep: str, args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """One student sweep (`lambda_cv` or `phase_diagram`): validate, run on Ray, write the CSV, print a summary."""
    preset = STUDENT_PRESETS[args.preset]
    if args.smoke:
        preset = smoke_student(preset)
    overrides = {k: v for k, v in (("d", args.d), ("iters", args.iters)) if v is not None}
    preset = dataclasses.replace(preset, point={**preset.point, **overrides})
    space = load_search_space(search_space_path(args), RULES)
    for (flag, *_), key in zip(NARROWING, (R.ALPHA, R.OMEGA, R.SEED, R.INIT)):
        values = getattr(args, flag.lstrip("-"))
        if values:
            space = space.override_values(key, values, flag)
    if args.smoke:  # the smoke budget wins over the space file's CV settings too
        for key in CV_KEYS:
            if key in space:
                space = space.override(key, Constant(preset.cv[key]))
    if sweep == "phase_diagram" and R.INIT in space:
        raise ConfigError("init: a phase-diagram trial fits both initialisations; remove 'init' from the space")
    if getattr(args, "search", "grid") != "grid":
        return run_lambda_search(args, preset, space, argv)
    if sweep == "lambda_cv":  # grid CV inside each trial; the points are a grid, run once each
        check(search_plan(args), Objective(metric=None), space)

    # Here, after the checks above: the engine and the trainables import torch and Ray (`--help` and input errors
    # answer without them).
    from pefusion.sweep.driver import run_sweep

    study = student_study(sweep, args.preset, preset, space, args.cpus_per_trial)
    result = run_sweep(study, sweep_options(args, sweep, argv), args.out)
    rows = result.rows
    n_failed = int((rows[R.STATUS] != R.STATUS_OK).sum())
    print(student_summary(rows))
    print(f"{counted(len(rows), 'trial')}, {len(rows) - n_failed} ok, {n_failed} failed\nresults: {result.paths[0]}\n"
          f"Ray experiment: {result.experiment_path}")
    return 0


def student_study(sweep: str, preset_name: str, preset: StudentPreset, space: SearchSpace,
                  cpus: float) -> StudySweep:
    """Study B as the engine sees it: one trial per point of `space` over `preset`, `sweep` naming the trainable
    (`lambda_cv` or `phase_diagram`)."""
    from pefusion.analysis.formats import csv_ready
    from pefusion.student.trainable import lambda_cv_trainable, phase_trainable, student_run_name
    from pefusion.sweep.study import StudySweep

    trainables = {"lambda_cv": lambda_cv_trainable, "phase_diagram": phase_trainable}
    shown = R.EPS_G if sweep == "lambda_cv" else f"{R.EPS_G}_semantic"
    return StudySweep(
        sweep=sweep, preset=preset_name, experiment=R.STUDENT_EXPERIMENT, space=space, trainable=trainables[sweep],
        ship=lambda: {"preset": preset, "cpus": cpus}, csv=csv_ready,
        check_point=lambda point: point_config(point, preset), static_params={**preset.point, **preset.cv},
        identity=preset.point, sort_keys=(R.OMEGA, R.ALPHA, R.INIT, R.SEED), run_name=student_run_name,
        shown={shown: lambda v: f"{shown} {v:.4g}"},
        describe=lambda shipped: f"{counted(grid_size(space), 'point')} ({sweep}, preset {preset_name})")


def lambda_search_space(space: SearchSpace, preset: StudentPreset, search: str) -> SearchSpace:
    """The λ search's space: the space's one point (every key one value), `lam` sampled over the file's range or
    loguniform over [lam_grid_min, lam_grid_max], and the number of folds (`--num-samples` replaces lam_grid_n)."""
    dims: dict = {}
    for key, dim in space.items():
        if key in ("lam_grid_min", "lam_grid_max", "lam_grid_n"):
            continue
        if isinstance(dim, (Grid, Choice)) and len(dim.values) == 1:
            dim = Constant(dim.values[0])
        if key != R.LAMBDA and not isinstance(dim, Constant):
            n = f"{len(dim.values)} values" if isinstance(dim, (Grid, Choice)) else "a range"
            raise SearchSpaceError(f"{space.source}: {key}: --search {search} searches lambda at one point and {key} "
                                   f"takes {n}; narrow it (--alphas, --omegas, --seeds, --inits) or make it a "
                                   f"constant")
        dims[key] = dim
    if isinstance(dims.get(R.LAMBDA), Constant):
        raise SearchSpaceError(f"{space.source}: {R.LAMBDA}: --search {search} samples lambda; give it a range "
                               f"(lam: {{loguniform: [1e-4, 1]}}) or leave it out")
    if R.LAMBDA not in dims:
        cv = {**preset.cv, **{k: d.value for k, d in space.items() if k in CV_KEYS and isinstance(d, Constant)}}
        dims[R.LAMBDA] = LogUniform(cv["lam_grid_min"], cv["lam_grid_max"])
    return parse_search_space(dims, space.rules, space.source)


def run_lambda_search(args: argparse.Namespace, preset: StudentPreset, space: SearchSpace,
                      argv: Sequence[str] | None = None) -> int:
    """`lambda_cv --search random|optuna|cmaes`: at one point, each trial is one λ's K-fold CV error and the
    search minimises it; λ* is the best trial's λ, and that trial's refit is the point's result."""
    import pandas as pd

    space = lambda_search_space(space, preset, args.search)
    plan = search_plan(args)
    objective = Objective(metric=R.CV_ERROR_MEAN, mode="min")
    check(plan, objective, space)

    def best(rows: pd.DataFrame) -> pd.DataFrame:
        ok = rows[rows[R.STATUS] == R.STATUS_OK].dropna(subset=[R.CV_ERROR_MEAN])
        return ok.loc[[ok[R.CV_ERROR_MEAN].idxmin()]].rename(columns={R.LAMBDA: R.LAMBDA_STAR}) if len(ok) else ok

    from pefusion.analysis.formats import csv_ready
    from pefusion.student.trainable import lambda_trial_trainable, student_run_name
    from pefusion.sweep.driver import run_sweep
    from pefusion.sweep.study import StudySweep

    study = StudySweep(
        sweep="lambda_cv", preset=args.preset, experiment=R.STUDENT_EXPERIMENT, space=space,
        trainable=lambda_trial_trainable, csv=csv_ready,
        ship=lambda: {"preset": preset, "cpus": args.cpus_per_trial},
        check_point=lambda point: point_config(point, preset),
        static_params={**preset.point, "folds": preset.cv["folds"]}, identity=preset.point, sort_keys=(R.LAMBDA,),
        run_name=lambda cfg: f"{student_run_name(cfg)}-lam{cfg[R.LAMBDA]:.3g}",
        shown={R.CV_ERROR_MEAN: lambda v: f"cv error {v:.4g}"},
        describe=lambda shipped: f"{counted(plan.num_samples, 'lambda')} ({args.search} search, preset {args.preset})",
        tables=lambda rows: {"lambda_star": best(rows)},
        parent_metrics=lambda rows: {k: float(best(rows)[k].iloc[0]) for k in (R.LAMBDA_STAR, R.CV_ERROR_MEAN)
                                     if len(best(rows))},
        **build(plan, objective, space))
    result = run_sweep(study, sweep_options(args, "lambda_cv", argv), args.out)
    rows, top = result.rows, best(result.rows)
    cols = [c for c in (R.LAMBDA, R.CV_ERROR_MEAN, R.CV_ERROR_STD, R.EPS_G, R.EPS_T, R.STATUS) if c in rows]
    with pd.option_context("display.width", 160, "display.max_rows", 400, "display.float_format", "{:.4g}".format):
        print(rows[cols].to_string(index=False))
    if len(top):
        t = top.iloc[0]
        print(f"lambda* = {t[R.LAMBDA_STAR]:.4g} (cv_error_mean {t[R.CV_ERROR_MEAN]:.4g}, the best of "
              f"{counted(len(rows), 'trial')}); refit there: eps_g {t[R.EPS_G]:.4g}, eps_t {t[R.EPS_T]:.4g}")
    print(f"results: {', '.join(map(str, result.paths))}\nRay experiment: {result.experiment_path}")
    return 0


def student_summary(rows: pd.DataFrame) -> str:
    """The columns a reader checks first, one row per point."""
    import pandas as pd

    cols = [c for c in (R.OMEGA, R.ALPHA, R.INIT, R.SEED, R.LAMBDA_STAR, R.EPS_G, R.EPS_T, R.M, R.THETA, R.EPS_LIN,
                        "eps_t_semantic", "eps_t_positional", R.GLOBAL_MIN, R.STATUS) if c in rows]
    with pd.option_context("display.width", 160, "display.max_rows", 400, "display.float_format", "{:.4g}".format):
        return rows[cols].to_string(index=False)

