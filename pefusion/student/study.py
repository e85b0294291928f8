"""Study B as the sweep engine sees it: the `StudySweep` of a λ cross-validation or phase-diagram grid
(`student_study`) and of a λ search at one point (`lambda_search_space`, `lambda_search_study`).

The study's wiring, above the engine and below the analysis; the command lines (`pefusion.cli.student`) parse the
flags into a preset, a search space and a plan, give the CSVs their paper form, and print what it returns. The
trainables (torch, Ray) are imported as a study is made, so that a search plan is checked before they load.
"""
from __future__ import annotations

import pandas as pd

from pefusion import record as R
from pefusion.student.config import CV_KEYS, StudentPreset, point_config
from pefusion.sweep.console import counted
from pefusion.sweep.search import Objective, SearchPlan, build, check
from pefusion.sweep.space import (Choice, Constant, Grid, LogUniform, SearchSpace, SearchSpaceError, grid_size,
                                  parse_search_space)
from pefusion.sweep.study import StudySweep


def student_study(sweep: str, preset_name: str, preset: StudentPreset, space: SearchSpace,
                  cpus: float) -> StudySweep:
    """Study B as the engine sees it: one trial per point of `space` over `preset`, `sweep` naming the trainable
    (`lambda_cv` or `phase_diagram`)."""
    from pefusion.student.timing import plan_timer
    from pefusion.student.trainable import lambda_cv_trainable, phase_trainable, student_run_name

    trainables = {"lambda_cv": lambda_cv_trainable, "phase_diagram": phase_trainable}
    shown = R.EPS_G if sweep == "lambda_cv" else f"{R.EPS_G}_semantic"
    return StudySweep(
        sweep=sweep, preset=preset_name, experiment=R.STUDENT_EXPERIMENT, space=space, trainable=trainables[sweep],
        ship=lambda: {"preset": preset, "cpus": cpus},
        check_point=lambda point: point_config(point, preset), static_params={**preset.point, **preset.cv},
        identity=preset.point, sort_keys=(R.OMEGA, R.ALPHA, R.INIT, R.SEED), run_name=student_run_name,
        shown={shown: lambda v: f"{shown} {v:.4g}"}, timer=plan_timer(sweep, preset, cpus),
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


def best_lambda(rows: pd.DataFrame) -> pd.DataFrame:
    """The λ search's best trial (least mean CV error), its λ named λ*; empty where no trial ended ok."""
    ok = rows[rows[R.STATUS] == R.STATUS_OK].dropna(subset=[R.CV_ERROR_MEAN])
    return ok.loc[[ok[R.CV_ERROR_MEAN].idxmin()]].rename(columns={R.LAMBDA: R.LAMBDA_STAR}) if len(ok) else ok


def lambda_search_study(preset_name: str, preset: StudentPreset, space: SearchSpace, plan: SearchPlan,
                        cpus: float) -> StudySweep:
    """`lambda_cv --search random|optuna|cmaes`: at one point, each trial is one λ's K-fold CV error and the
    search minimises it; λ* is the best trial's λ, and that trial's refit is the point's result."""
    space = lambda_search_space(space, preset, plan.search)
    objective = Objective(metric=R.CV_ERROR_MEAN, mode="min")
    check(plan, objective, space)
    from pefusion.student.timing import plan_timer
    from pefusion.student.trainable import lambda_trial_trainable, student_run_name

    return StudySweep(
        sweep="lambda_cv", preset=preset_name, experiment=R.STUDENT_EXPERIMENT, space=space,
        trainable=lambda_trial_trainable,
        ship=lambda: {"preset": preset, "cpus": cpus},
        check_point=lambda point: point_config(point, preset),
        static_params={**preset.point, "folds": preset.cv["folds"]}, identity=preset.point, sort_keys=(R.LAMBDA,),
        run_name=lambda cfg: f"{student_run_name(cfg)}-lam{cfg[R.LAMBDA]:.3g}",
        shown={R.CV_ERROR_MEAN: lambda v: f"cv error {v:.4g}"},
        describe=lambda shipped: f"{counted(plan.num_samples, 'lambda')} ({plan.search} search, preset {preset_name})",
        tables=lambda rows: {"lambda_star": best_lambda(rows)}, timer=plan_timer("lambda_search", preset, cpus),
        parent_metrics=lambda rows: {k: float(best_lambda(rows)[k].iloc[0]) for k in (R.LAMBDA_STAR, R.CV_ERROR_MEAN)
                                     if len(best_lambda(rows))},
        **build(plan, objective, space))
