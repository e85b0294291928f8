"""Phase diagram of the student attention model (Cui et al.): fixed λ, α × ω, both initialisations per point.

    python sweeps/phase_diagram.py --preset demo     # a couple of minutes on a laptop CPU
    python sweeps/phase_diagram.py                   # the paper's setting (d = 1000)

Every flag: `python sweeps/phase_diagram.py --help`. Logic: `pefusion.cli.student`.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from pefusion.cli.flags import run_main
from pefusion.cli.student import add_student_flags, run_student_sweep


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sweeps/phase_diagram.py",
        description="Fixed lambda, a grid over alpha x omega; both initialisations at every point, which one is "
                    "the global minimum, and the linear baseline (the paper's Fig. 3).")
    add_student_flags(parser, "phase_diagram")
    return run_student_sweep("phase_diagram", parser.parse_args(argv), argv)


if __name__ == "__main__":
    run_main(main)
