"""`scripts/student_theory.py`'s command line: the d → ∞ curves and α_c(ω) of pefusion.student.theory.

Kept apart from `pefusion.cli.student` (the sweeps' command line, which imports Ray): the theory runs on torch
alone.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch

from pefusion.errors import ConfigError
from pefusion.student import theory as TH
from pefusion.student.config import TEACHER_A


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # a ConfigError, so run_main prints one line and exits 2
        raise ConfigError(message)


class _RenamedA(argparse.Action):
    """The old spelling `--A standard|alt`, refused with the new one (the flag of student_fit.py and the
    search-space key teacher_A)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        raise ConfigError(f"--A is now --teacher-A {{{','.join(TEACHER_A)}}} (standard is now default)")


def value_range(flag: str, text: str) -> list[float]:
    """`start:stop:step` (stop included) or a comma-separated list: `0.2:3.0:0.1`, `0,0.3`."""
    try:
        if ":" not in text:
            return [float(x) for x in text.split(",") if x.strip()]
        start, stop, step = (float(x) for x in text.split(":"))
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: give start:stop:step (e.g. 0.2:3.0:0.1) or a comma-separated list") \
            from None
    if not (step > 0 and stop >= start and all(map(math.isfinite, (start, stop, step)))):
        raise ConfigError(f"{flag} {text!r}: start:stop:step needs a step > 0 and stop >= start")
    count = int(math.floor((stop - start) / step + 1e-9)) + 1
    return [round(start + i * step, 10) for i in range(count)]


