"""The student study's command lines, the library half: `pefusion-lambda-cv` and `pefusion-phase`
(`sweeps/lambda_cv.py`, `sweeps/phase_diagram.py`; `cli/commands.py`) add their flags with `add_student_flags`,
parse them and call `run_student_sweep`, which wires study B into the sweep engine and prints one row per point at
the end."""
from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Sequence

from pefusion import record as R
from pefusion.cli.flags import add_preset_flag, add_sweep_flags, csv_list, search_space_path, sweep_options
from pefusion.errors import ConfigError
from pefusion.student.config import CV_KEYS, RULES, STUDENT_PRESETS, point_config, smoke_student
from pefusion.sweep.space import Constant, grid_size, load_search_space
from pefusion.sweep.tracking import STUDENT_EXPERIMENT

if TYPE_CHECKING:
    import pandas as pd

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
    add_sweep_flags(parser, experiment=STUDENT_EXPERIMENT, search_space=f"{sweep}.yaml")


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
            space = space.override_values(key, values)
    if args.smoke:  # the smoke budget wins over the space file's CV settings too
        for key in CV_KEYS:
            if key in space:
                space = space.override(key, Constant(preset.cv[key]))
    if sweep == "phase_diagram" and R.INIT in space:
        raise ConfigError("init: a phase-diagram trial fits both initialisations; remove 'init' from the space")

    # Here, after the checks above: these import torch and Ray (`--help` and input errors answer without them).
    from pefusion.student.trainable import lambda_cv_trainable, phase_trainable, student_run_name
    from pefusion.sweep.driver import StudySweep, run_sweep

    trainables = {"lambda_cv": lambda_cv_trainable, "phase_diagram": phase_trainable}
    study = StudySweep(
        sweep=sweep, preset=args.preset, space=space, trainable=trainables[sweep],
        ship=lambda: {"preset": preset, "cpus": args.cpus_per_trial},
        check_point=lambda point: point_config(point, preset), static_params={**preset.point, **preset.cv},
        identity=preset.point, sort_keys=(R.OMEGA, R.ALPHA, R.INIT, R.SEED), run_name=student_run_name,
        progress_metric=R.EPS_G if sweep == "lambda_cv" else f"{R.EPS_G}_semantic",
        describe=lambda shipped: f"{grid_size(space)} points ({sweep}, preset {args.preset})")
    result = run_sweep(study, sweep_options(args, sweep, argv), args.out)
    rows = result.rows
    n_failed = int((rows[R.STATUS] != R.STATUS_OK).sum())
    print(student_summary(rows))
    print(f"{len(rows)} trials, {len(rows) - n_failed} ok, {n_failed} failed\nresults: {result.paths[0]}\n"
          f"Ray experiment: {result.experiment_path}")
    return 0


def student_summary(rows: pd.DataFrame) -> str:
    """The columns a reader checks first, one row per point."""
    import pandas as pd

    cols = [c for c in (R.OMEGA, R.ALPHA, R.INIT, R.SEED, R.LAMBDA_STAR, R.EPS_G, R.EPS_T, R.M, R.THETA, R.EPS_LIN,
                        "eps_t_semantic", "eps_t_positional", R.GLOBAL_MIN, R.STATUS) if c in rows]
    with pd.option_context("display.width", 160, "display.max_rows", 400, "display.float_format", "{:.4g}".format):
        return rows[cols].to_string(index=False)

