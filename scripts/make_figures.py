"""Every figure the MLflow runs allow, as PNG (dpi 150) and PDF in <out>/figures: for PE-fusion runs the
paired-seed deltas per PE, accuracy and latency per fusion and accuracy per length bucket; for student runs
Δε_t and Δε_g against α with the published α_c and α_l, m and θ against α, λ* against α and the (α, ω)
phase diagram with the published α_c(ω) curve.

    python scripts/make_figures.py
    python scripts/make_figures.py --experiment student-attention
"""
from __future__ import annotations

import argparse
from typing import Sequence

from pefusion.analysis.student_tables import published_alpha_curves
from pefusion.cli.flags import run_main
from pefusion.analysis.report import write_figures
from pefusion.cli.analysis import add_source_flags, load_sweep_from_args
from pefusion.record import PEFUSION_EXPERIMENT


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_flags(parser, PEFUSION_EXPERIMENT)
    parser.add_argument("--baseline", default="add", help="baseline fusion of the paired deltas (default: add)")
    args = parser.parse_args(argv)
    sweep = load_sweep_from_args(args)
    alpha_c, alpha_l = published_alpha_curves()
    for path in write_figures(sweep.trials, args.out, args.baseline, alpha_c, alpha_l):
        print(f"wrote {path} (+ .pdf)")
    return 0


if __name__ == "__main__":
    run_main(main)
