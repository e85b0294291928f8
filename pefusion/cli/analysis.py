"""The analysis scripts' command-line half (`scripts/report.py`, `make_table1.py`, `paired_deltas.py`,
`make_figures.py`): the flags that say where the runs are and where the outputs go, and the sweep they name,
loaded with the notes a reader must know printed to stderr."""
from __future__ import annotations

import argparse
import sys


def add_source_flags(parser: argparse.ArgumentParser, experiment: str,
                     parent_default: str = "every finished trial run of the experiment") -> None:
    """The flags every analysis script shares: where the runs are and where the outputs go."""
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                               "sqlite:///mlflow.db)")
    parser.add_argument("--experiment", default=experiment, help=f"MLflow experiment (default: {experiment}; "
                                                                 f"the student study's is student-attention)")
    parser.add_argument("--parent-run", help="analyse the trials of this sweep parent run (id or unique prefix); "
                                             f"default: {parent_default}")
    parser.add_argument("--out", default="results", help="output folder (default: results/)")


def load_sweep_from_args(args: argparse.Namespace, latest_sweep: bool = False):
    """The runs the source flags name, with the notes a reader must know printed to stderr."""
    from pefusion.analysis.report.page import notes  # here: MLflow and pandas load after the flags are parsed
    from pefusion.analysis.runs import load_sweep

    sweep = load_sweep(args.tracking_uri, args.experiment, args.parent_run, latest_sweep=latest_sweep)
    for note in notes(sweep):
        print(f"note: {note}", file=sys.stderr)
    return sweep
