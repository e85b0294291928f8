"""The teacher–student model of dot-product attention of Cui, Behrens, Krzakala & Zdeborová (NeurIPS 2024);
docs/student.md states it.

Owns the teacher (Q*, tokens, teacher outputs), the positional encodings, the per-sample statistics
(`SampleStats`), a point's training and test data, and the student's forward/error algebra: its per-sample
errors and their gradient, the linear baseline's errors, and ε_g on fresh test samples. Fitting is fit.py's.

Teacher: y = (1−ω)·softmax(z Q* Q*ᵀ zᵀ / d)·z + ω·A·z on tokens z_l ~ N(0, σ² I_d), L = 2.
Student: ŷ = softmax((xQ)(xQ)ᵀ / d)·x on x_l = z_l + p_l, p_1 = −p_2 = 1_d/√d, Q ∈ R^{d×r} (query = key).
Objective: Σ_μ ‖ŷ_μ − y_μ‖²/(2d) + (λ/2)‖Q‖², minimised by full-batch GD or Adam in fit.py.

Why the code looks the way it does: with L = 2 the softmax over two tokens is a sigmoid of a score difference,
so ŷ_l = (x_1 + x_2)/2 + v_l·(x_1 − x_2) with v_l = a_l − ½ a scalar per (sample, token). Expanding ‖ŷ_l − y_l‖²
leaves three d-dimensional dot products per sample (`SampleStats`), computed ONCE; every step then only needs the
projections s = xQ (one matmul over the 2n × d inputs) and the gradient (∂loss/∂s)ᵀ·X (a second one). Many
students sharing a point's data (λ × folds × inits × seeds) are rows of the same two matmuls: R replicas are
held as W = stacked Qᵀ, (R·r, d), and each has its own per-sample weights (a fold's training mask) and its λ.
Centring at v = a − ½ (not a) keeps the expanded terms small, which is what keeps float32 accurate (see tests).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from pefusion.errors import ConfigError
from pefusion.student.config import TEACHER_A, StudentConfig

# Test data is streamed in chunks of this many token entries (5 000 samples at d = 1000, L = 2): about 0.4 GB of
# float64 work arrays at most, whatever n_test. The chunking is part of the test set's definition (random stream).
TEST_CHUNK_ENTRIES = 10_000_000


# ---------------------------------------------------------------------------------------------------------
# Random streams: one seed, independent streams for teacher, training data, test data, init and folds
# ---------------------------------------------------------------------------------------------------------

_STREAMS = {"teacher": 0, "train": 1, "test": 2, "init": 3, "folds": 4}


def rng(seed: int, stream: str) -> torch.Generator:
    """A CPU generator for one named stream of a data seed (streams do not overlap, so e.g. the test set
    does not depend on n and the teacher does not depend on α)."""
    state = np.random.SeedSequence((seed, _STREAMS[stream])).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)


# ---------------------------------------------------------------------------------------------------------
# Teacher data
# ---------------------------------------------------------------------------------------------------------


def teacher_matrix(name: str = "default") -> torch.Tensor:
    """The positional part A of the teacher, (L, L)."""
    return torch.tensor(TEACHER_A[name], dtype=torch.float32)


def draw_q_star(d: int, r: int, seed: int) -> torch.Tensor:
    """Teacher weights Q* ~ N(0, I_d), (d, r), one per data seed."""
    return torch.randn(d, r, generator=rng(seed, "teacher"))


def teacher_mix(t: torch.Tensor, d: int, omega: float, A: torch.Tensor) -> torch.Tensor:
    """The teacher's per-sample token mixing (1−ω)·softmax(t tᵀ / d) + ω·A from its projections t = z Q*:
    t (n, L, r) -> (n, L, L), rows over tokens, so that y = mix · z."""
    att = torch.softmax(t @ t.transpose(1, 2) / d, dim=-1)  # (n, L, L)
    return (1.0 - omega) * att + omega * A.to(t.dtype)


def teacher_outputs(z: torch.Tensor, q_star: torch.Tensor, omega: float, A: torch.Tensor) -> torch.Tensor:
    """y = (1−ω)·softmax(z Q* Q*ᵀ zᵀ / d)·z + ω·A·z for every sample at once. z (n, L, d) -> y (n, L, d).

    Works for any L (A is (L, L)); the teacher never sees positional encodings."""
    return teacher_mix(z @ q_star, z.shape[-1], omega, A) @ z  # (n, L, d)


def sample_tokens(n: int, L: int, d: int, sigma: float, generator: torch.Generator,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """z_l ~ N(0, σ² I_d), (n, L, d), float32; drawn into out[:n] if given (the same numbers either way)."""
    # torch.normal scales inside the sampling loop: the numbers of randn(...)·σ, without a second pass
    if out is None:
        return torch.normal(0.0, sigma, size=(n, L, d), generator=generator)
    return torch.normal(0.0, sigma, size=(n, L, d), generator=generator, out=out[:n])


def positional_encodings(d: int, L: int = 2, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """p_1 = +1_d/√d, p_2 = −1_d/√d (unit norm), (L, d)."""
    if L != 2:
        raise ConfigError(f"L={L} is not supported; the positional encodings are defined for L=2")
    p = torch.full((d,), 1.0 / math.sqrt(d), dtype=dtype)
    return torch.stack([p, -p])


# ---------------------------------------------------------------------------------------------------------
# Per-sample statistics: everything the losses need from the d-dimensional data, computed once
# ---------------------------------------------------------------------------------------------------------


@dataclass
class SampleStats:
    """What the attention and linear losses need from n samples.

    Attention, with mid = (x_1 + x_2)/2 and diff = x_1 − x_2:  ŷ_l − y_l = (mid − y_l) + v_l·diff, where
    v_l = a_l − ½ and a_l is token l's attention on token 1, so ‖ŷ_l − y_l‖²/(2d) = c_l + 2 v_l b_l + v_l² g with
    c_l = ‖mid − y_l‖²/(2d), b_l = diff·(mid − y_l)/(2d), g = ‖diff‖²/(2d).
    Linear baseline (ŷ = B z), float64: zz = z zᵀ, zy[k, l] = z_k·y_l, yy_l = ‖y_l‖².
    Training data also carry the student inputs divided by √d, so that xs·Q = s/√d and the attention logits are
    plain products of projections; test chunks do not (their projections come with the chunk, see test_errors)."""

    c: torch.Tensor  # (L, n)
    b: torch.Tensor  # (L, n)
    g: torch.Tensor  # (n,)
    zz: torch.Tensor  # (n, L, L) float64
    zy: torch.Tensor  # (n, L, L) float64
    yy: torch.Tensor  # (n, L) float64
    d: int
    xs: torch.Tensor | None = None  # (L*n, d) student inputs / √d, token-major: row l·n + μ is x_{μ,l}/√d

    @property
    def n(self) -> int:
        return self.g.shape[0]


def _stats_from_products(zz: torch.Tensor, zy: torch.Tensor, yy: torch.Tensor, zp: torch.Tensor, yp: torch.Tensor,
                         d: int, dtype: torch.dtype, xs: torch.Tensor | None = None) -> SampleStats:
    """SampleStats from the per-sample inner products (float64) of the tokens z_l, the teacher outputs y_l and
    p = p_1 = −p_2: zz, zy (n, L, L), yy (n, L) as in SampleStats, zp[:, l] = z_l·p, yp[:, l] = y_l·p (n, L).

    With mid = (z_1 + z_2)/2 (the encodings cancel) and diff = z_1 − z_2 + 2p (‖p‖ = 1), every statistic is a
    combination of these products, so they can come from the vectors (training) or from a token Gram (test)."""
    mid_mid = 0.25 * zz.sum((1, 2))  # (n,)
    mid_y = 0.5 * zy.sum(1)  # (n, L)
    diff_mid = 0.5 * (zz[:, 0, 0] - zz[:, 1, 1]) + zp.sum(1)  # (n,)
    diff_y = zy[:, 0] - zy[:, 1] + 2.0 * yp  # (n, L)
    diff_diff = zz[:, 0, 0] - 2.0 * zz[:, 0, 1] + zz[:, 1, 1] + 4.0 * (zp[:, 0] - zp[:, 1]) + 4.0  # (n,)
    return SampleStats(
        c=((mid_mid[:, None] - 2.0 * mid_y + yy) / (2 * d)).T.to(dtype).contiguous(),
        b=((diff_mid[:, None] - diff_y) / (2 * d)).T.to(dtype).contiguous(),
        g=(diff_diff / (2 * d)).to(dtype),
        zz=zz, zy=zy, yy=yy, d=d, xs=xs,
    )


def sample_stats(z: torch.Tensor, y: torch.Tensor, dtype: torch.dtype = torch.float32) -> SampleStats:
    """Student inputs and per-sample statistics from tokens z and teacher outputs y, both (n, L, d); the inner
    products in float64."""
    n, L, d = z.shape
    P = positional_encodings(d, L, torch.float64)  # (L, d)
    z64, y64 = z.double(), y.double()
    x = z64 + P  # (n, L, d)
    return _stats_from_products(zz=z64 @ z64.transpose(1, 2), zy=z64 @ y64.transpose(1, 2), yy=(y64 * y64).sum(-1),
                                zp=z64 @ P[0], yp=y64 @ P[0], d=d, dtype=dtype,
                                xs=(x / math.sqrt(d)).transpose(0, 1).reshape(L * n, d).to(dtype))


def training_data(cfg: StudentConfig, q_star: torch.Tensor) -> SampleStats:
    """The n = α·d training samples of a point (stream 'train' of its seed)."""
    z = sample_tokens(cfg.n, cfg.L, cfg.d, cfg.sigma, rng(cfg.seed, "train"))
    y = teacher_outputs(z, q_star, cfg.omega, teacher_matrix(cfg.teacher_A))
    return sample_stats(z, y, cfg.torch_dtype)


def test_tokens(cfg: StudentConfig) -> Iterator[torch.Tensor]:
    """Fresh tokens (stream 'test' of the seed), n_test samples in chunks (≤ chunk, L, d) to bound memory.

    The chunks are drawn into one buffer (no page faults per chunk): each is valid until the next is drawn."""
    gen = rng(cfg.seed, "test")
    chunk = max(1, TEST_CHUNK_ENTRIES // (cfg.L * cfg.d))
    buf = torch.empty(min(chunk, cfg.n_test), cfg.L, cfg.d)
    for start in range(0, cfg.n_test, chunk):
        yield sample_tokens(min(chunk, cfg.n_test - start), cfg.L, cfg.d, cfg.sigma, gen, out=buf)


# ---------------------------------------------------------------------------------------------------------
# Student: per-sample errors and their gradient for R replicas at once
# ---------------------------------------------------------------------------------------------------------
# Replicas are held as W (R·r, d), the rows of Qᵀ stacked, so the projections of all of them are ONE matmul
# W @ xsᵀ -> (R, r, L, n) and their gradients ONE matmul (∂loss/∂s) @ xs -> (R·r, d).


def _as_rows(Q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Q (R, d, r) -> W (R·r, d), a fresh contiguous tensor (never a view of Q)."""
    return Q.transpose(1, 2).reshape(-1, Q.shape[1]).to(dtype=dtype, copy=True)


