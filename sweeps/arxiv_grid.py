"""The PE × fusion × seed grid of the PE-fusion study (Hallam & Tseng), on Ray Tune, tracked in MLflow.

    python sweeps/arxiv_grid.py --preset demo          # the bundled synthetic corpus, minutes on a laptop CPU
    python sweeps/arxiv_grid.py                         # the paper's ArXiv-11 grid (Hugging Face hub)
    python sweeps/arxiv_grid.py --data-dir data/        # the paper's data/{train,validation,test}_clean.jsonl

No ASHA here: paired-seed comparisons need complete runs; each trial stops early on validation accuracy exactly
as the paper did (patience 4, min_delta 1e-4) and is tested at its best checkpoint.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from pefusion.cli.fusion import run_arxiv_grid
from pefusion.cli.flags import add_data_flags, add_preset_flag, add_sweep_flags, csv_list, run_main
from pefusion.fusion.config import PRESETS
from pefusion.record import PEFUSION_EXPERIMENT


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_flag(parser, default="arxiv", presets=PRESETS)
    parser.add_argument("--pe-types", type=csv_list(), help="narrow the pe_type grid, e.g. sinusoidal,rope")
    parser.add_argument("--fusions", type=csv_list(), help="narrow the fusion grid, e.g. add,gate_scalar")
    parser.add_argument("--seeds", type=csv_list(int), help="narrow the seed grid, e.g. 0,1,2")
    parser.add_argument("--epochs", type=int, help="maximum epochs per trial (default: the preset's)")
    add_data_flags(parser)
    add_sweep_flags(parser, experiment=PEFUSION_EXPERIMENT, search_space="arxiv_grid.yaml")
    return run_arxiv_grid(parser.parse_args(argv), argv)


if __name__ == "__main__":
    run_main(main)
