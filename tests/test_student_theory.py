"""Tests of the student theory (SPEC §11, pefusion.student.theory): one step of the fixed-point map against a slow
reference written here from the equations (scipy's BFGS per quadrature node), the paper's anchors at α = 2, the
branch structure, convergence in the node count, α_c(0.3) and the order of the training losses around it, the
cache and the command line."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
from numpy.polynomial.hermite import hermgauss
from scipy.optimize import minimize
from scipy.special import expit

from pefusion.cli.flags import run_main
from pefusion.cli.theory import main as theory_main
from pefusion.student import theory as TH

torch.set_num_threads(1)
SIGMA, LAM, OMEGA, A = 0.5, 0.01, 0.3, ((0.6, 0.4), (0.4, 0.6))


# --------------------------------------------------------------------------------------------------------------
# A slow reference from SPEC §11: a scalar optimiser per node, plain loops
# --------------------------------------------------------------------------------------------------------------


def reference_step(state, alpha: float, n: int = 3, omega: float = OMEGA, a=A):
    """One application of the map (q, m, θ, V) -> (q, m, θ, V), and Φ and ε_g at `state`, on an n⁴ tensor
    Gauss–Hermite grid, the proximal point by BFGS from (0, 0) node by node."""
    q, m, theta, V = state
    rho = SIGMA ** 2
    t, w = hermgauss(n)
    t, w = t * math.sqrt(2), w / math.sqrt(math.pi)
    v_star = math.sqrt(rho - theta ** 2 / q)
    sums = dict(f2=0.0, fd=0.0, fy=0.0, fx=0.0, min=0.0, eg=0.0)
    for i1, i2, j1, j2 in np.ndindex(n, n, n, n):
        xi1, xi2, y1, y2 = t[i1], t[i2], t[j1], t[j2]
        weight = w[i1] * w[i2] * w[j1] * w[j2]
        w1, w2 = math.sqrt(q) * xi1 + m, math.sqrt(q) * xi2 - m
        h1, h2 = v_star * y1 + theta / math.sqrt(q) * xi1, v_star * y2 + theta / math.sqrt(q) * xi2
        softmax = np.exp([[h1 * h1, h1 * h2], [h2 * h1, h2 * h2]])
        softmax /= softmax.sum(1, keepdims=True)
        Y = (1 - omega) * softmax + omega * np.array(a)

        def loss(x):
            s1, s2 = expit(x[0] * (x[0] - x[1])), expit(x[1] * (x[1] - x[0]))
            return SIGMA ** 2 * ((s1 - Y[0, 0]) ** 2 + (s2 - Y[1, 1]) ** 2)

        def objective(x):
            return ((x[0] - w1) ** 2 + (x[1] - w2) ** 2) / V + 2 * loss(x)

        res = minimize(objective, np.zeros(2), method="BFGS", options={"gtol": 1e-11})
        f1, f2 = (res.x[0] - w1) / V, (res.x[1] - w2) / V
        sums["f2"] += weight * (f1 * f1 + f2 * f2)
        sums["fd"] += weight * (f1 - f2)
        sums["fy"] += weight * (f1 * y1 + f2 * y2)
        sums["fx"] += weight * (f1 * xi1 + f2 * xi2)
        sums["min"] += weight * res.fun
        sums["eg"] += weight * loss((w1, w2))
    q_hat, m_hat = alpha * sums["f2"], alpha * sums["fd"]
    theta_hat = alpha * sums["fy"] / v_star
    V_hat = -alpha * sums["fx"] / math.sqrt(q) + theta * theta_hat / q
    D = LAM + SIGMA ** 2 * V_hat
    new = (SIGMA ** 2 * (SIGMA ** 2 * q_hat + m_hat ** 2 + SIGMA ** 2 * rho * theta_hat ** 2) / D ** 2,
           m_hat / D, SIGMA ** 2 * rho * theta_hat / D, SIGMA ** 2 / D)
    phi = ((V_hat * q - q_hat * V) / 2 - m * m_hat - theta * theta_hat
           + (SIGMA ** 2 * q_hat + m_hat ** 2 + SIGMA ** 2 * rho * theta_hat ** 2) / (2 * D) - alpha / 2 * sums["min"])
    return np.array(new), phi, sums["eg"]


def library_step(states, alpha: float, n: int = 3):
    """The same through pefusion.student.theory: the states (P, 4) -> new states (P, 4), Φ (P,), ε_g (P,)."""
    k = len(states)
    params = TH.make_params([alpha] * k, [SIGMA] * k, [LAM] * k, [OMEGA] * k, ["default"] * k)
    state = torch.tensor(states, dtype=torch.float64).T
    hat = TH.channel(state, params, TH.Quadrature.gauss_hermite(n))
    assert hat.ok.all()
    return TH.prior(hat, params).T.numpy(), TH.free_energy(state, hat, params).numpy(), hat.eps_g.numpy()


def test_one_step_of_the_map_matches_the_scalar_reference():
    """Both branches' starting points and a state one reference step further, at α = 2 and α = 0.8."""
    for alpha in (2.0, 0.8):
        starts = [TH.BRANCH_START[b] for b in TH.BRANCHES]
        refs = [reference_step(s, alpha) for s in starts]
        # one damped step on (0.8 x + 0.2 F(x)), as the iteration goes: m and θ off their starting values
        states = starts + [tuple(0.8 * np.array(s) + 0.2 * r[0]) for s, r in zip(starts, refs)]
        refs += [reference_step(s, alpha) for s in states[2:]]
        new, phi, eps_g = library_step(states, alpha)
        for i, (ref_new, ref_phi, ref_eps) in enumerate(refs):
            assert new[i] == pytest.approx(ref_new, rel=1e-5, abs=1e-8), (alpha, states[i])
            assert phi[i] == pytest.approx(ref_phi, rel=1e-6)
            assert eps_g[i] == pytest.approx(ref_eps, rel=1e-9)


