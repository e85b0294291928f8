"""Tests of the Cui et al. student-attention library (docs/student.md): teacher data, the reduced (Gram) student against
the direct (n, L, d) model, batched replicas, K-fold CV, determinism, input validation and a reduced reproduction.

The full reproduction (d = 1000) is `pytest -m slow tests/test_student.py` or `python scripts/reproduce_student.py`.
"""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.student import config as C, fit as F, model as S, point as P
from pefusion.student.config import StudentConfig
from pefusion.student.cv import kfold_masks, reproduction_report, run_cv_point

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)


# --------------------------------------------------------------------------------------------------------------
# Direct references, written from the definitions (docs/student.md), one sample / one token pair at a time
# --------------------------------------------------------------------------------------------------------------


def direct_teacher(z: torch.Tensor, q_star: torch.Tensor, omega: float, A: torch.Tensor) -> torch.Tensor:
    """y for one sample z (L, d) with explicit loops over token pairs."""
    L, d = z.shape
    logits = torch.empty(L, L, dtype=z.dtype)
    for l in range(L):
        for k in range(L):
            logits[l, k] = (z[l] @ q_star) @ (z[k] @ q_star) / d
    att = torch.softmax(logits, dim=1)
    return ((1 - omega) * att + omega * A.to(z.dtype)) @ z


