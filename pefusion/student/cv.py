"""λ cross-validation and the per-point runners that the student sweeps call (docs/student.md).

`run_cv_point` fits, for every λ of the grid, the K fold students AND the refit on all n samples as ONE batched
program (R = |grid|·(K+1) replicas sharing the point's data): each replica's loss is a weighted sum over the
samples with weight 1 on its training samples and 0 elsewhere, so a fold student sees exactly its K−1 folds and
the refit sees all n. The refit at λ* is then the already trained all-n replica of λ* (the same deterministic
fit a second run would produce), and its metrics are the point's result. Fitting only λ*'s refit, after the
CV, saves |grid| − 1 replicas but costs more: a one-replica step is memory-bound (measured at d = 1000, 5 λ:
25 CV replicas then 1 refit took 8–16 % longer than the 30 together, at α = 1 and 2).

`run_phase_point` fits the semantic and positional initialisations together at one λ and says which reaches the
lower training loss (the global minimum), for the phase diagram. `reproduction_report` is the issue's check of
the published numbers, built on it, with the d → ∞ theory's value beside each check (pefusion.student.theory).
"""
from __future__ import annotations

import math
import numbers
import time
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.student.config import (DEFAULT_FOLDS, DEFAULT_LAM_GRID, REPRODUCTION_ORDER, REPRODUCTION_POINT,
                                     REPRODUCTION_PUBLISHED, StudentConfig, solution_reached)
from pefusion.student.fit import fit_linear, fit_students, initial_q
from pefusion.student.model import attention_errors, point_data, rng
from pefusion.student.point import config_record, point_metrics
from pefusion.student.theory import BRANCHES, cached_points, simulation_theta

PHASE_INITS = ("semantic", "positional")


def kfold_masks(n: int, folds: int, seed: int) -> torch.Tensor:
    """Training masks of K-fold CV, (K, n) bool: row k is False exactly on fold k's held-out samples.

    The held-out sets are disjoint, cover all n samples and differ in size by at most one; the assignment is a
    permutation drawn from the seed's 'folds' stream, so it is deterministic for the seed."""
    if isinstance(folds, bool) or not isinstance(folds, numbers.Integral) or not 2 <= folds <= n:
        raise ConfigError(f"folds={folds!r} is out of range; it must be an integer in [2, n={n}]")
    perm = torch.randperm(n, generator=rng(seed, "folds"))
    fold_of = torch.empty(n, dtype=torch.long)
    fold_of[perm] = torch.arange(n) * folds // n  # contiguous runs of the permutation: sizes differ by ≤ 1
    return fold_of[None, :] != torch.arange(folds)[:, None]