# --------------------------------------------------------------------------------------------------------------
# The fixed point at the paper's anchor
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def anchor() -> pd.DataFrame:
    return TH.theory_curve([2.0], SIGMA, LAM, OMEGA).set_index("branch")


def test_anchor_alpha_2_matches_the_paper_and_the_d1000_simulation(anchor):
    assert anchor["converged"].all()
    sem, pos = anchor.loc["semantic"], anchor.loc["positional"]
    assert sem.eps_g == pytest.approx(0.0014, rel=0.03) and pos.eps_g == pytest.approx(0.0035, rel=0.03)
    # the project's d = 1000 simulation (README: mean of seeds 0-2) and its overlaps θ = |Q*ᵀQ|/d, m
    assert sem.eps_g == pytest.approx(0.0014334, rel=0.05) and pos.eps_g == pytest.approx(0.0034528, rel=0.05)
    assert TH.simulation_theta(sem.theta, SIGMA) == pytest.approx(0.63494, rel=0.05)
    assert pos.m == pytest.approx(0.25992, rel=0.05)


def test_branch_structure(anchor):
    """Semantic: no positional overlap, θ > 0. Positional: θ = 0 (symmetric y -> −y), m > 0."""
    sem, pos = anchor.loc["semantic"], anchor.loc["positional"]
    assert abs(sem.m) < 1e-8 and sem.theta > 0.1
    assert abs(pos.theta) < 1e-8 and pos.m > 0.2
    assert 0 < pos.q < sem.q and sem.V > 0 and pos.V > 0


def test_doubling_the_nodes_moves_eps_g_by_less_than_0_2_percent(anchor):
    finer = TH.theory_curve([2.0], SIGMA, LAM, OMEGA, solver=TH.Solver(nodes=2 * TH.DEFAULT_NODES))
    finer = finer.set_index("branch")
    for branch in TH.BRANCHES:
        assert finer.loc[branch, "eps_g"] == pytest.approx(anchor.loc[branch, "eps_g"], rel=0.002)


def test_alpha_c_and_which_branch_has_the_lower_training_loss():
    """α_c(0.3) ≈ 1.25-1.26 (SPEC §11); the training loss is −Φ: positional lower below α_c, semantic above."""
    value = TH.alpha_c(OMEGA, SIGMA, LAM)
    assert 1.24 <= value <= 1.27
    curve = TH.theory_curve([value - 0.15, value + 0.15], SIGMA, LAM, OMEGA)
    loss = -curve.set_index(["alpha", "branch"])["phi"]
    below, above = value - 0.15, value + 0.15
    assert loss[(below, "positional")] < loss[(below, "semantic")]
    assert loss[(above, "semantic")] < loss[(above, "positional")]


