"""Paired-seed deltas from the MLflow runs: for each PE and each fusion, Δ test accuracy (percentage points)
against a baseline fusion on the seeds both have, with mean, sample std, 95% t interval, paired t-test and
Wilcoxon signed-rank p-values; writes paired_deltas_<dataset>.csv, the per-seed pairs, and one figure per PE
(the paper's Fig. 3) into <out>/figures.

    python scripts/paired_deltas.py --baseline add
"""
from __future__ import annotations

import argparse
from typing import Sequence

from pefusion.cli.flags import run_main
from pefusion.analysis.report import write_paired_deltas
from pefusion.cli.analysis import add_source_flags, load_sweep_from_args
from pefusion.record import PEFUSION_EXPERIMENT


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_flags(parser, PEFUSION_EXPERIMENT)
    parser.add_argument("--baseline", default="add", help="fusion every other fusion is compared with (default: add)")
    args = parser.parse_args(argv)
    sweep = load_sweep_from_args(args)
    for path in write_paired_deltas(sweep.trials, args.out, args.baseline):
        if path.suffix == ".csv" and not path.stem.startswith("paired_deltas_per_seed"):
            print(path.read_text())
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_main(main)
