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

from pefusion.cli.flags import add_data_flags, add_preset_flag, add_search_flags, add_sweep_flags, run_main
from pefusion.cli.fusion import run_lr_batch_asha
from pefusion.fusion.config import PRESETS
from pefusion.record import PEFUSION_EXPERIMENT


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_flag(parser, default="arxiv", presets=PRESETS)
    add_search_flags(parser, searches=("random", "optuna", "grid", "cmaes"),
                     schedulers=("asha", "fifo", "hyperband", "pbt"), default_search="random", default_samples=16)
    add_data_flags(parser)
    add_sweep_flags(parser, experiment=PEFUSION_EXPERIMENT, search_space="lr_batch.yaml")
    return run_lr_batch_asha(parser.parse_args(argv), argv)


if __name__ == "__main__":
    run_main(main)
