"""Every command's main: `sweeps/*.py` and the user-facing `scripts/*.py` run these, and so do the installed
commands of pyproject's [project.scripts] (the table of docs/cli.md), for a user who installed pefusion without a
clone. The sweeps', the report's and the analysis scripts' parsers are here; the GPU check, the student fit, the
reproduction and the theory keep theirs beside their output (`cli/gpu_check.py`, `cli/fit.py`,
`cli/reproduction.py`, `cli/theory.py`), imported only when the command runs.

A main parses its flags and checks what needs no study before it imports the study's command line (`cli/fusion.py`,
`cli/student.py`), and those check their inputs before they import torch, Ray or MLflow: `--help` and a
mistyped flag answer at once (docs/cli.md, Flags every sweep shares).
"""
from __future__ import annotations

import argparse
from typing import Sequence

from pefusion.cli.flags import (add_data_flags, add_grid_flags, add_preset_flag, add_search_flags, add_sweep_flags,
                                run_main, sweep_options)
from pefusion.fusion.config import PRESET_ALIASES, PRESETS
from pefusion.record import PEFUSION_EXPERIMENT
from pefusion.sweep.options import SweepOptions

GRID = """The PE × fusion × seed grid of the PE-fusion study (Hallam & Tseng), on Ray Tune, tracked in MLflow.
Installed as `pefusion-grid`, the same command as `python sweeps/arxiv_grid.py`.

    python sweeps/arxiv_grid.py --preset demo          # the bundled synthetic corpus: a few minutes on 2 cores
    python sweeps/arxiv_grid.py                         # the paper's ArXiv-11 grid (Hugging Face hub)
    python sweeps/arxiv_grid.py --data-dir data/arxiv   # a folder: `pefusion-data fetch arxiv --out data/arxiv`

No ASHA here: paired-seed comparisons need complete runs; each trial stops early on validation accuracy exactly
as the paper did (patience 4, min_delta 1e-4) and is tested at its best checkpoint.
"""

SEARCH = """Learning-rate × batch-size search for one PE-fusion model, with ASHA early stopping over epochs.
Installed as `pefusion-search`, the same command as `python sweeps/lr_batch_asha.py`.

    python sweeps/lr_batch_asha.py --preset demo                    # random search, 16 samples, ASHA
    python sweeps/lr_batch_asha.py --preset demo --search optuna    # Optuna TPE with a fixed sampler seed
    python sweeps/lr_batch_asha.py --preset demo --scheduler fifo   # same samples, full budget (the reference)

The optimised metric is `pefusion.record.OPTIMISED_METRIC` (validation accuracy, maximised), set once in
TuneConfig and used by both ASHA and Optuna. ASHA is the only early stopping here (the paper's in-trial patience
is switched off) so that the epoch accounting is exact.
"""

REPORT = """One self-contained HTML page for a sweep: the tables and figures of its trials (inline), the command line
and git commit that produced them, and its failed trials. Also writes the CSVs and figures, and logs them with
the page to the sweep's MLflow parent run under results/. Installed as `pefusion-report`.

    python scripts/report.py                                  # latest sweep of pe-fusion in sqlite:///mlflow.db
    python scripts/report.py --experiment student-attention   # latest student sweep
    python scripts/report.py --parent-run 1a2b3c4d
"""

EXPORT = """A finished PE-fusion trial run's best model as an MLflow model that classifies raw text (a pyfunc model with
the run's checkpoint and its sweep's tokeniser), logged to the run's experiment with the run as its source; a
second export of the run finds that model. Prints the line that loads it. Installed as `pefusion-export`.

    python scripts/export_model.py --run 1a2b3c4d...                 # the report names each cell's best run
    python scripts/export_model.py --run 1a2b3c4d... --register demo  # also a version of registered model demo
    mlflow models serve -m models:/demo/1 --env-manager local -p 5001  # POST {"inputs": [{"text": "..."}]}
"""


def _parse_sweep(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                 sweep: str) -> tuple[argparse.Namespace, SweepOptions]:
    """The flags, and the options every sweep shares, checked without a study (a bad --gpus-per-trial or
    --cpus-per-trial ends here in one line, before torch or Ray load)."""
    args = parser.parse_args(argv)
    if getattr(args, "preset", None) in PRESET_ALIASES:  # a former name runs, and is recorded, as the preset it names
        args.preset = PRESET_ALIASES[args.preset]
    return args, sweep_options(args, sweep, argv)


def grid_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=GRID, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_flag(parser, default="arxiv", presets=PRESETS)
    add_grid_flags(parser)
    parser.add_argument("--stack-seeds", action=argparse.BooleanOptionalAction, default=None,
                        help="train the seeds of each (pe_type, fusion) cell together in one trial, as one batched "
                             "model, each seed still its own run in every record (default, and --no-stack-seeds: one "
                             "trial per seed, on every device)")
    parser.add_argument("--epochs", type=int, help="maximum epochs per trial (default: the preset's)")
    add_data_flags(parser)
    add_sweep_flags(parser, experiment=PEFUSION_EXPERIMENT, search_space="arxiv_grid.yaml")
    args, opts = _parse_sweep(parser, argv, "arxiv_grid")
    from pefusion.cli.fusion import run_arxiv_grid

    return run_arxiv_grid(args, opts)


