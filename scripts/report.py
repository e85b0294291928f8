"""One self-contained HTML page for a sweep: the tables and figures of its trials (inline), the command line
and git commit that produced them, and its failed trials. Also writes the CSVs and figures, and logs them with
the page to the sweep's MLflow parent run under results/.

    python scripts/report.py                                  # latest sweep of pe-fusion in sqlite:///mlflow.db
    python scripts/report.py --experiment student-attention   # latest student sweep
    python scripts/report.py --parent-run 1a2b3c4d
"""
from __future__ import annotations

import argparse
from typing import Sequence

from pefusion.analysis.student_tables import published_alpha_curves
from pefusion.cli.flags import run_main
from pefusion.analysis.report import build_report
from pefusion.cli.analysis import add_source_flags, load_sweep_from_args
from pefusion.record import PEFUSION_EXPERIMENT


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_flags(parser, PEFUSION_EXPERIMENT, parent_default="the most recent sweep parent run")
    parser.add_argument("--all-runs", action="store_true",
                        help="report every finished trial run of the experiment instead of the latest sweep")
    parser.add_argument("--baseline", default="add", help="baseline fusion of the paired deltas (default: add)")
    parser.add_argument("--no-log", action="store_true", help="do not log the report to the MLflow parent run")
    args = parser.parse_args(argv)
    sweep = load_sweep_from_args(args, latest_sweep=not args.all_runs)
    alpha_c, alpha_l = published_alpha_curves()
    page, written = build_report(sweep, args.out, args.baseline, alpha_c, alpha_l, log_to_mlflow=not args.no_log)
    for path in written:
        print(f"wrote {path}")
    print(f"report: {page}")
    if sweep.parent_run_id and not args.no_log:
        print(f"logged to MLflow run {sweep.parent_run_id} under results/")
    return 0


if __name__ == "__main__":
    run_main(main)