def _as_q(W: torch.Tensor, r: int) -> torch.Tensor:
    """W (R·r, d) -> Q (R, d, r)."""
    return W.reshape(-1, r, W.shape[1]).transpose(1, 2).contiguous()


def _projections(xs: torch.Tensor, W: torch.Tensor, r: int) -> torch.Tensor:
    """s = x·Q/√d of the R students W (R·r, d) on the inputs xs (L·n, d): (R, r, L, n)."""
    return (W @ xs.T).view(W.shape[0] // r, r, 2, -1)


def _attention_on_first(s: torch.Tensor) -> torch.Tensor:
    """a_l = σ(u_l), token l's attention on token 1, from the projections s (R, r, L, n): (R, L, n). u_l =
    s_l·(s_1 − s_2) is token l's attention logit on token 1 minus that on token 2."""
    s1, s2 = s.unbind(2)  # (R, r, n)
    return torch.sigmoid((s * (s1 - s2)[:, :, None]).sum(1))


def _errors(stats: SampleStats, s: torch.Tensor) -> torch.Tensor:
    """Per-sample errors ‖ŷ − y‖²_F/(2d) = Σ_l c_l + 2 v_l b_l + v_l² g, v = a − ½, from the projections
    s (R, r, L, n): (R, n)."""
    v = _attention_on_first(s) - 0.5  # (R, L, n)
    return (stats.c + v * (2.0 * stats.b + v * stats.g)).sum(1)


def _error_gradient(s: torch.Tensor, bw: torch.Tensor, gw: torch.Tensor) -> torch.Tensor:
    """∂(Σ_μ w_μ err_μ)/∂s of the projections s (R, r, L, n), as (R·r, L·n), from bw = 2w·(b − g/2) (R, L, n)
    and gw = 2w·g (R, 1, n), the samples' statistics with the loss weights folded in.

    ∂err/∂v_l = 2(b_l + v_l g) = 2(b_l − g/2 + a_l g); ∂v/∂u = a(1 − a); u_1 = s_1·δ, u_2 = s_2·δ with
    δ = s_1 − s_2. Written in a rather than v = a − ½ to save elementwise passes: this runs once per block of
    samples and step, and on small blocks the number of passes, not their size, is the cost."""
    a = _attention_on_first(s)  # (R, L, n)
    du = torch.addcmul(bw, a, gw).mul_(torch.addcmul(a, a, a, value=-1.0))  # (R, L, n): ∂(w·err)/∂u
    du1, du2 = du[:, None].unbind(2)  # (R, 1, n)
    s1, s2 = s.unbind(2)  # (R, r, n)
    # ∂/∂s_1 = du1·(s_1 + δ) + du2·s_2 = 2 du1·s_1 + (du2 − du1)·s_2;  ∂/∂s_2 = (du2 − du1)·s_1 − 2 du2·s_2
    cross = du2 - du1
    grad_s = torch.empty_like(s)
    g1, g2 = grad_s.unbind(2)
    torch.mul(cross, s2, out=g1).addcmul_(du1, s1, value=2.0)
    torch.mul(cross, s1, out=g2).addcmul_(du2, s2, value=-2.0)
    return grad_s.view(-1, s.shape[2] * s.shape[3])


def attention_errors(stats: SampleStats, Q: torch.Tensor) -> torch.Tensor:
    """Per-sample errors ‖ŷ_μ − y_μ‖²_F/(2d) of students Q (R, d, r) on training samples `stats`: (R, n)."""
    return _errors(stats, _projections(stats.xs, _as_rows(Q, stats.xs.dtype), Q.shape[2]))


# ---------------------------------------------------------------------------------------------------------
# Dense linear baseline ŷ = B z, B ∈ R^{L×L}, fed z only
# ---------------------------------------------------------------------------------------------------------


def linear_errors(stats: SampleStats, B: torch.Tensor) -> torch.Tensor:
    """Per-sample errors ‖Bz − y‖²/(2d) of the linear baseline: (n,)."""
    B = B.to(torch.float64)
    quad = torch.einsum("lk,nkj,lj->n", B, stats.zz, B)
    cross = torch.einsum("lk,nkl->n", B, stats.zy)
    return (quad - 2 * cross + stats.yy.sum(-1)) / (2 * stats.d)


# ---------------------------------------------------------------------------------------------------------
# One point: its data, and its students' and the linear baseline's errors on fresh test samples
# ---------------------------------------------------------------------------------------------------------


@dataclass
class PointData:
    """A point's teacher and training samples (shared by every replica fitted at that point)."""

    cfg: StudentConfig
    q_star: torch.Tensor  # (d, r)
    train: SampleStats


def point_data(cfg: StudentConfig) -> PointData:
    q_star = draw_q_star(cfg.d, cfg.r, cfg.seed)
    return PointData(cfg, q_star, training_data(cfg, q_star))


def test_errors(data: PointData, Q: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, float]:
    """ε_g of students Q (R, d, r) and of the linear baseline B on n_test fresh samples: ((R,), float).

    Every statistic of a sample is a combination of a few inner products of its tokens (see
    `_stats_from_products`), so a test chunk is read twice and never copied: one matmul gives the teacher's and
    the students' projections and the token sums, one batched matmul the token Gram z zᵀ (in the training
    dtype, float32 by default: a relative error ~1e-7 that no combination below amplifies). The teacher's
    mixing, y's products and the errors follow from these small (n, L, ·) tensors in float64."""
    cfg, (n_rep, d, r), L = data.cfg, Q.shape, data.cfg.L
    dtype = cfg.torch_dtype
    rows = torch.cat([data.q_star.T.to(dtype), torch.ones(1, d, dtype=dtype), _as_rows(Q, dtype)])  # (k, d)
    A = teacher_matrix(cfg.teacher_A)
    p_dot_q = positional_encodings(d, L, torch.float64)[:, :1, None] * Q.double().sum(1)  # (L, R, r): p_l·Q
    total, total_lin = torch.zeros(n_rep, dtype=torch.float64), 0.0
    for z in test_tokens(cfg):
        z, m = z.to(dtype), z.shape[0]
        proj = (z.view(m * L, d) @ rows.T).view(m, L, -1).double()  # (m, L, k): z·Q*, z·1, z·Q
        zz = torch.bmm(z, z.transpose(1, 2)).double()  # (m, L, L)
        mix = teacher_mix(proj[..., :r], d, cfg.omega, A)  # (m, L, L): y_l = Σ_k mix[l, k] z_k
        zp = proj[..., r] / math.sqrt(d)  # (m, L): z_l·p
        stats = _stats_from_products(zz, zy=zz @ mix.transpose(1, 2), yy=((mix @ zz) * mix).sum(-1), zp=zp,
                                     yp=(mix @ zp[..., None])[..., 0], d=d, dtype=torch.float64)
        # s_l = x_l·Q/√d = (z_l·Q + p_l·Q)/√d, as (R, r, L, m)
        s = (proj[..., r + 1:].view(m, L, n_rep, r) + p_dot_q) / math.sqrt(d)
        total += _errors(stats, s.permute(2, 3, 1, 0)).sum(1)
        total_lin += float(linear_errors(stats, B).sum())
    return total / cfg.n_test, total_lin / cfg.n_test
