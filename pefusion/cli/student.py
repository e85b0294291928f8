"""The student study's command lines, the library half: `pefusion-lambda-cv` and `pefusion-phase`
(`sweeps/lambda_cv.py`, `sweeps/phase_diagram.py`; `cli/commands.py`) add their flags with `add_student_flags`,
parse them and call `run_student_sweep`, which turns the flags into a preset and a search space, hands study B's
sweep (`pefusion.student.study`) to the engine and prints one row per point at the end."""
from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from pefusion import record as R
from pefusion.cli.flags import add_preset_flag, add_search_flags, add_sweep_flags, csv_list, search_plan
from pefusion.errors import ConfigError
from pefusion.student.config import CV_KEYS, PHASE_PRESETS, RULES, STUDENT_PRESETS, StudentPreset, smoke_student
from pefusion.sweep.console import counted
from pefusion.sweep.options import SweepOptions
from pefusion.sweep.search import Objective, check
from pefusion.sweep.space import Constant, SearchSpace, load_search_space

if TYPE_CHECKING:
    import pandas as pd

    from pefusion.sweep.study import StudySweep

# Flags that narrow a grid of the search-space file: (flag, type, what, example).
NARROWING = (("--alphas", float, "alpha = n/d", "0.5,1,2"), ("--omegas", float, "omega", "0,0.3"),
             ("--seeds", int, "data seed", "0,1"), ("--inits", str, "initialisation", "semantic,positional"))


def presets_of(sweep: str) -> dict[str, StudentPreset]:
    """The presets of a student sweep: the phase diagram has its own (its demo must converge to show the
    transition), λ-CV the study's."""
    return PHASE_PRESETS if sweep == "phase_diagram" else STUDENT_PRESETS


def add_student_flags(parser: argparse.ArgumentParser, sweep: str) -> None:
    """The flags of both student sweeps: preset, grid narrowing, size, and every sweep's common flags."""
    add_preset_flag(parser, default="paper", presets=presets_of(sweep),
                    describe=lambda preset: preset.description + (f"; {cv_protocol(preset)}" if sweep == "lambda_cv"
                                                                  else ""))
    for flag, kind, what, example in NARROWING:
        if sweep == "phase_diagram" and flag == "--inits":  # its trials fit both initialisations at every point
            continue
        parser.add_argument(flag, type=csv_list(kind), help=f"narrow the {what} grid, e.g. {flag} {example}")
    parser.add_argument("--d", type=int, help="embedding dimension (default: the preset's)")
    parser.add_argument("--iters", type=int, help="optimiser iterations (default: the preset's)")
    if sweep == "lambda_cv":  # the phase diagram optimises nothing: a grid of points, both inits at each
        add_search_flags(parser, searches=("grid", "random", "optuna", "cmaes"), default_search="grid",
                         default_samples=12)
    add_sweep_flags(parser, experiment=R.STUDENT_EXPERIMENT, search_space=f"{sweep}.yaml", epochs=False)


def cv_protocol(preset: StudentPreset) -> str:
    """The preset's λ-CV in words, for the λ-CV sweep's --help (the phase diagram fixes λ: it has none)."""
    cv = preset.cv
    return (f"{cv['folds']}-fold CV over {cv['lam_grid_n']} lambdas log-spaced in "
            f"[{cv['lam_grid_min']:g}, {cv['lam_grid_max']:g}]")


def run_student_sweep(sweep: str, args: argparse.Namespace, opts: SweepOptions) -> int:
    """One student sweep (`lambda_cv` or `phase_diagram`): validate, run on Ray, write the CSV, print a summary."""
    preset = presets_of(sweep)[args.preset]
    if args.smoke:
        preset = smoke_student(preset)
    overrides = {k: v for k, v in (("d", args.d), ("iters", args.iters)) if v is not None}
    preset = dataclasses.replace(preset, point={**preset.point, **overrides})
    space = load_search_space(opts.search_space, RULES)
    for (flag, *_), key in zip(NARROWING, (R.ALPHA, R.OMEGA, R.SEED, R.INIT)):
        values = getattr(args, flag.lstrip("-"), None)
        if values:
            space = space.override_values(key, values, flag)
    if args.smoke:  # the smoke budget wins over the space file's CV settings too
        for key in CV_KEYS:
            if key in space:
                space = space.override(key, Constant(preset.cv[key]))
    if sweep == "phase_diagram" and R.INIT in space:
        raise ConfigError(f"{space.source}: init: a phase-diagram trial fits both initialisations at every "
                          f"point, so its search space has no 'init' key; remove it")
    if getattr(args, "search", "grid") != "grid":
        return run_lambda_search(args, opts, preset, space)
    if sweep == "lambda_cv":  # grid CV inside each trial; the points are a grid, run once each
        check(search_plan(args), Objective(metric=None), space)

    # Here, after the checks above: the engine and the trainables import torch and Ray (`--help` and input errors
    # answer without them).
    from pefusion.student.study import student_study
    from pefusion.sweep.driver import run_settled
    from pefusion.sweep.settle import settle

    study = student_study(sweep, args.preset, preset, space, opts.cpus_per_trial)
    settled = settle(in_paper_form(study), opts)  # with --plan: the plan printed, and nothing run
    if opts.plan:
        return 0
    result = run_settled(settled, args.out)
    rows = result.rows
    n_failed = int((rows[R.STATUS] != R.STATUS_OK).sum())
    print(student_summary(rows))
    print(f"{counted(len(rows), 'trial')}, {len(rows) - n_failed} ok, {n_failed} failed\nresults: {result.paths[0]}\n"
          f"Ray experiment: {result.experiment_path}")
    return 0


def run_lambda_search(args: argparse.Namespace, opts: SweepOptions, preset: StudentPreset,
                      space: SearchSpace) -> int:
    """`lambda_cv --search random|optuna|cmaes`: a λ search at the space's one point (`lambda_search_study`); prints
    its trials and λ*."""
    import pandas as pd

    from pefusion.student.study import best_lambda, lambda_search_study
    from pefusion.sweep.driver import run_settled
    from pefusion.sweep.settle import settle

    study = lambda_search_study(args.preset, preset, space, search_plan(args), opts.cpus_per_trial)
    settled = settle(in_paper_form(study), opts)  # with --plan: the plan printed, and nothing run
    if opts.plan:
        return 0
    result = run_settled(settled, args.out)
    rows, top = result.rows, best_lambda(result.rows)
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


def in_paper_form(study: StudySweep) -> StudySweep:
    """`study` with every CSV its sweep writes in the analysis's paper form (units in the headers, rounding)."""
    from pefusion.analysis.formats import csv_ready

    return dataclasses.replace(study, csv=csv_ready)