def search_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=SEARCH, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_flag(parser, default="arxiv", presets=PRESETS)
    add_search_flags(parser, searches=("random", "optuna", "grid", "cmaes"),
                     schedulers=("asha", "fifo", "hyperband", "pbt"), default_search="random", default_samples=16)
    add_data_flags(parser)
    add_sweep_flags(parser, experiment=PEFUSION_EXPERIMENT, search_space="lr_batch.yaml")
    args, opts = _parse_sweep(parser, argv, "lr_batch_asha")
    from pefusion.cli.fusion import run_lr_batch_asha

    return run_lr_batch_asha(args, opts)


def _student_main(sweep: str, description: str, argv: Sequence[str] | None) -> int:
    from pefusion.cli.student import add_student_flags, run_student_sweep

    parser = argparse.ArgumentParser(description=description)
    add_student_flags(parser, sweep)
    return run_student_sweep(sweep, *_parse_sweep(parser, argv, sweep))


def lambda_cv_main(argv: Sequence[str] | None = None) -> int:
    return _student_main("lambda_cv", "K-fold cross-validation of the weight decay lambda at each (alpha, omega, "
                                      "sigma, init, seed) point, refit at lambda*, test on fresh samples "
                                      "(docs/student.md). Installed as pefusion-lambda-cv, the same command as "
                                      "`python sweeps/lambda_cv.py`.", argv)


def phase_diagram_main(argv: Sequence[str] | None = None) -> int:
    return _student_main("phase_diagram", "Fixed lambda, a grid over alpha x omega; both initialisations at every "
                                          "point, which one is the global minimum, and the linear baseline (the "
                                          "paper's Fig. 3). Installed as pefusion-phase, the same command as "
                                          "`python sweeps/phase_diagram.py`.", argv)


