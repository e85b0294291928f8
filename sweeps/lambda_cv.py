"""λ cross-validation of the student attention model (Cui et al.), one Ray Tune trial per point.

    python sweeps/lambda_cv.py --preset demo     # a couple of minutes on a laptop CPU
    python sweeps/lambda_cv.py                   # the paper's setting (d = 1000)

Every flag: `python sweeps/lambda_cv.py --help`. Logic: `pefusion.cli.student`.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from pefusion.cli.flags import run_main
from pefusion.cli.student import add_student_flags, run_student_sweep


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sweeps/lambda_cv.py",
        description="K-fold cross-validation of the weight decay lambda at each (alpha, omega, sigma, init, seed) "
                    "point, refit at lambda*, test on fresh samples (SPEC section 5).")
    add_student_flags(parser, "lambda_cv")
    return run_student_sweep("lambda_cv", parser.parse_args(argv), argv)


if __name__ == "__main__":
    run_main(main)
