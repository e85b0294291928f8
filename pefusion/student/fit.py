"""Fitting study B's models, full batch: the attention students (`fit_students`, R at once) from their three
initialisations (`initial_q`), and the authors' dense linear baseline (`fit_linear`); docs/student.md.

A student minimises Σ_μ w_μ ‖ŷ_μ − y_μ‖²/(2d) + (λ/2)‖Q‖² by full-batch GD (lr 0.15, 5 000 steps) or Adam
(lr 0.01, 2 500), the authors' settings (config.OPTIM_DEFAULTS); the errors and their gradient are model.py's.

Why it looks as it does: many students sharing a point's data (λ × folds × inits × seeds) are rows of the same
two matmuls of model.py's algebra (projections, then gradient): R replicas are held as W = stacked Qᵀ, (R·r, d),
and each has its own per-sample weights (a fold's training mask) and its λ. A step visits the samples in
cache-sized blocks grouped by the replicas that train on them (`_sample_blocks`), and under GD a replica that has
reached a fixed point leaves the batch. The loop uses model.py's private helpers (_as_rows, _as_q, _projections,
_error_gradient): the algebra stays with the model it expands, the loop that drives it lives here.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from pefusion.errors import ConfigError
from pefusion.student.config import INITS, LINEAR_EPOCHS, LINEAR_LR, LINEAR_WEIGHT_DECAY, OPTIM_DEFAULTS
from pefusion.student.model import SampleStats, _as_q, _as_rows, _error_gradient, _projections, rng

# A training step visits the samples in blocks of at most this many input entries (2 MB of float32): the gradient
# matmul then re-reads from cache the block that the projection matmul has just read. With that and each fold's
# held-out samples skipped (_sample_blocks), a step of a default λ-CV point's 30 students at d = 1000 went from
# 10.3 to 8.1 ms at α = 2 and from 5.3 to 4.5 ms at α = 1 (one thread); below α ≈ 0.5, one block, no change.
FIT_BLOCK_ENTRIES = 1 << 19
# Every this many GD steps, replicas whose weights the step left bitwise unchanged leave the batch (see
# fit_students). Checking costs a copy and a compare of W (~0.1 % of a step); a replica stays at most this many
# steps after it reached its fixed point.
FIXED_POINT_CHECK_EVERY = 10


# ---------------------------------------------------------------------------------------------------------
# Attention students: R replicas trained as one tensor program
# ---------------------------------------------------------------------------------------------------------


def _sample_blocks(stats: SampleStats, weights: torch.Tensor, r: int) -> list[tuple[torch.Tensor, ...]]:
    """The blocks a training step visits, [(rows, xs, bw, gw)], for the R replicas' per-sample loss weights
    (R, n): the samples in equal blocks of at most FIT_BLOCK_ENTRIES input entries, grouped by the replicas that
    train on them when each group fills at least half a block (a K-fold split has K groups; a fold's students
    then never touch their held-out samples; smaller groups would cost more in blocks than they save).
    rows (R'·r,) are the rows of W of the R' replicas in a block, xs (L·m, d) its inputs (contiguous,
    token-major like stats.xs), bw, gw its statistics and those replicas' weights as _error_gradient takes them."""
    n, d = stats.n, stats.d
    xs = stats.xs.view(2, n, d)
    patterns, group = torch.unique(weights != 0, dim=1, return_inverse=True)  # (R, P), (n,)
    if int(torch.bincount(group).min()) * 2 * d < FIT_BLOCK_ENTRIES // 2:
        patterns, group = torch.ones(len(weights), 1, dtype=torch.bool), torch.zeros(n, dtype=torch.long)
    blocks = []
    for p in range(patterns.shape[1]):
        replicas = patterns[:, p].nonzero()[:, 0]  # (R',)
        samples = (group == p).nonzero()[:, 0]
        if len(replicas) == 0:
            continue
        rows = (replicas[:, None] * r + torch.arange(r)).reshape(-1)  # (R'·r,)
        for idx in samples.tensor_split(-(-len(samples) * 2 * d // FIT_BLOCK_ENTRIES)):
            w2 = 2.0 * weights[replicas][:, None, idx]  # (R', 1, m)
            blocks.append((rows, xs[:, idx].reshape(-1, d), w2 * (stats.b[:, idx] - 0.5 * stats.g[idx]),
                           w2 * stats.g[idx]))
    return blocks



def fit_students(stats: SampleStats, q0: torch.Tensor, lam: torch.Tensor | Sequence[float] | float,
                 weights: torch.Tensor | None = None, *, optim: str = "gd", lr: float | None = None,
                 iters: int | None = None, fixed_point_exit: bool = True) -> torch.Tensor:
    """Train R students that share the data, full batch, as one tensor program.

    q0 (R, d, r) initial weights (copied, never modified); lam (R,) weight decays (or one for all); weights
    (R, n) per-sample loss weights (a fold's training mask; None = all ones). Each replica minimises
    Σ_μ w_μ ‖ŷ_μ − y_μ‖²/(2d) + (λ/2)‖Q‖² by full-batch GD or torch.optim.Adam, the weight decay entering the
    gradient as λQ (torch's L2 coupling, as SGD/Adam(weight_decay=λ)). Replicas do not interact, so a batch
    equals the same fits run one by one. Returns the final Q, (R, d, r).

    Under GD, a replica whose weights a step leaves bitwise unchanged has reached a fixed point of the float
    arithmetic: the step is a deterministic function of its own weights, so every later step would leave them
    unchanged too, and it leaves the batch with exactly the weights the remaining iterations would end on. At
    the default λ-CV grid (d = 1000), λ = 1 reaches one (Q ≈ 0, among the subnormal floats) after ~700 of the
    5 000 steps and λ = 0.1 often by ~2 000, so a point's 30 replicas do 17–26 % fewer replica-steps. Adam's
    moments keep moving: no exit. fixed_point_exit=False keeps every replica for every step (same result; for
    timing the exit)."""
    lr = OPTIM_DEFAULTS[optim][0] if lr is None else lr
    iters = OPTIM_DEFAULTS[optim][1] if iters is None else iters
    dtype, (n_rep, _, r) = stats.xs.dtype, q0.shape
    W_out = _as_rows(q0, dtype)  # (R·r, d), a copy: q0 (e.g. the teacher's Q*) is never touched
    lam_all = torch.as_tensor(lam, dtype=dtype).reshape(-1).expand(n_rep)
    w_all = torch.ones(n_rep, stats.n, dtype=dtype) if weights is None else weights.to(dtype)
    active = torch.arange(n_rep)  # the replicas still training; W holds their rows

    def batch_of(active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list]:
        rows = (active[:, None] * r + torch.arange(r)).reshape(-1)
        return rows, lam_all[active].repeat_interleave(r)[:, None], _sample_blocks(stats, w_all[active], r)

    rows_out, lam_rows, blocks = batch_of(active)
    W = W_out.clone()  # (R'·r, d): the rows of the replicas still training
    # Plain GD is torch.optim.SGD's update (param -= lr·grad) written out: the optimiser's per-step Python
    # bookkeeping costs as much as the elementwise part of the step at R = 1. λW is added to the gradient, not
    # folded into a factor 1 − lr·λ: that factor, rounded to float32, is the same error at every step (float32
    # then drifted 9e-5 from float64 in 5 000 steps at d = 100, against 1.4e-6 this way).
    adam = torch.optim.Adam([W], lr=lr) if optim == "adam" else None
    for step in range(1, iters + 1):
        check = fixed_point_exit and adam is None and step % FIXED_POINT_CHECK_EVERY == 0 and step < iters
        before = W.clone() if check else None
        grad = lam_rows * W  # (R·r, d): λW + ∂loss/∂W
        for rows, xs, bw, gw in blocks:
            grad_s = _error_gradient(_projections(xs, W.index_select(0, rows), r), bw, gw)  # (R'·r, L·m)
            grad.index_add_(0, rows, grad_s @ xs)
        if adam is None:
            W.add_(grad, alpha=-lr)
        else:
            W.grad = grad
            adam.step()
        if check:
            fixed = (W == before).view(len(active), -1).all(1)  # (R',); NaN never equals itself: never fixed
            if fixed.any():
                W_out[rows_out] = W
                active = active[~fixed]
                if len(active) == 0:
                    break
                rows_out, lam_rows, blocks = batch_of(active)
                W = W_out[rows_out]  # a copy of the rows still training
    W_out[rows_out] = W
    return _as_q(W_out, r)


def initial_q(init: str, q_star: torch.Tensor, seed: int) -> torch.Tensor:
    """The three initialisations, (d, r): semantic = a copy of Q*, positional = 1_d/√d, random = 0.1·N(0, 1)."""
    d, r = q_star.shape
    if init == "semantic":
        return q_star.clone()
    if init == "positional":
        return torch.full((d, r), 1.0 / math.sqrt(d))
    if init == "random":
        return 0.1 * torch.randn(d, r, generator=rng(seed, "init"))
    raise ConfigError(f"init={init!r} is not allowed; choose one of: {', '.join(INITS)}")



# ---------------------------------------------------------------------------------------------------------
# Dense linear baseline ŷ = B z, B ∈ R^{L×L}, fed z only: the authors' fit
# ---------------------------------------------------------------------------------------------------------


def fit_linear(stats: SampleStats, *, lr: float = LINEAR_LR, epochs: int = LINEAR_EPOCHS,
               weight_decay: float = LINEAR_WEIGHT_DECAY) -> torch.Tensor:
    """The authors' linear baseline: Adam on Σ_μ ‖B z_μ − y_μ‖²/(2d) from B = 0, full batch. Returns B (L, L).

    The loss is quadratic in B, so it only needs the summed Gram matrices; the gradient is (B·Σzz − Σzyᵀ)/d."""
    S_zz, S_zy = stats.zz.sum(0), stats.zy.sum(0)  # (L, L)
    B = torch.zeros_like(S_zz)
    B.grad = torch.zeros_like(B)
    opt = torch.optim.Adam([B], lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        B.grad.copy_((B @ S_zz - S_zy.T) / stats.d)
        opt.step()
    return B.detach()