def test_a_point_that_does_not_converge_is_nan_not_a_number():
    rows = TH.theory_curve([2.0], SIGMA, LAM, OMEGA, solver=TH.Solver(nodes=4, max_iter=3))
    assert not rows["converged"].any() and rows[["q", "m", "theta", "V", "eps_g", "phi"]].isna().all().all()
    assert (rows["iterations"] == 3).all()


def test_a_semantic_start_that_falls_to_theta_zero_is_not_reported_as_the_semantic_branch():
    """At λ = 0.1, α = 1.5 the semantic start settles on the positional solution (θ = 0, the same m and ε_g):
    there is no semantic solution there, so the point is not converged, never a tie between the branches."""
    rows = TH.fixed_points([1.5, 1.5], ["semantic", "positional"], sigma=[SIGMA] * 2, lam=[0.1] * 2,
                           omega=[OMEGA] * 2, teacher_A=["default"] * 2, solver=TH.Solver(nodes=6))
    sem, pos = rows.set_index("branch").loc["semantic"], rows.set_index("branch").loc["positional"]
    assert not sem.converged and np.isnan([sem.q, sem.m, sem.theta, sem.eps_g, sem.phi]).all()
    assert pos.converged and pos.m > 0.1


# --------------------------------------------------------------------------------------------------------------
# The cache and the command line (coarse solvers: these check the plumbing, not the numbers)
# --------------------------------------------------------------------------------------------------------------

COARSE = TH.Solver(nodes=5)


def test_cache_computes_once_and_is_keyed_by_the_parameters(tmp_path, monkeypatch):
    points = pd.DataFrame({"sigma": 0.5, "lam": [0.01, 0.01, 0.005], "omega": 0.3, "teacher_A": "default",
                           "alpha": 1.5, "branch": ["semantic", "positional", "semantic"]})
    first = TH.cached_points(points, tmp_path, COARSE)
    assert len(first) == 3 and first["converged"].all()
    monkeypatch.setattr(TH, "fixed_points", lambda *a, **k: pytest.fail("recomputed a cached point"))
    again = TH.cached_points(points.iloc[::-1], tmp_path, COARSE)
    pd.testing.assert_frame_equal(first, again)
    monkeypatch.undo()
    other = TH.cached_points(points.iloc[:1], tmp_path, TH.Solver(nodes=4))  # another solver: a new entry
    assert other["eps_g"].iloc[0] != first["eps_g"].iloc[0]
    assert len(pd.read_csv(tmp_path / TH.CACHE_POINTS)) == 4


