"""Learning-rate × batch-size search for one PE-fusion model, with ASHA early stopping over epochs.

    python sweeps/lr_batch_asha.py --preset demo                    # random search, 16 samples, ASHA
    python sweeps/lr_batch_asha.py --preset demo --search optuna    # Optuna TPE with a fixed sampler seed
    python sweeps/lr_batch_asha.py --preset demo --scheduler fifo   # same samples, full budget (the reference)

The optimised metric is `pefusion.record.OPTIMISED_METRIC` (validation accuracy, maximised), set once in
TuneConfig and used by both ASHA and Optuna. ASHA is the only early stopping here (the paper's in-trial patience
is switched off) so that the epoch accounting is exact.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from pefusion.cli.flags import add_data_flags, add_preset_flag, add_sweep_flags, run_main
from pefusion.cli.fusion import run_lr_batch_asha
from pefusion.fusion.config import PRESETS
from pefusion.record import PEFUSION_EXPERIMENT


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_flag(parser, default="arxiv", presets=PRESETS)
    parser.add_argument("--search", choices=("random", "optuna"), default="random",
                        help="search algorithm (default: random)")
    parser.add_argument("--scheduler", choices=("asha", "fifo"), default="asha",
                        help="asha: early stopping over epochs; fifo: every sample runs --max-t epochs")
    parser.add_argument("--num-samples", type=int, default=16, help="configurations to try (default: 16)")
    parser.add_argument("--max-t", type=int, default=None, help="maximum epochs per trial (default: the preset's)")
    parser.add_argument("--grace-period", type=int, default=1, help="ASHA: epochs before a trial can be stopped")
    parser.add_argument("--reduction-factor", type=float, default=3.0, help="ASHA: keep 1/η of trials per rung")
    parser.add_argument("--sampler-seed", type=int, default=0, help="Optuna TPE sampler seed (default: 0)")
    add_data_flags(parser)
    add_sweep_flags(parser, experiment=PEFUSION_EXPERIMENT, search_space="lr_batch.yaml")
    return run_lr_batch_asha(parser.parse_args(argv), argv)


if __name__ == "__main__":
    run_main(main)
