"""One point's metrics and record, and `fit_point`, the single-student run of scripts/student_fit.py (docs/student.md).

Owns ε_t (`training_losses`), the overlaps m and θ, `point_metrics` (with ε_g and the linear baseline's ε_lin
from `model.test_errors`) and `config_record`, the point's identity under the record names.

Why it looks as it does: every runner of a point (`fit_point` here; `run_cv_point` and `run_phase_point` in
cv.py) ends in the same metrics and record, so a point's record is defined once, here; the metrics take students
as a batch Q (R, d, r) because the CV and phase runners fit and evaluate several at once.
"""
from __future__ import annotations

import time
from dataclasses import asdict

import torch

from pefusion import record as R
from pefusion.student.config import StudentConfig
from pefusion.student.fit import fit_linear, fit_students, initial_q
from pefusion.student.model import PointData, SampleStats, attention_errors, point_data, test_errors


def overlaps(Q: torch.Tensor, q_star: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summary statistics m = |1_dᵀQ|/d and θ = |Q*ᵀQ|/d of students Q (R, d, r): two (R,) tensors.

    For r > 1 these are the Euclidean / Frobenius norms of the (r,) and (r, r) overlaps."""
    d = Q.shape[1]
    Q = Q.double()
    m = Q.sum(1).norm(dim=-1) / d  # (R,)
    theta = torch.linalg.matrix_norm(q_star.double().T @ Q) / d  # (R,)
    return m, theta


def training_losses(stats: SampleStats, Q: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """ε_t = [Σ_μ ‖ŷ_μ − y_μ‖²/(2d) + (λ/2)‖Q‖²] / d per replica: Q (R, d, r), lam (R,) -> (R,)."""
    data_term = attention_errors(stats, Q).double().sum(1)  # (R,)
    reg = 0.5 * lam.double() * Q.double().pow(2).sum((1, 2))
    return (data_term + reg) / stats.d


def point_metrics(data: PointData, Q: torch.Tensor, lam: torch.Tensor, B: torch.Tensor) -> list[dict]:
    """ε_t, ε_g, m, θ of students Q (R, d, r) trained on all n samples, plus the linear baseline's ε_g."""
    eps_t = training_losses(data.train, Q, lam)
    eps_g, eps_lin = test_errors(data, Q, B)
    m, theta = overlaps(Q, data.q_star)
    return [{R.EPS_T: float(eps_t[i]), R.EPS_G: float(eps_g[i]), R.M: float(m[i]), R.THETA: float(theta[i]),
             R.EPS_LIN: eps_lin} for i in range(Q.shape[0])]


def config_record(cfg: StudentConfig) -> dict:
    """The point's identity under the record names (plus the remaining config fields as they are)."""
    out = asdict(cfg)
    renamed = {"alpha": R.ALPHA, "omega": R.OMEGA, "sigma": R.SIGMA, "init": R.INIT, "lam": R.LAMBDA, "d": R.D,
               "seed": R.SEED}
    return {renamed.get(k, k): v for k, v in out.items()} | {R.N_TRAIN: cfg.n}


def fit_point(cfg: StudentConfig) -> dict:
    """Fit one student (a batch of one) and the linear baseline at a point; the record of scripts/student_fit.py."""
    start = time.perf_counter()
    data = point_data(cfg)
    q0 = initial_q(cfg.init, data.q_star, cfg.seed)[None]
    lam = torch.tensor([cfg.lam])
    Q = fit_students(data.train, q0, lam, optim=cfg.optim, lr=cfg.lr, iters=cfg.iters)
    B = fit_linear(data.train)
    metrics = point_metrics(data, Q, lam, B)[0]
    return config_record(cfg) | metrics | {R.SECONDS: time.perf_counter() - start}
