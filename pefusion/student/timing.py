"""The student study's timing for `--plan` (`pefusion.sweep.plan`): how long each point of a sweep will take.

A point's time is its fixed part (the data, the linear baseline, the test) plus its fit's steps, each a full
batch over its n = α·d samples for every replica it fits at once (λ-CV: |λ grid| × (folds + 1); a phase-diagram
point: both initialisations; a λ of a λ search: folds + 1). The sweep's largest point is run as its trial runs it,
with 2 and with 2 + k fit steps after an untimed warm-up run (k from `STEPS`, ×4 until the k steps take
`MIN_SPAN_S`): the difference is k steps, the rest the fixed part. Another point's
steps are scaled by n · d · replicas, what a step's two matmuls grow with.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Mapping, Sequence

import torch

from pefusion.fusion.device import device_name
from pefusion.student.config import StudentConfig, StudentPreset, point_config
from pefusion.student.cv import PHASE_INITS, run_cv_point, run_phase_point
from pefusion.sweep.study import Timing

STEPS = 20  # the fit steps first timed, beyond the 2 of the fixed part's run; ×4 until they take MIN_SPAN_S
MIN_SPAN_S = 0.5


def replicas(sweep: str, grid: Sequence[float], folds: int) -> int:
    """The students a trial of `sweep` fits at once."""
    return {"lambda_cv": len(grid) * (folds + 1), "phase_diagram": len(PHASE_INITS), "lambda_search": folds + 1}[sweep]


def run_point(sweep: str, point: StudentConfig, grid: Sequence[float], folds: int) -> None:
    """The point as its trial computes it (`pefusion.student.trainable`)."""
    if sweep == "phase_diagram":
        extra = {k: getattr(point, k) for k in ("optim", "lr", "iters", "n_test", "teacher_A", "r", "dtype")}
        run_phase_point(alpha=point.alpha, omega=point.omega, sigma=point.sigma, lam=point.lam, seed=point.seed,
                        d=point.d, **extra)
    else:
        run_cv_point(point, grid if sweep == "lambda_cv" else (point.lam,), folds)


def time_points(device_type: str, *, sweep: str, points: Sequence[dict[str, Any]], preset: StudentPreset,
                threads: int) -> Timing:
    """Every point's seconds, from the largest one run with 2 and 2 + k fit steps on this CPU with `threads`
    torch threads (student trials run on CPUs only: `device_type` is 'cpu')."""
    configs = [point_config(p, preset) for p in points]
    size = [c.n * c.d * replicas(sweep, grid, folds) for c, grid, folds in configs]
    largest = max(range(len(points)), key=size.__getitem__)
    point, grid, folds = configs[largest]
    torch.set_num_threads(threads)  # (the engine restores the driver's)
    # The first run pays the process's one-time costs (lazy imports, allocator warm-up: ~1 s, more than many steps
    # of a small point), which would make the 2-step run the slower one and the step's time zero: it is not timed.
    run_point(sweep, dataclasses.replace(point, iters=2), grid, folds)

    def timed(iters: int) -> float:
        start = time.perf_counter()
        run_point(sweep, dataclasses.replace(point, iters=iters), grid, folds)
        return time.perf_counter() - start

    base, steps = timed(2), STEPS
    # A small point's step is well under a millisecond: its steps are timed over at least MIN_SPAN_S, or a run's
    # noise (tens of ms) would be the difference.
    while (took := timed(2 + steps)) - base < MIN_SPAN_S and 2 + steps < point.iters:
        steps = min(4 * steps, point.iters - 2)
    step = max(took - base, 0.0) / steps
    fixed = max(base - 2 * step, 0.0)
    seconds = tuple(fixed + c.iters * step * s / size[largest] for (c, _, _), s in zip(configs, size))
    most = max(c.iters for c, _, _ in configs)
    what = (f"alpha {point.alpha:g} (n {point.n}), d {point.d}, "
            f"{replicas(sweep, grid, folds)} students fitted together")
    return Timing(seconds=seconds, device=f"cpu ({device_name(torch.device('cpu'))}, {threads} thread"
                                          f"{'s' if threads > 1 else ''})", trial=f"the point at {what}",
                  budget=f"{most} {point.optim.upper()} steps per fit",
                  ends_early="GD ends a fit at its fixed point" if any(c.optim == "gd" for c, _, _ in configs) else "")


def plan_timer(sweep: str, preset: StudentPreset, cpus: float) -> Callable[[Sequence[dict], Mapping[str, Any]],
                                                                          Callable[[str], Timing]]:
    """`StudySweep.timer` of a student sweep: `sweep` is lambda_cv, phase_diagram or lambda_search."""
    def timer(points: Sequence[dict[str, Any]], shipped: Mapping[str, Any]) -> Callable[[str], Timing]:
        return functools.partial(time_points, sweep=sweep, points=list(points), preset=preset,
                                 threads=max(1, int(cpus)))
    return timer
