"""Table 1 from the MLflow runs: test accuracy (%, mean ± sample std over seeds), parameters and latency per
(PE, fusion), one table per dataset, written as table1_<dataset>.csv, .md and .tex; for the runs of a preset with
published numbers (arxiv: Table 3; agnews, imdb: Table 1) the paper's values stand beside ours with a verdict.

    python scripts/make_table1.py                      # every finished trial run of experiment pe-fusion
    python scripts/make_table1.py --parent-run 1a2b3c4d --out results/
"""
from __future__ import annotations

import argparse
from typing import Sequence

from pefusion.cli.flags import run_main
from pefusion.analysis.report import write_table1
from pefusion.cli.analysis import add_source_flags, load_sweep_from_args
from pefusion.record import PEFUSION_EXPERIMENT


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_flags(parser, PEFUSION_EXPERIMENT)
    args = parser.parse_args(argv)
    sweep = load_sweep_from_args(args)
    for path in write_table1(sweep.trials, args.out):
        if path.suffix == ".md":
            print(path.read_text())
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_main(main)