def direct_student(z: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """ŷ = softmax((xQ)(xQ)ᵀ/d)·x with x = z + p, p_1 = −p_2 = 1/√d, batched over samples: z (n, L, d)."""
    d = z.shape[-1]
    p = torch.ones(d, dtype=z.dtype) / math.sqrt(d)
    x = z + torch.stack([p, -p])
    s = x @ Q  # (n, L, r)
    return torch.softmax(s @ s.transpose(1, 2) / d, dim=-1) @ x


def direct_loss(z, y, Q, lam, weights):
    """Σ_μ w_μ ‖ŷ_μ − y_μ‖²/(2d) + (λ/2)‖Q‖², autograd-ready."""
    d = z.shape[-1]
    per = ((direct_student(z, Q) - y) ** 2).sum((1, 2)) / (2 * d)
    return (weights * per).sum() + 0.5 * lam * (Q ** 2).sum()


def tiny_data(d=40, alpha=1.5, seed=3, omega=0.3):
    """float64 tokens and teacher outputs plus the matching SampleStats."""
    cfg = StudentConfig(d=d, alpha=alpha, omega=omega, seed=seed, dtype="float64", n_test=500)
    q_star = S.draw_q_star(d, 1, seed)
    z = S.sample_tokens(cfg.n, 2, d, cfg.sigma, S.rng(seed, "train")).double()
    y = S.teacher_outputs(z, q_star.double(), omega, S.teacher_matrix())
    return cfg, q_star.double(), z, y, S.sample_stats(z, y, torch.float64)


# --------------------------------------------------------------------------------------------------------------
# Teacher
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("A_name", ["default", "alt"])
def test_teacher_matches_per_sample_computation(A_name):
    q_star = S.draw_q_star(64, 1, seed=7)
    z = S.sample_tokens(25, 2, 64, 0.5, S.rng(7, "train"))
    A = S.teacher_matrix(A_name)
    y = S.teacher_outputs(z, q_star, 0.3, A)
    for mu in range(z.shape[0]):
        torch.testing.assert_close(y[mu], direct_teacher(z[mu], q_star, 0.3, A), rtol=1e-5, atol=1e-6)


def test_teacher_limits_and_statistics():
    q_star = S.draw_q_star(500, 1, seed=0)
    z = S.sample_tokens(400, 2, 500, 0.5, S.rng(0, "train"))
    A = S.teacher_matrix()
    # ω = 1: purely positional, y = A z exactly
    torch.testing.assert_close(S.teacher_outputs(z, q_star, 1.0, A), torch.einsum("lk,nkd->nld", A, z))
    # token variance σ² = 0.25 and Q* ~ N(0, 1)
    assert abs(float(z.var()) - 0.25) < 0.005
    assert abs(float(q_star.var()) - 1.0) < 0.15
    # the teacher depends on the seed only (not on α): same Q* for the same seed, another for another seed
    assert torch.equal(q_star, S.draw_q_star(500, 1, seed=0))
    assert not torch.equal(q_star, S.draw_q_star(500, 1, seed=1))


def test_positional_encodings_are_unit_norm_and_opposite():
    p = S.positional_encodings(250)
    torch.testing.assert_close(p.norm(dim=1), torch.ones(2))
    torch.testing.assert_close(p[0], -p[1])


# --------------------------------------------------------------------------------------------------------------
# Reduced student == direct (n, L, d) student
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("r", [1, 2])
def test_reduced_errors_and_gradient_match_autograd_on_direct_model(r):
    cfg, q_star, z, y, stats = tiny_data()
    gen = torch.Generator().manual_seed(0)
    Q = torch.stack([q_star.repeat(1, r) + 0.3 * torch.randn(cfg.d, r, generator=gen, dtype=torch.float64),
                     torch.full((cfg.d, r), 3.0 / math.sqrt(cfg.d), dtype=torch.float64)])  # two replicas
    weights = (torch.rand(2, cfg.n, generator=gen) > 0.3).double()
    err = S.attention_errors(stats, Q)
    W = S._as_rows(Q, torch.float64)  # (2·r, d)
    w2 = 2 * weights[:, None, :]
    grad = S._error_gradient(S._projections(stats.xs, W, r), w2 * (stats.b - stats.g / 2), w2 * stats.g) @ stats.xs
    for i in range(2):
        Qi = Q[i].clone().requires_grad_()
        direct_loss(z, y, Qi, 0.0, weights[i]).backward()
        per = ((direct_student(z, Qi.detach()) - y) ** 2).sum((1, 2)) / (2 * cfg.d)
        torch.testing.assert_close(err[i], per, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grad[i * r:(i + 1) * r].T, Qi.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("optim", ["gd", "adam"])
@pytest.mark.parametrize("block_samples", [None, 7])
def test_fit_matches_direct_model_trained_with_torch_optim(optim, block_samples, monkeypatch):
    """Also with the step visiting the samples in blocks (7 samples a block: 9 blocks of 6–7 of the 60)."""
    cfg, q_star, z, y, stats = tiny_data()
    if block_samples:
        monkeypatch.setattr(F, "FIT_BLOCK_ENTRIES", block_samples * 2 * cfg.d)
        assert len(F._sample_blocks(stats, torch.ones(1, cfg.n), 1)) == 9
    lam, iters = 0.05, 60
    Q = q_star.clone().requires_grad_()
    opt = (torch.optim.SGD([Q], lr=0.15, weight_decay=lam) if optim == "gd"
           else torch.optim.Adam([Q], lr=0.01, weight_decay=lam))
    for _ in range(iters):
        opt.zero_grad()
        direct_loss(z, y, Q, 0.0, torch.ones(cfg.n, dtype=torch.float64)).backward()
        opt.step()
    fast = F.fit_students(stats, q_star[None], lam, optim=optim, iters=iters)
    torch.testing.assert_close(fast[0], Q.detach(), rtol=1e-8, atol=1e-10)
    assert not torch.allclose(fast[0], q_star, atol=1e-3)  # it did move


def test_float32_agrees_with_float64_after_5000_gd_steps():
    """The default float32 training does not drift from float64 over the authors' 5 000 GD steps."""
    results = {}
    for dtype in ("float32", "float64"):
        cfg = StudentConfig(d=100, alpha=2.0, seed=1, init="positional", n_test=2000, dtype=dtype)
        data = S.point_data(cfg)
        Q = F.fit_students(data.train, F.initial_q(cfg.init, data.q_star, cfg.seed)[None], cfg.lam)
        results[dtype] = Q.double()
    rel = float((results["float32"] - results["float64"]).norm() / results["float64"].norm())
    assert rel < 1e-5, rel  # measured ~2e-6 at d = 100 and d = 400


# --------------------------------------------------------------------------------------------------------------
# Batched replicas
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("optim", ["gd", "adam"])
@pytest.mark.parametrize("dtype,rtol", [("float32", 5e-5), ("float64", 1e-10)])
def test_batched_fit_equals_fits_one_by_one(optim, dtype, rtol, monkeypatch):
    """Same result up to summation order (measured max deviation after 300 steps: 6e-6 float32, 4e-14 float64);
    also when the step groups the samples by fold and skips each student's held-out ones (small blocks)."""
    cfg = StudentConfig(d=60, alpha=1.5, seed=2, init="random", dtype=dtype)
    data = S.point_data(cfg)
    inits = [F.initial_q(init, data.q_star, cfg.seed) for init in C.INITS]
    q0 = torch.stack(inits + inits)  # 6 replicas: 3 inits × 2 λ, with different fold masks
    lam = torch.tensor([1e-3, 1e-3, 1e-3, 0.1, 0.1, 0.1])
    weights = kfold_masks(cfg.n, 6, seed=0).float()
    assert len(F._sample_blocks(data.train, weights, 1)) == 1  # 90 samples: one block, all students
    batched = F.fit_students(data.train, q0, lam, weights, optim=optim, iters=300)
    for i in range(6):
        alone = F.fit_students(data.train, q0[i:i + 1], lam[i:i + 1], weights[i:i + 1], optim=optim, iters=300)
        torch.testing.assert_close(batched[i:i + 1], alone, rtol=rtol, atol=rtol / 10)
    monkeypatch.setattr(F, "FIT_BLOCK_ENTRIES", 8 * 2 * cfg.d)  # blocks of ≤ 8 samples
    blocks = F._sample_blocks(data.train, weights, 1)
    assert len(blocks) == 12 and all(len(rows) == 5 for rows, *_ in blocks)  # 6 folds × 2 blocks, 5 students each
    grouped = F.fit_students(data.train, q0, lam, weights, optim=optim, iters=300)
    torch.testing.assert_close(grouped, batched, rtol=rtol, atol=rtol / 10)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gd_replicas_leave_the_batch_at_a_fixed_point_with_the_weights_of_all_iterations(dtype, monkeypatch):
    """A strong weight decay (λ = 4: Q shrinks by 1 − lr·λ = 0.4 a step) drives Q towards 0 (s = 0 makes the data
    gradient 0) until, among the smallest (subnormal) floats, a step rounds back to the same Q, well before 3 000
    steps in float32 and float64; those replicas then leave the batch. Their result is bitwise the one of running
    every step (fixed_point_exit=False), and the replicas still training when they left stay within summation-order
    tolerance of that run."""
    cfg = StudentConfig(d=40, alpha=1.5, seed=2, init="semantic", dtype=dtype)
    data = S.point_data(cfg)
    q0 = F.initial_q(cfg.init, data.q_star, cfg.seed)[None].expand(6, -1, -1)
    lam = torch.tensor([1e-3, 1e-3, 1e-3, 4.0, 4.0, 4.0])
    weights = kfold_masks(cfg.n, 3, seed=0).repeat(2, 1)
    left_at: list[int] = []  # the number of replicas each time the batch is (re)built
    real_sample_blocks = F._sample_blocks

    def sample_blocks(stats, w, r):
        left_at.append(len(w))
        return real_sample_blocks(stats, w, r)

    monkeypatch.setattr(F, "_sample_blocks", sample_blocks)
    early = F.fit_students(data.train, q0, lam, weights, iters=3000)
    assert left_at[0] == 6 and left_at[-1] == 3  # the three λ = 4 replicas left, the others trained on
    assert float(early[3:].abs().max()) < 1e-30
    full = F.fit_students(data.train, q0, lam, weights, iters=3000, fixed_point_exit=False)  # all replicas, all steps
    assert torch.equal(early[3:], full[3:])
    torch.testing.assert_close(early[:3], full[:3], rtol=5e-5 if dtype == "float32" else 1e-10, atol=1e-7)


def test_test_tokens_are_the_seed_stream_in_chunks(monkeypatch):
    """Drawing the chunks into one reused buffer gives the test set of fresh tensors, chunk by chunk."""
    monkeypatch.setattr(S, "TEST_CHUNK_ENTRIES", 2 * 30 * 700)  # chunks of 700 samples
    cfg = StudentConfig(d=30, seed=4, n_test=2500)
    chunks = [z.clone() for z in S.test_tokens(cfg)]
    assert [len(z) for z in chunks] == [700, 700, 700, 400]
    gen = S.rng(cfg.seed, "test")
    for z in chunks:
        assert torch.equal(z, S.sample_tokens(len(z), 2, cfg.d, cfg.sigma, gen))


@pytest.mark.parametrize("r,dtype,teacher_A", [(1, "float32", "default"), (1, "float64", "alt"),
                                               (2, "float32", "alt")])
def test_test_errors_match_the_direct_model_on_the_same_fresh_samples(r, dtype, teacher_A, monkeypatch):
    """ε_g and ε_lin from token products (test_errors) equal ‖ŷ − y‖²/(2d) and ‖Bz − y‖²/(2d) averaged with the
    direct (n, L, d) model and teacher in float64, over several chunks (measured: ≤ 3e-8 relative with float32
    products, ≤ 1e-15 with float64 ones)."""
    monkeypatch.setattr(S, "TEST_CHUNK_ENTRIES", 2 * 40 * 700)
    cfg = StudentConfig(d=40, r=r, alpha=1.0, seed=2, n_test=2000, dtype=dtype, teacher_A=teacher_A)
    data = S.point_data(cfg)
    gen = torch.Generator().manual_seed(1)
    Q = torch.stack([data.q_star + 0.3 * torch.randn(cfg.d, r, generator=gen),
                     torch.full((cfg.d, r), 2.0 / math.sqrt(cfg.d)) + 0.1 * torch.randn(cfg.d, r, generator=gen)])
    B = torch.tensor([[0.7, 0.2], [0.3, 0.6]])
    eps_g, eps_lin = S.test_errors(data, Q, B)

    z = torch.cat([chunk.clone() for chunk in S.test_tokens(cfg)]).double()  # (n_test, L, d)
    y = S.teacher_outputs(z, data.q_star.double(), cfg.omega, S.teacher_matrix(teacher_A))
    direct = torch.stack([((direct_student(z, Q[i].double()) - y) ** 2).sum((1, 2)).mean() for i in range(2)])
    direct_lin = ((torch.einsum("lk,nkd->nld", B.double(), z) - y) ** 2).sum((1, 2)).mean()
    rtol = 2e-6 if dtype == "float32" else 1e-10
    torch.testing.assert_close(eps_g, direct / (2 * cfg.d), rtol=rtol, atol=0)
    assert eps_lin == pytest.approx(float(direct_lin) / (2 * cfg.d), rel=rtol)


def test_semantic_init_copies_the_teacher():
    data = S.point_data(StudentConfig(d=50, alpha=1.0, seed=0, iters=50))
    before = data.q_star.clone()
    q0 = F.initial_q("semantic", data.q_star, 0)
    assert q0.data_ptr() != data.q_star.data_ptr()
    F.fit_students(data.train, q0[None], 0.01, iters=50)
    assert torch.equal(data.q_star, before) and torch.equal(q0, before)  # neither Q* nor q0 was updated


def test_semantic_and_positional_inits_give_different_solutions(reduced_report):
    for res in reduced_report["points"][:3]:  # α = 2, seeds 0–2, d = 200, both inits batched together
        # semantic: aligned with the teacher, no positional magnetisation; positional: the reverse
        assert res[f"{R.THETA}_semantic"] > 0.5 and res[f"{R.M}_semantic"] < 0.05
        assert res[f"{R.M}_positional"] > 0.2 and res[f"{R.THETA}_positional"] < 0.2
        assert res[f"{R.EPS_G}_positional"] > 1.5 * res[f"{R.EPS_G}_semantic"]
        assert res[R.GLOBAL_MIN] == "semantic"
        # each fit named by where it ended: here both stayed where they started
        assert (res[f"{R.REACHED}_semantic"], res[f"{R.REACHED}_positional"]) == ("semantic", "positional")


def test_a_fit_is_named_by_the_solution_it_reached_not_its_start():
    # the authors' d = 1000 means: a semantic solution (m 0.0123, θ 0.4276), a positional one (0.2372, 0.0259);
    # a semantic start that escaped to the positional solution has the positional overlaps and is named so
    assert C.solution_reached(0.0123, 0.4276) == "semantic" and C.solution_reached(0.2372, 0.0259) == "positional"
    assert list(C.solution_reached([0.0053, 0.2396, math.nan], [0.6772, 0.0331, 0.1])) == [
        "semantic", "positional", "unknown"]


def test_linear_baseline_reaches_the_least_squares_optimum():
    _, _, _, _, stats = tiny_data(d=200, alpha=2.0)
    B = F.fit_linear(stats)
    S_zz, S_zy = stats.zz.sum(0), stats.zy.sum(0)
    B_ls = torch.linalg.solve(S_zz, S_zy).T  # argmin Σ‖Bz − y‖²
    loss, loss_ls = float(S.linear_errors(stats, B).sum()), float(S.linear_errors(stats, B_ls).sum())
    assert loss_ls <= loss <= loss_ls * (1 + 1e-3)


# --------------------------------------------------------------------------------------------------------------
# Cross-validation
# --------------------------------------------------------------------------------------------------------------


def test_kfold_splits_are_disjoint_cover_and_deterministic():
    masks = kfold_masks(103, 5, seed=4)
    held_out = ~masks
    assert held_out.sum(0).eq(1).all()  # every sample is held out exactly once: disjoint and covering
    sizes = held_out.sum(1)
    assert int(sizes.max() - sizes.min()) <= 1 and int(sizes.sum()) == 103
    assert torch.equal(masks, kfold_masks(103, 5, seed=4))
    assert not torch.equal(masks, kfold_masks(103, 5, seed=5))
    with pytest.raises(ConfigError):
        kfold_masks(10, 1, seed=0)


def test_cv_point_refit_equals_a_direct_fit_at_lambda_star():
    point = StudentConfig(d=60, alpha=1.5, seed=1, init="semantic", iters=400, n_test=1000)
    grid = [1e-3, 1e-1, 10.0]
    res = run_cv_point(point, grid, folds=3)
    curve = res[R.CV_CURVE]
    assert [row[R.LAMBDA] for row in curve] == grid
    means = [row[R.CV_ERROR_MEAN] for row in curve]
    assert res[R.LAMBDA_STAR] == grid[means.index(min(means))]
    assert all(row[R.CV_ERROR_STD] >= 0 for row in curve)
    direct = P.fit_point(StudentConfig(**{**point.__dict__, "lam": res[R.LAMBDA_STAR]}))
    for key in (R.EPS_G, R.EPS_T, R.M, R.THETA, R.EPS_LIN):
        assert res[key] == pytest.approx(direct[key], rel=1e-4), key
    # λ = 10 over-regularises: its validation error is the worst of the grid
    assert means[2] == max(means)


def test_a_diverging_lambda_is_never_chosen_and_a_diverged_fit_is_recorded_as_such():
    """GD with lr·λ > 2 blows up (|1 − lr·λ| > 1 per step): at lr 3, λ = 1 diverges and λ = 1e-3 does not."""
    from pefusion.student.trainable import with_status

    point = StudentConfig(d=32, alpha=1.0, init="semantic", lr=3.0, iters=300, n_test=500)
    res = run_cv_point(point, (1e-3, 1.0), folds=2)
    curve = res[R.CV_CURVE]
    assert math.isfinite(curve[0][R.CV_ERROR_MEAN]) and not math.isfinite(curve[1][R.CV_ERROR_MEAN])
    assert res[R.LAMBDA_STAR] == 1e-3 and math.isfinite(res[R.EPS_G])
    assert with_status(res)[R.STATUS] == R.STATUS_OK
    blown = run_cv_point(point, (1.0,), folds=2)
    record = with_status(blown)
    assert record[R.STATUS] == R.STATUS_DIVERGED and R.EPS_G in record[R.ERROR] and R.EPS_T in record[R.ERROR]


def test_same_seed_gives_identical_results():
    point = StudentConfig(d=50, alpha=1.2, seed=5, init="random", iters=200, n_test=500)
    a, b = run_cv_point(point, [1e-2, 1e-1], folds=2), run_cv_point(point, [1e-2, 1e-1], folds=2)
    a.pop(R.SECONDS), b.pop(R.SECONDS)
    assert a == b
    c = run_cv_point(StudentConfig(**{**point.__dict__, "seed": 6}), [1e-2, 1e-1], folds=2)
    assert c[R.EPS_G] != a[R.EPS_G]


# --------------------------------------------------------------------------------------------------------------
# Invalid inputs
# --------------------------------------------------------------------------------------------------------------

BAD = [({"alpha": 0.0}, "alpha"), ({"alpha": -1.0}, "alpha"), ({"omega": -0.1}, "omega"), ({"omega": 1.5}, "omega"),
       ({"lam": -1e-3}, "lam"), ({"d": 1}, "d"), ({"init": "orthogonal"}, "init"), ({"L": 3}, "L"),
       ({"optim": "lbfgs"}, "optim")]


@pytest.mark.parametrize("kwargs,key", BAD)
def test_invalid_config_raises_one_line(kwargs, key):
    with pytest.raises(ConfigError) as exc:
        StudentConfig(**kwargs)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(f"{key}=")


def test_config_defaults_follow_the_optimiser_and_accept_numpy_integers():
    import numpy as np

    assert (StudentConfig().lr, StudentConfig().iters) == (0.15, 5000)
    assert (StudentConfig(optim="adam").lr, StudentConfig(optim="adam").iters) == (0.01, 2500)
    cfg = StudentConfig(d=np.int64(300), seed=np.int64(2), alpha=1.5)
    assert type(cfg.d) is int and cfg.n == 450


def _load_cli():
    spec = importlib.util.spec_from_file_location("student_fit", ROOT / "scripts" / "student_fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv", [["--alpha", "0"], ["--omega", "1.2"], ["--lam", "-0.1"], ["--d", "1"],
                                  ["--init", "orthogonal"], ["--alpha", "abc"]])
def test_cli_invalid_inputs_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _load_cli().main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("error: ") and err.count("\n") == 1


def test_cli_prints_one_json_line(capsys):
    assert _load_cli().main(["--d", "30", "--alpha", "1", "--iters", "20", "--n-test", "100", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert {R.EPS_G, R.EPS_T, R.M, R.THETA, R.EPS_LIN, R.SECONDS} <= rec.keys()
    assert rec[R.D] == 30 and rec[R.N_TRAIN] == 30


def test_cli_json_of_a_diverged_fit_is_strict_json(capsys):
    """GD at lr 3 with λ = 1 blows up (|1 − lr·λ| > 1): the metrics are non-finite and print as null."""
    argv = ["--d", "32", "--alpha", "1", "--lam", "1", "--lr", "3", "--iters", "300", "--n-test", "100", "--json"]
    assert _load_cli().main(argv) == 0
    line = capsys.readouterr().out.strip()
    rec = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert rec[R.EPS_G] is None and rec[R.EPS_T] is None and rec[R.EPS_LIN] is not None


def test_cli_exit_code_in_a_real_process():
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "student_fit.py"), "--omega", "2"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.startswith("error: omega=") and bad.stderr.count("\n") == 1


# --------------------------------------------------------------------------------------------------------------
# Reproduction (docs/student.md)
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reduced_report():
    """d = 200 instead of 1000, 5 000 test samples instead of 50 000, the authors' 5 000 GD steps, seeds 0–2.

    Order flip at α = 0.6 / 1.6 instead of 1.0 / 1.6: at d = 200 the seed-mean training losses cross at α ≈ 0.9
    (measured: Δε_t = ε_t,pos − ε_t,sem < 0 at 0.4, 0.6, 0.8 and > 0 at 1.0, 1.2, 1.6), below the d → ∞
    value α_c = 1.24, so α = 1.0 is already on the semantic side at this size."""
    return reproduction_report(d=200, seeds=(0, 1, 2), n_test=5000, tolerance=0.25,
                               order={0.6: "positional", 1.6: "semantic"})


def test_reduced_reproduction(reduced_report):
    """Tolerance 25 %: at d = 200 the seed-to-seed spread of single-point values is up to ~20 % (ε_g positional,
    ε_lin), so the 3-seed mean carries ~12 % noise; 25 % is two of those, so the test does not hinge on the
    particular draws. The measured means sit well inside it: ε_g 0.00145 / 0.00361, ε_lin 0.00200, θ 0.632,
    m 0.257 (all within 3.5 % of the published d = 1000 values)."""
    failed = [row for row in reduced_report["checks"] if not row["pass"]]
    assert not failed, failed
    assert len(reduced_report["checks"]) == 7


@pytest.mark.slow
def test_full_reproduction():
    """The issue's check: d = 1000, 50 000 test samples, seeds 0–2, each within 10 %, and the order flip."""
    report = reproduction_report()
    failed = [row for row in report["checks"] if not row["pass"]]
    assert not failed, failed


# A small phase map at the demo's settings (the demo itself, through Ray, is the slow test in test_sweeps.py)
SMALL_MAP_ALPHAS, SMALL_MAP_SEEDS, THEORY_ALPHA_C_02 = (0.5, 0.75, 1.0, 1.25), (0, 1), 0.947


def test_a_small_map_at_the_demo_settings_changes_once_near_the_theorys_alpha_c():
    """The phase diagram demo preset's students (its d, GD steps and test size) at ω 0.2, λ 0.01, α 0.5-1.25 and
    two seeds, run directly: the seed-mean training-loss gap changes sign once along α, from positional to
    semantic, within 0.2 of the d → ∞ α_c(0.2) = 0.947 (docs/theory.md), and the points' calls change at most
    once. The demo's earlier settings (d = 200, 1 500 steps) changed sign twice here, at 0.53 and 0.83."""
    import pandas as pd

    from pefusion.analysis import student_tables as ST
    from pefusion.student.cv import run_phase_point

    point = dict(C.PHASE_PRESETS["demo"].point)
    sigma = point.pop("sigma")
    point.pop("omega")
    rows = pd.DataFrame([run_phase_point(alpha, 0.2, sigma, 0.01, seed, **point)
                         for alpha in SMALL_MAP_ALPHAS for seed in SMALL_MAP_SEEDS])
    deltas = pd.DataFrame({"source": ST.SOURCE_PHASE, R.ALPHA: rows[R.ALPHA], R.OMEGA: rows[R.OMEGA],
                           R.SIGMA: rows[R.SIGMA], R.D: rows[R.D], ST.LAM_FIXED: rows[R.LAMBDA],
                           R.SEED: rows[R.SEED], "delta_eps_g": 0.0,
                           "delta_eps_t": rows["eps_t_positional"] - rows["eps_t_semantic"]})
    crossing = ST.crossing_alphas(deltas).iloc[0]
    assert crossing.sign_changes.count("(") == 1 and crossing.sign_changes.endswith("(−+)"), crossing.sign_changes
    assert crossing.n_call_changes <= 1
    assert abs(crossing.alpha_c_estimate - THEORY_ALPHA_C_02) < 0.2, crossing.alpha_c_estimate
    # its 95 % interval holds the theory's α_c; two seeds (t_1 = 12.7) may leave a side open, which it says
    low, high = crossing.alpha_c_low, crossing.alpha_c_high
    print(f"α_c {crossing.alpha_c_estimate:.3f} ({low:.3f}–{high:.3f}) {crossing.alpha_c_open}")
    assert low <= THEORY_ALPHA_C_02 <= high and (bool(crossing.alpha_c_open) == (math.isinf(low) or math.isinf(high)))
