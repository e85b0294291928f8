"""Check the student-attention reproduction against the published numbers (docs/student.md).

    python scripts/reproduce_student.py            # d = 1000, seeds 0 1 2, 50 000 test samples, 10 % tolerance

At σ = 0.5, ω = 0.3, λ = 0.01, α = 2 and the default optimiser (full-batch GD, lr 0.15, 5 000 steps), the
seed-mean ε_g of the semantic and positional initialisations, the linear baseline's ε_g, θ (semantic) and
m (positional) must be within the tolerance of the published values, and the initialisation with the lower
training loss must be the positional one at α = 1.0 and the semantic one at α = 1.6. Prints one line per
check (or JSON lines with --json), with the d → ∞ theory's value beside it (computed once, cached in
--theory-cache), and exits 0 if all pass, 1 otherwise.
"""
from __future__ import annotations

import argparse
import sys

import pefusion  # noqa: F401  (first: it sets PyTorch's huge-page switch, read when torch loads)
import torch

from pefusion.cli.reproduction import default_theory_cache, print_reproduction
from pefusion.errors import ConfigError
from pefusion.student.cv import reproduction_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", type=int, default=1000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n-test", type=int, default=50_000)
    ap.add_argument("--tolerance", type=float, default=0.10, help="relative tolerance of the numeric checks")
    ap.add_argument("--iters", type=int, default=None, help="GD iterations (default: the authors' 5000)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="JSON lines: every point, then every check")
    ap.add_argument("--theory-cache", default=str(default_theory_cache()),
                    help="folder caching the d -> infinity theory's values (default: $PEFUSION_CACHE/theory or "
                         "~/.cache/pefusion/theory)")
    ap.add_argument("--no-theory", action="store_true", help="no theory column")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        report = reproduction_report(d=args.d, seeds=tuple(args.seeds), n_test=args.n_test,
                                     tolerance=args.tolerance, iters=args.iters,
                                     theory_cache=None if args.no_theory else args.theory_cache)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return print_reproduction(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