def test_command_line_curve_and_alpha_c(tmp_path, capsys):
    out, png, simulated = tmp_path / "theory.csv", tmp_path / "eps_g.png", tmp_path / "sim.jsonl"
    simulated.write_text('{"alpha": 2.0, "init": "semantic", "eps_g": 0.0014, "seed": 0}\n')
    assert theory_main(["--omega", "0.3", "--alphas", "1.5:2.0:0.5", "--out", str(out), "--nodes", "5",
                        "--alpha-c", "--figure", str(png), "--simulated", str(simulated)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = pd.read_csv(out)
    assert list(table.columns) == ["alpha", "branch", "q", "m", "theta", "V", "eps_g", "phi", "iterations",
                                   "converged"]
    assert table[["alpha", "branch"]].values.tolist() == [[1.5, "semantic"], [1.5, "positional"],
                                                           [2.0, "semantic"], [2.0, "positional"]]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"alpha_c\(omega=0\.3\) = 1\.\d{3}", last), last


@pytest.mark.parametrize("argv, message", [
    (["--alphas", "2:1:0.1"], "error: --alphas '2:1:0.1': start:stop:step needs a step > 0 and stop >= start\n"),
    (["--omega", "1.5", "--alpha-c"], "error: omega=1.5 is out of range; it must be in [0, 1]\n"),
    (["--A", "other"], "error: argument --A: invalid choice: 'other' (choose from 'standard', 'alt')\n"),
    (["--nodes", "1"], "error: nodes=1 is out of range; it must be an integer >= 2\n"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_main(theory_main, argv)
    assert exit_.value.code == 2 and capsys.readouterr().err == message


def test_reproduction_table_carries_the_theory(tmp_path, capsys):
    """The reproduction's checks get the d → ∞ value beside the measured one (a tiny simulation: the plumbing)."""
    from pefusion.cli.reproduction import print_reproduction
    from pefusion.student.cv import reproduction_report

    report = reproduction_report(d=32, seeds=(0,), n_test=200, iters=20, theory_cache=tmp_path)
    theory = {(c["quantity"], c["alpha"]): c["theory"] for c in report["checks"]}
    assert theory[("eps_g_semantic", 2.0)] == pytest.approx(0.0014, rel=0.03)
    assert theory[("eps_g_positional", 2.0)] == pytest.approx(0.0035, rel=0.03)
    assert theory[("theta_semantic", 2.0)] == pytest.approx(0.63, rel=0.05)
    assert theory[("m_positional", 2.0)] == pytest.approx(0.26, rel=0.05)
    assert math.isnan(theory[("eps_lin", 2.0)])
    assert theory[("lower_training_loss", 1.0)] == "positional" and theory[("lower_training_loss", 1.6)] == "semantic"
    assert (tmp_path / TH.CACHE_POINTS).exists()
    print_reproduction(report, as_json=False)
    header, *rows = capsys.readouterr().out.splitlines()
    assert "theory d->inf" in header and "0.0014" in rows[0]


@pytest.mark.slow  # 20 s of CPU: α_c(0.3) and four fixed points at the default node count
def test_report_puts_the_theory_beside_a_phase_diagram_sweep_and_logs_it(tmp_path):
    """A phase-diagram sweep of one point (α = 2, ω = 0.3, λ = 0.01, both inits) through MLflow and the report:
    the theory's ε_g stands beside each init, the theory's α_c(0.3) beside the crossing, and the theory's cache
    is logged to the parent run with the tables."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from pefusion import record as R
    from pefusion.analysis import runs as RU
    from pefusion.analysis.report import build_report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("student-attention", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, tags={R.TAG_ROLE: "sweep", R.TAG_SWEEP: "phase_diagram"}).info.run_id
    client.set_terminated(parent, "FINISHED")
    for alpha in (1.0, 2.0):  # the README's d = 1000 values at α = 2; made-up ones at α = 1
        trial = client.create_run(exp, tags={R.TAG_PARENT: parent, R.TAG_ROLE: "trial", R.TAG_TRIAL_ID: str(alpha),
                                             R.TAG_STATUS: R.STATUS_OK}).info.run_id
        params = {R.ALPHA: alpha, R.OMEGA: 0.3, R.SIGMA: 0.5, R.D: 1000, R.SEED: 0, R.LAMBDA: 0.01}
        metrics = {"eps_g_semantic": 0.0014334, "eps_g_positional": 0.0034528, "eps_t_semantic": 0.0039,
                   "eps_t_positional": 0.0050 - 0.003 * (alpha < 1.5), "m_semantic": 0.0, "m_positional": 0.26,
                   "theta_semantic": 0.63, "theta_positional": 0.0, R.EPS_LIN: 0.002}
        client.log_batch(trial, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
                         params=[Param(k, str(v)) for k, v in params.items()])
        client.set_terminated(trial, "FINISHED")
    sweep = RU.load_sweep(uri, "student-attention", parent)
    page, written = build_report(sweep, tmp_path / "results")
    runs = pd.read_csv(tmp_path / "results" / "student_runs.csv").set_index([R.ALPHA, R.INIT])
    assert runs.loc[(2.0, "semantic"), "eps_g_theory"] == pytest.approx(0.0014, rel=0.03)
    assert runs.loc[(2.0, "positional"), "eps_g_theory"] == pytest.approx(0.0035, rel=0.03)
    assert runs.loc[(2.0, "semantic"), "theta_theory"] == pytest.approx(0.63, rel=0.05)
    crossing = pd.read_csv(tmp_path / "results" / "student_alpha_c.csv")
    assert 1.24 <= crossing["alpha_c_theory"].iloc[0] <= 1.27 and 1.0 < crossing["alpha_c_estimate"].iloc[0] < 2.0
    assert "d → ∞" in page.read_text()
    logged = {a.path for a in client.list_artifacts(parent, "results")}
    assert {f"results/{TH.CACHE_POINTS}", f"results/{TH.CACHE_ALPHA_C}"} <= logged
