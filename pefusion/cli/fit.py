"""`scripts/student_fit.py`'s command line (installed as `pefusion-student-fit`): one point of the student
attention model fitted and its metrics printed, without Ray or MLflow."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pefusion.cli.flags import print_result
from pefusion.errors import ConfigError
from pefusion.student.config import DTYPES, INITS, OPTIMS, TEACHER_A, StudentConfig


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(description="Fit one point of the Cui et al. student-attention model and print its metrics "
                             "(docs/student.md): eps_g, eps_t, m, theta, eps_lin, seconds and the point's "
                             "configuration.")
    ap.add_argument("--d", type=int, default=1000, help="token dimension")
    ap.add_argument("--alpha", type=float, default=2.0, help="sample complexity n/d")
    ap.add_argument("--omega", type=float, default=0.3, help="positional weight of the teacher, in [0, 1]")
    ap.add_argument("--sigma", type=float, default=0.5, help="token standard deviation")
    ap.add_argument("--lam", type=float, default=0.01, help="weight decay λ")
    ap.add_argument("--init", default="semantic", help=f"initialisation: {', '.join(INITS)}")
    ap.add_argument("--seed", type=int, default=0, help="data seed (teacher, samples, random init)")
    ap.add_argument("--optim", default="gd", help=f"optimiser: {', '.join(OPTIMS)} (gd: lr 0.15, 5000 iters; "
                                                  "adam: lr 0.01, 2500 iters)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the optimiser's)")
    ap.add_argument("--iters", type=int, default=None, help="full-batch iterations (default: the optimiser's)")
    ap.add_argument("--n-test", type=int, default=50_000, help="fresh test samples for eps_g")
    ap.add_argument("--teacher-A", default="default", help=f"teacher positional matrix: {', '.join(TEACHER_A)}")
    ap.add_argument("--r", type=int, default=1, help="rank of Q (teacher and student)")
    ap.add_argument("--dtype", default="float32", help=f"training precision: {', '.join(DTYPES)}")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    args = ap.parse_args(argv)
    try:
        cfg = StudentConfig(d=args.d, sigma=args.sigma, omega=args.omega, teacher_A=args.teacher_A, r=args.r,
                            alpha=args.alpha, lam=args.lam, init=args.init, seed=args.seed, optim=args.optim,
                            lr=args.lr, iters=args.iters, n_test=args.n_test, dtype=args.dtype)
    except ConfigError as exc:
        ap.error(str(exc))
    import torch  # here: --help and a bad flag answer before torch loads

    from pefusion.student.point import fit_point

    if args.threads:
        torch.set_num_threads(args.threads)
    print_result(fit_point(cfg), args.json)
    return 0
