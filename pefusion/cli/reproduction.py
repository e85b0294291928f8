"""`scripts/reproduce_student.py`'s output: the student reproduction checks as a table or JSON lines.

Kept apart from `pefusion.cli.student` (the sweeps' command line, which imports Ray): the reproduction runs on
torch alone.
"""
from __future__ import annotations

import json


def print_reproduction(report: dict, as_json: bool) -> int:
    """`scripts/reproduce_student.py`'s output: a line per check (JSON lines: every point, then every check);
    the exit code, 0 when every check passes."""
    if as_json:
        for row in report["points"] + report["checks"]:
            print(json.dumps(row))
    else:
        print(f"{'check':<22}{'alpha':>6}{'measured':>14}{'published':>14}  result")
        for c in report["checks"]:
            measured = c["measured"] if isinstance(c["measured"], str) else f"{c['measured']:.5g}"
            print(f"{c['quantity']:<22}{c['alpha']:>6}{measured:>14}{c['published']!s:>14}  "
                  f"{'PASS' if c['pass'] else 'FAIL'}"
                  + (f"  ({c['rel_diff']:+.1%})" if "rel_diff" in c else f"  (per seed: {c['per_seed']})"))
    return 0 if all(c["pass"] for c in report["checks"]) else 1
