"""`scripts/reproduce_student.py`'s command line (installed as `pefusion-reproduce-student`): the student
reproduction checks as a table or JSON lines, with the d → ∞ theory's value beside each check; and where the
theory's cache lives by default.

Kept apart from `pefusion.cli.student` (the sweeps' command line, which imports Ray): the reproduction runs on
torch alone.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Sequence

from pefusion.data.cache import cache_root
from pefusion.data.config import DataConfig


def default_theory_cache() -> Path:
    """<$PEFUSION_CACHE or ~/.cache/pefusion>/theory: beside the token-id cache, under the same root."""
    return cache_root(DataConfig()) / "theory"


def _cell(value) -> str:
    if isinstance(value, str):
        return value
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.5g}"


def print_reproduction(report: dict, as_json: bool) -> int:
    """`scripts/reproduce_student.py`'s output: a line per check (JSON lines: every point, then every check);
    the exit code, 0 when every check passes."""
    if as_json:
        for row in report["points"] + report["checks"]:
            print(json.dumps(row))
    else:
        theory = any("theory" in c for c in report["checks"])
        print(f"{'check':<22}{'alpha':>6}{'measured':>14}{'published':>14}"
              + (f"{'theory d->inf':>15}" if theory else "") + "  result")
        for c in report["checks"]:
            print(f"{c['quantity']:<22}{c['alpha']:>6}{_cell(c['measured']):>14}{c['published']!s:>14}"
                  + (f"{_cell(c.get('theory')):>15}" if theory else "") + f"  {'PASS' if c['pass'] else 'FAIL'}"
                  + (f"  ({c['rel_diff']:+.1%})" if "rel_diff" in c else f"  (per seed: {c['per_seed']})"))
    return 0 if all(c["pass"] for c in report["checks"]) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks and print them; the exit code, 0 when every check passes (a ConfigError for bad input)."""
    ap = argparse.ArgumentParser(description="Check the student-attention reproduction against the published "
                                             "numbers (docs/student.md).")
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
    import torch  # here: --help answers before torch loads

    from pefusion.student.cv import reproduction_report

    torch.set_num_threads(args.threads)
    report = reproduction_report(d=args.d, seeds=tuple(args.seeds), n_test=args.n_test,
                                 tolerance=args.tolerance, iters=args.iters,
                                 theory_cache=None if args.no_theory else args.theory_cache)
    return print_reproduction(report, args.json)