def parser() -> argparse.ArgumentParser:
    defaults = TH.Solver()
    ap = _Parser(description="The d -> infinity prediction of the student attention model (docs/theory.md): the "
                             "fixed point on the semantic and positional branches, and alpha_c(omega).")
    ap.add_argument("--omega", type=float, default=0.3, help="positional weight of the teacher (default 0.3)")
    ap.add_argument("--omegas", help="several omegas for the phase boundary with --alpha-c, e.g. 0:0.4:0.05")
    ap.add_argument("--sigma", type=float, default=0.5, help="token standard deviation (default 0.5)")
    ap.add_argument("--lam", type=float, default=0.01, help="weight decay lambda (default 0.01)")
    ap.add_argument("--teacher-A", default="default", choices=tuple(TEACHER_A),
                    help="the teacher's positional matrix: default [[0.6,0.4],[0.4,0.6]] or alt "
                         "[[0.3,0.7],[0.8,0.2]] (the search-space key teacher_A)")
    ap.add_argument("--A", action=_RenamedA, help=argparse.SUPPRESS)
    ap.add_argument("--alphas", default="0.2:3.0:0.1", help="alphas of the curve (default 0.2:3.0:0.1)")
    ap.add_argument("--out", help="write the curve as CSV here (columns " + ",".join(TH.COLUMNS) + ")")
    ap.add_argument("--alpha-c", action="store_true", help="print alpha_c(omega), where the two branches' training "
                                                           "losses cross, as the last line")
    ap.add_argument("--nodes", type=int, default=defaults.nodes,
                    help=f"Gauss-Hermite nodes per axis of the (eta, y1, y2) rule (default {defaults.nodes})")
    ap.add_argument("--zeta-nodes", type=int, default=defaults.zeta_nodes,
                    help=f"Gauss nodes along zeta = (xi1 - xi2)/sqrt2 on each side of the proximal point's switch "
                         f"(default {defaults.zeta_nodes})")
    ap.add_argument("--damping", type=float, default=defaults.damping,
                    help=f"the anchor's approach iteration x <- damping*x + (1-damping)*F(x) "
                         f"(default {defaults.damping})")
    ap.add_argument("--tol", type=float, default=defaults.tol,
                    help=f"a fixed point has |F(x) - x| below this in q, m and theta (default {defaults.tol})")
    ap.add_argument("--max-iter", type=int, default=defaults.max_iter,
                    help=f"evaluations of the map per Newton attempt; a continuation step that needs more is "
                         f"halved (default {defaults.max_iter})")
    ap.add_argument("--figure", help="draw eps_g against alpha on both branches into this PNG")
    ap.add_argument("--simulated", help="with --figure: simulated points to put on the curve, a CSV or JSON lines "
                                        "with alpha, init, eps_g (what scripts/student_fit.py --json prints)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Write the curve (--out, else print it as CSV unless --alpha-c) and print alpha_c per omega (--alpha-c)."""
    args = parser().parse_args(argv)
    solver = TH.Solver(nodes=args.nodes, zeta_nodes=args.zeta_nodes, damping=args.damping, tol=args.tol,
                       max_iter=args.max_iter)
    if args.threads < 1:
        raise ConfigError(f"--threads {args.threads}: give at least 1")
    torch.set_num_threads(args.threads)
    if args.omegas and not args.alpha_c:
        raise ConfigError("--omegas gives the phase boundary: add --alpha-c (one curve takes --omega)")
    omegas = value_range("--omegas", args.omegas) if args.omegas else [args.omega]
    TH.make_params([1.0] * len(omegas), [args.sigma] * len(omegas), [args.lam] * len(omegas), omegas,
                   [args.teacher_A] * len(omegas))  # every value checked before any work
    if args.simulated and not args.figure:
        raise ConfigError("--simulated puts points on the figure: add --figure PNG")
    continuation = TH.Continuation(solver)  # the curve's points, reused by alpha_c at the same omega
    if args.out or args.figure or not args.alpha_c:
        alphas = value_range("--alphas", args.alphas)
        start = time.perf_counter()
        curve = TH.theory_curve(alphas, args.sigma, args.lam, args.omega, args.teacher_A, solver=solver,
                                continuation=continuation)
        seconds = time.perf_counter() - start
        if args.figure:
            _figure(curve, args)
        if args.out:
            curve.to_csv(args.out, index=False)
            counts = curve["status"].value_counts()
            print(f"wrote {args.out}: {len(curve)} rows, "
                  + ", ".join(f"{int(counts.get(s, 0))} {s}" for s in (TH.CONVERGED, TH.BRANCH_ENDED, TH.NO_ANCHOR)
                              if counts.get(s, 0))
                  + f", {seconds:.1f} s", file=sys.stderr)
        elif not args.figure:
            print(curve.to_csv(index=False), end="")
    if args.alpha_c:
        for omega in omegas:
            try:
                crossing = TH.alpha_c(omega, args.sigma, args.lam, args.teacher_A, solver, continuation=continuation)
                value = f"{crossing:.3f}"
            except ConfigError as exc:
                if len(omegas) == 1:
                    raise
                value = f"nan ({exc})"
            print(f"alpha_c(omega={omega:g}) = {value}", flush=True)
    return 0



def _figure(curve: pd.DataFrame, args: argparse.Namespace) -> None:
    from pefusion.analysis.figures.canvas import DPI
    from pefusion.analysis.figures.student import theory_eps_g_figure

    simulated = None
    if args.simulated:
        path = Path(args.simulated)
        if not path.exists():
            raise ConfigError(f"--simulated {args.simulated}: no such file")
        simulated = pd.read_json(path, lines=True) if path.suffix in (".json", ".jsonl") else pd.read_csv(path)
        missing = {"alpha", "init", "eps_g"} - set(simulated.columns)
        if missing:
            raise ConfigError(f"--simulated {args.simulated}: no column {sorted(missing)[0]!r} (needs alpha, init, "
                              f"eps_g)")
    title = (f"σ = {args.sigma:g}, λ = {args.lam:g}, ω = {args.omega:g}, A {args.teacher_A}; "
             f"{args.nodes}³ Gauss–Hermite × 2·{args.zeta_nodes} split along ζ")
    theory_eps_g_figure(curve, simulated, title).savefig(args.figure, dpi=DPI)
    print(f"wrote {args.figure}", file=sys.stderr)