def cv_replicas(n: int, lam_grid: Sequence[float], folds: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The students of one λ-CV point: training masks (G·(K+1), n) bool and weight decays (G·(K+1),) float64,
    λ-major, then folds 0..K−1, then the refit on all n samples."""
    train_masks = torch.cat([kfold_masks(n, folds, seed), torch.ones(1, n, dtype=torch.bool)])  # (K+1, n)
    lam = torch.tensor(lam_grid, dtype=torch.float64).repeat_interleave(folds + 1)
    return train_masks.repeat(len(lam_grid), 1), lam


def _check_grid(lam_grid: Sequence[float]) -> tuple[float, ...]:
    grid = tuple(float(x) for x in lam_grid)
    if not grid or any(not (math.isfinite(x) and x >= 0) for x in grid):
        raise ConfigError(f"lam_grid={list(lam_grid)!r} must be a non-empty list of finite values >= 0")
    return grid


def run_cv_point(point: StudentConfig, lam_grid: Sequence[float] = DEFAULT_LAM_GRID,
                 folds: int = DEFAULT_FOLDS) -> dict:
    """K-fold CV over the λ grid at one point, then the refit at λ* on all n samples.

    The CV score of λ is the mean over folds of the validation error per held-out sample, ‖ŷ − y‖²/(2d) (the
    ε_g normalisation); λ* is its argmin over the finite scores (the smallest λ on ties). Returns the point's
    identity, the refit's eps_g (fresh samples), eps_t, m, theta, lam_star, the linear baseline's eps_lin, the curve
    [{lam, cv_error_mean, cv_error_std (across folds, ddof=1)}, ...] and the wall time."""
    start = time.perf_counter()
    grid = _check_grid(lam_grid)
    data = point_data(point)
    n, n_lam = point.n, len(grid)
    weights, lam = cv_replicas(n, grid, folds, point.seed)  # (G·(K+1), n), (G·(K+1),)
    q0 = initial_q(point.init, data.q_star, point.seed)[None].expand(weights.shape[0], -1, -1)
    Q = fit_students(data.train, q0, lam, weights, optim=point.optim, lr=point.lr, iters=point.iters)
    err = attention_errors(data.train, Q).double()  # (R, n)
    held_out = (~weights).double()
    val = ((err * held_out).sum(1) / held_out.sum(1).clamp_min(1)).view(n_lam, folds + 1)[:, :folds]  # (G, K)
    mean, std = val.mean(1), val.std(1)
    # a λ whose fits blew up (non-finite CV error, e.g. lr·λ > 2 under GD) can never be λ*
    best = int(torch.argmin(torch.where(mean.isfinite(), mean, math.inf)))
    refit = best * (folds + 1) + folds
    metrics = point_metrics(data, Q[refit:refit + 1], lam[refit:refit + 1], fit_linear(data.train))[0]
    curve = [{R.LAMBDA: grid[i], R.CV_ERROR_MEAN: float(mean[i]), R.CV_ERROR_STD: float(std[i])}
             for i in range(n_lam)]
    return (config_record(point) | metrics
            | {R.LAMBDA_STAR: grid[best], R.CV_CURVE: curve, R.SECONDS: time.perf_counter() - start})


def run_phase_point(alpha: float, omega: float, sigma: float, lam: float, seed: int, d: int = 1000,
                    **config: object) -> dict:
    """Fit the semantic and positional initialisations (one batch of two) at a fixed λ.

    `config` takes the other StudentConfig fields (optim, lr, iters, n_test, teacher_A, r, dtype). Returns
    eps_t_*, eps_g_*, m_*, theta_*, reached_* (the solution the fit ended in, from its overlaps:
    config.solution_reached) for * in (semantic, positional), eps_lin, global_min (the initialisation with the
    lower training loss) and the point's identity."""
    start = time.perf_counter()
    point = StudentConfig(d=d, alpha=alpha, omega=omega, sigma=sigma, lam=lam, seed=seed, init="semantic",
                          **config)
    data = point_data(point)
    q0 = torch.stack([initial_q(init, data.q_star, seed) for init in PHASE_INITS])  # (2, d, r)
    lam_t = torch.full((len(PHASE_INITS),), float(lam))
    Q = fit_students(data.train, q0, lam_t, optim=point.optim, lr=point.lr, iters=point.iters)
    per_init = point_metrics(data, Q, lam_t, fit_linear(data.train))
    out = {k: v for k, v in config_record(point).items() if k != R.INIT}
    for init, metrics in zip(PHASE_INITS, per_init):
        out |= {f"{key}_{init}": metrics[key] for key in (R.EPS_T, R.EPS_G, R.M, R.THETA)}
        out[f"{R.REACHED}_{init}"] = solution_reached(metrics[R.M], metrics[R.THETA])
    out[R.EPS_LIN] = per_init[0][R.EPS_LIN]
    out[R.GLOBAL_MIN] = min(PHASE_INITS, key=lambda init: out[f"{R.EPS_T}_{init}"])
    return out | {R.SECONDS: time.perf_counter() - start}


def reproduction_report(d: int = REPRODUCTION_POINT["d"], seeds: Sequence[int] = (0, 1, 2),
                        n_test: int = REPRODUCTION_POINT["n_test"], tolerance: float = 0.10,
                        order: Mapping[float, str] = REPRODUCTION_ORDER, theory_cache: str | Path | None = None,
                        **config: object) -> dict:
    """The issue's reproduction check: the seed-mean of ε_g (both inits), ε_lin, θ (semantic), m (positional)
    at α = 2 against the published values within `tolerance` (relative), and, for each α of `order`, whether
    the expected initialisation has the lower training loss (seed-mean of ε_t). `config` overrides other
    StudentConfig fields (e.g. iters). With `theory_cache` (a folder), each check also carries `theory`, the
    d → ∞ value (the lower training loss: the branch with the lower −Φ; none for ε_lin), cached there.
    Returns {"points": per-seed phase-point records, "checks": [{quantity, measured, published, pass, ...}]}."""
    base = {"omega": REPRODUCTION_POINT["omega"], "sigma": REPRODUCTION_POINT["sigma"],
            "lam": REPRODUCTION_POINT["lam"], "d": d} | config
    points, checks = [], []
    at_alpha = [run_phase_point(alpha=REPRODUCTION_POINT["alpha"], seed=s, n_test=n_test, **base) for s in seeds]
    points += at_alpha
    for key, published in REPRODUCTION_PUBLISHED.items():
        measured = float(np.mean([p[key] for p in at_alpha]))
        rel = (measured - published) / published
        checks.append({"quantity": key, "alpha": REPRODUCTION_POINT["alpha"], "measured": measured,
                       "published": published, "rel_diff": rel, "pass": bool(abs(rel) <= tolerance)})
    for alpha, expected in order.items():
        # ε_g is not needed for the order: a small test set keeps these points cheap
        at = [run_phase_point(alpha=alpha, seed=s, n_test=1000, **base) for s in seeds]
        points += at
        gap = float(np.mean([p[f"{R.EPS_T}_positional"] - p[f"{R.EPS_T}_semantic"] for p in at]))
        lower = "semantic" if gap > 0 else "positional"
        checks.append({"quantity": "lower_training_loss", "alpha": alpha, "measured": lower, "published": expected,
                       "eps_t_pos_minus_sem": gap, "per_seed": [p[R.GLOBAL_MIN] for p in at],
                       "pass": lower == expected})
    if theory_cache is not None:
        _add_theory(checks, base, theory_cache)
    return {"points": points, "checks": checks}


def _add_theory(checks: list[dict], base: Mapping[str, object], cache_dir: str | Path) -> None:
    """Each check's d → ∞ value as `theory` (NaN where the theory has none or did not converge)."""
    alphas = sorted({c["alpha"] for c in checks})
    sigma, teacher_A = float(base["sigma"]), str(base.get("teacher_A", "default"))
    points = pd.DataFrame([{"sigma": sigma, "lam": float(base["lam"]), "omega": float(base["omega"]),
                            "teacher_A": teacher_A, "alpha": float(a), "branch": b} for a in alphas for b in BRANCHES])
    theory = cached_points(points, cache_dir).set_index(["alpha", "branch"])
    for c in checks:
        quantity, alpha = c["quantity"], float(c["alpha"])
        if quantity == "lower_training_loss":  # the training loss is −Φ
            phi = theory.loc[alpha, "phi"]
            c["theory"] = "unknown" if phi.isna().any() else ("semantic" if phi["semantic"] > phi["positional"]
                                                              else "positional")
        elif quantity.startswith(f"{R.EPS_G}_"):
            c["theory"] = float(theory.loc[(alpha, quantity.removeprefix(f"{R.EPS_G}_")), "eps_g"])
        elif quantity == f"{R.THETA}_semantic":
            c["theory"] = float(simulation_theta(theory.loc[(alpha, "semantic"), "theta"], sigma))
        elif quantity == f"{R.M}_positional":
            c["theory"] = abs(float(theory.loc[(alpha, "positional"), "m"]))
        else:
            c["theory"] = math.nan