def report_main(argv: Sequence[str] | None = None) -> int:
    from pefusion.cli.analysis import add_source_flags, load_sweep_from_args

    parser = argparse.ArgumentParser(description=REPORT, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_flags(parser, PEFUSION_EXPERIMENT, parent_default="the most recent sweep parent run")
    parser.add_argument("--all-runs", action="store_true",
                        help="report every finished trial run of the experiment instead of the latest sweep")
    parser.add_argument("--baseline", default="add", help="baseline fusion of the paired deltas (default: add)")
    parser.add_argument("--no-log", action="store_true", help="do not log the report to the MLflow parent run")
    args = parser.parse_args(argv)
    from pefusion.analysis.report.page import build_report
    from pefusion.analysis.student_tables import published_alpha_curves

    sweep = load_sweep_from_args(args, latest_sweep=not args.all_runs)
    alpha_c, alpha_l = published_alpha_curves()
    page, written = build_report(sweep, args.out, args.baseline, alpha_c, alpha_l, log_to_mlflow=not args.no_log,
                                 say=lambda line: print(line, flush=True))
    for path in written:
        print(f"wrote {path}")
    print(f"report: {page}")
    if sweep.parent_run_id and not args.no_log:
        print(f"logged to MLflow run {sweep.parent_run_id} under results/")
    return 0


TABLE1 = """The summary table from the MLflow runs (what the report calls Table 1): test accuracy (%, mean ± sample
std over seeds), parameters and latency per (PE, fusion), one table per dataset, written as summary_<dataset>.csv,
.md and .tex (named for the summary table, whichever paper table it reproduces); the paper's numbers
stand beside ours for its three datasets: Table 3 for ArXiv-11 (`--preset arxiv`), Table 1 for AG News and IMDB
(`--preset agnews`, `--preset imdb`). Installed as `pefusion-table1`.

    python scripts/make_table1.py                      # every finished trial run of experiment pe-fusion
    python scripts/make_table1.py --parent-run 1a2b3c4d --out results/
"""

DELTAS = """Paired-seed deltas from the MLflow runs: for each PE and each fusion, Δ test accuracy (percentage points)
against a baseline fusion on the seeds both have, with mean, sample std, 95% t interval, paired t-test and
Wilcoxon signed-rank p-values; writes paired_deltas_<dataset>.csv, the per-seed pairs, and one figure per PE
(the paper's Fig. 3) into <out>/figures. Installed as `pefusion-deltas`.

    python scripts/paired_deltas.py --baseline add
"""

FIGURES = """Every figure the MLflow runs allow, as PNG (dpi 150) and PDF in <out>/figures: for PE-fusion runs the
paired-seed deltas per PE, accuracy and latency per fusion and accuracy per length bucket; for student runs
Δε_t and Δε_g against α with the published α_c and α_l, m and θ against α, λ* against α and the (α, ω)
phase diagram with the published α_c(ω) curve. Installed as `pefusion-figures`.

    python scripts/make_figures.py
    python scripts/make_figures.py --experiment student-attention
"""


def _analysis_sweep(description: str, argv: Sequence[str] | None, baseline_help: str | None = None):
    """The parsed flags of an analysis command (where the runs are, the outputs go; `--baseline` where it has
    one) and the sweep they name."""
    from pefusion.cli.analysis import add_source_flags, load_sweep_from_args

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_flags(parser, PEFUSION_EXPERIMENT)
    if baseline_help:
        parser.add_argument("--baseline", default="add", help=baseline_help)
    args = parser.parse_args(argv)
    return args, load_sweep_from_args(args)


def table1_main(argv: Sequence[str] | None = None) -> int:
    args, sweep = _analysis_sweep(TABLE1, argv)
    from pefusion.analysis.outputs import write_table1

    for path in write_table1(sweep.trials, args.out):
        if path.suffix == ".md":
            print(path.read_text())
        print(f"wrote {path}")
    return 0


def deltas_main(argv: Sequence[str] | None = None) -> int:
    args, sweep = _analysis_sweep(DELTAS, argv, "fusion every other fusion is compared with (default: add)")
    from pefusion.analysis.outputs import write_paired_deltas

    for path in write_paired_deltas(sweep.trials, args.out, args.baseline):
        if path.suffix == ".csv" and not path.stem.startswith("paired_deltas_per_seed"):
            print(path.read_text())
        print(f"wrote {path}")
    return 0


def figures_main(argv: Sequence[str] | None = None) -> int:
    args, sweep = _analysis_sweep(FIGURES, argv, "baseline fusion of the paired deltas (default: add)")
    from pefusion.analysis.outputs import write_figures
    from pefusion.analysis.student_tables import published_alpha_curves

    alpha_c, alpha_l = published_alpha_curves()
    for path in write_figures(sweep.trials, args.out, args.baseline, alpha_c, alpha_l):
        print(f"wrote {path} (+ .pdf)")
    return 0


# The commands whose parser lives beside their output; each imports torch, so only when it runs.
def gpu_check_main(argv: Sequence[str] | None = None) -> int:
    from pefusion.cli.gpu_check import main

    return main(argv)


def student_fit_main(argv: Sequence[str] | None = None) -> int:
    from pefusion.cli.fit import main

    return main(argv)


def reproduce_student_main(argv: Sequence[str] | None = None) -> int:
    from pefusion.cli.reproduction import main

    return main(argv)


def student_theory_main(argv: Sequence[str] | None = None) -> int:
    from pefusion.cli.theory import main

    return main(argv)


def data_main(argv: Sequence[str] | None = None) -> int:
    from pefusion.cli.data import main

    return main(argv)


def export_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=EXPORT, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="the trial run's id")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                               "sqlite:///mlflow.db)")
    parser.add_argument("--register", metavar="NAME", help="also register the model as a new version of NAME in "
                                                           "MLflow's Model Registry")
    args = parser.parse_args(argv)
    from pefusion.fusion.export import export_run

    done = export_run(args.run, args.tracking_uri, args.register)
    print(f"{'model' if done.created else 'model (made before)'}: {done.model_uri}  (source run {done.run_id})")
    if done.registered_uri:
        print(f"registered: {done.registered_uri}")
    print(f"load: {done.load_line}")
    return 0


# The installed commands (pyproject's [project.scripts]): a ConfigError ends in one line and exit code 2.
def grid() -> None:
    run_main(grid_main)


def search() -> None:
    run_main(search_main)


def lambda_cv() -> None:
    run_main(lambda_cv_main)


def phase_diagram() -> None:
    run_main(phase_diagram_main)


def report() -> None:
    run_main(report_main)


def export() -> None:
    run_main(export_main)


def table1() -> None:
    run_main(table1_main)


def deltas() -> None:
    run_main(deltas_main)


def figures() -> None:
    run_main(figures_main)


def gpu_check() -> None:
    run_main(gpu_check_main)


def student_fit() -> None:
    run_main(student_fit_main)


def reproduce_student() -> None:
    run_main(reproduce_student_main)


def student_theory() -> None:
    run_main(student_theory_main)


def data() -> None:
    run_main(data_main)


# Each installed command's function (pyproject's [project.scripts] target) -> the main it runs, which its script runs
# too (tests/test_cli_docs.py holds docs/cli.md's table to this).
MAINS = {"grid": grid_main, "search": search_main, "lambda_cv": lambda_cv_main, "phase_diagram": phase_diagram_main,
         "report": report_main, "export": export_main, "table1": table1_main, "deltas": deltas_main,
         "figures": figures_main, "gpu_check": gpu_check_main, "student_fit": student_fit_main,
         "reproduce_student": reproduce_student_main, "student_theory": student_theory_main,
         "data": data_main}
