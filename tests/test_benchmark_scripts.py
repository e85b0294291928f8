"""The benchmark scripts run end to end on tiny inputs and print the numbers the issues ask for (the speed
claims themselves are measured by running the scripts, never asserted here)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_bench_train_prints_the_three_rates_for_ours_and_the_notebook(tmp_path):
    data = tmp_path / "docs"
    _run(str(REPO / "scripts" / "bench_train.py"), "--make-data", str(data), "--n-docs", "40", "--n-eval", "16",
         "--max-words", "200", cwd=tmp_path)
    assert {p.name for p in data.iterdir()} == {"train_clean.jsonl", "validation_clean.jsonl", "test_clean.jsonl"}
    out = _run(str(REPO / "scripts" / "bench_train.py"), "--data-dir", str(data), "--max-len", "256", "--batch-size",
               "8", "--d-model", "16", "--nhead", "2", "--num-layers", "1", "--dim-ff", "32", "--pe-type",
               "sinusoidal", "--fusion", "gate_scalar", "--threads", "1", "--epochs", "1", "--json", cwd=tmp_path)
    (line,) = out.stdout.strip().splitlines()
    result = json.loads(line)
    for key in ("train_samples_per_s", "tokenize_samples_per_s", "data_samples_per_s", "train_gflops_per_s",
                "notebook_train_samples_per_s", "speedup_train_samples_per_s"):
        assert result[key] > 0, key
    assert result["n_train"] == 40 and 0 <= result["padding_fraction"] < result["notebook_padding_fraction"]


def test_bench_student_prints_the_three_comparisons_with_the_same_fit_result(tmp_path):
    out = _run(str(REPO / "scripts" / "bench_student.py"), "--d", "40", "--teacher-n", "50", "--iters", "30",
               "--naive-iters", "30", "--batch-iters", "30", cwd=tmp_path)
    teacher, fit, batched = (json.loads(line) for line in out.stdout.strip().splitlines())
    assert teacher["bench"] == "teacher_generation" and teacher["speedup_cpu"] > 0
    rounds = teacher["speedup_cpu_rounds"]  # the reported ratio is the median of the interleaved rounds
    assert len(rounds) == 3 and teacher["speedup_cpu"] == pytest.approx(sorted(rounds)[1], abs=0.06)
    # the fast fit and the einsum + DataLoader model reach the same weights and training loss
    assert fit["bench"] == "fit_5000_gd" and not fit["naive_extrapolated"] and fit["q_rel_diff"] < 1e-5
    assert abs(fit["eps_t_fast"] - fit["eps_t_naive"]) <= 1e-6 * fit["eps_t_naive"]
    assert batched["replicas"] == 30 and batched["one_cpu_s"] > 0 and batched["one_all_n_cpu_s"] > 0
    assert batched["ratio_cpu"] == pytest.approx(batched["batched_cpu_s"] / batched["one_cpu_s"], rel=2e-3)


def test_real_text_asha_check_ranks_rungs_against_the_best_epoch():
    """Three full curves ranked at epoch 1 against their best epochs: ASHA (keep the top third) would stop the
    eventual best at the first rung, and keeps it at epoch 3."""
    sys.path.insert(0, str(REPO))
    from benchmarks.real_text import asha_check

    curves = [[0.9, 0.5, 0.5, 0.6, 0.6], [0.8, 0.6, 0.7, 0.7, 0.7], [0.7, 0.7, 0.95, 0.9, 0.9]]  # best 0.9/0.7/0.95
    first, third = asha_check(curves, grace=1, eta=3)
    assert (first["rung_epoch"], first["curves"], first["best_survives"]) == (1, 3, False)
    assert first["spearman"] == pytest.approx(-0.5)  # ranks at epoch 1 (3, 2, 1) against best (2, 1, 3)
    assert (third["rung_epoch"], third["best_survives"]) == (3, True)
    assert third["spearman"] == pytest.approx(0.5)  # ranks at epoch 3 (1, 2, 3) against best (2, 1, 3)
    assert asha_check(curves[:2]) == []  # two curves rank nothing


def test_bench_sweep_splits_the_idle_slot_time_into_start_gaps_and_the_end_of_the_grid():
    """Four trials on two slots, wall 0 to 3.2 s, worked by hand: slot A runs [0.5, 2] then [2.1, 2.5], slot B
    [0.7, 1.5] then [1.6, 3]; idle before the first trials 0.5 + 0.7, between 0.1 + 0.1, at the end 0.7 + 0.2."""
    import pandas as pd

    sys.path.insert(0, str(REPO))
    from benchmarks.sweep import _overhead_per_trial, _slot_idle

    trials = pd.DataFrame({"started_at": [0.5, 0.7, 1.6, 2.1], "ended_at": [2.0, 1.5, 3.0, 2.5]})
    idle = _slot_idle(trials, wall_start=0.0, wall_s=3.2, concurrency=2)
    assert idle == pytest.approx({"start": 1.2 / 4, "between": 0.2 / 4, "end": 0.9 / 4})
    assert sum(idle.values()) == pytest.approx(_overhead_per_trial(3.2, 2, 4.1, 4))  # 4.1 s inside the trials


@pytest.mark.slow
def test_bench_real_text_prints_its_table_on_a_tiny_corpus(tmp_path):
    """Search, notebook settings, TF-IDF and the paper recipe on 60 short reviews with string labels."""
    import numpy as np
    import pandas as pd

    rng, data = np.random.default_rng(0), tmp_path / "reviews"
    data.mkdir()
    words = {"pos": ["great", "superb", "fine"], "neg": ["awful", "dull", "poor"]}
    for split, n in (("train", 60), ("validation", 20), ("test", 20)):
        labels = rng.choice(["pos", "neg"], n)
        texts = [" ".join(rng.choice(words[y] + ["the", "film"], 10)) for y in labels]
        pd.DataFrame({"text": texts, "label": labels}).to_json(data / f"{split}.jsonl", orient="records", lines=True)
    out = _run(str(REPO / "scripts" / "bench_real_text.py"), "--data-dir", str(data), "--quick", "--num-samples", "2",
               "--epochs", "2", "--d-model", "16", "--max-len", "32", "--workdir", str(tmp_path / "work"),
               "--json-out", str(tmp_path / "out.json"), cwd=tmp_path)
    result = json.loads((tmp_path / "out.json").read_text())
    assert [r["run"] for r in result["rows"]] == ["(a) search"] + ["(b) notebook"] * 5 + ["(c) tfidf + logreg",
                                                                                        "(d) paper recipe"]
    assert all(0 <= r["test_acc"] <= 1 for r in result["rows"]) and "| (a) search |" in out.stdout
    assert result["rows"][0]["trials"] == 2 and result["rows"][-1]["epochs"] == 2


def test_bench_plan_reads_the_plans_wall_times_back_from_its_lines():
    """The plan's printed durations, read back, are its figures to the precision it prints."""
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO))
    from benchmarks.plan import planned, seconds_of
    from pefusion.sweep.enginecost import EngineCost
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.plan import Timing, duration, make_plan
    from pefusion.sweep.space import Grid, SearchSpace

    for seconds in (0.4, 7.25, 45.0, 725.0, 12_000.0, 300_000.0):
        assert seconds_of(duration(seconds)) == pytest.approx(seconds, rel=0.02, abs=0.05)
    study = SimpleNamespace(space=SearchSpace({"seed": Grid((0, 1, 2))}, {}), num_samples=1, search_alg=None,
                            preset="demo", may_end_early=lambda point: True)
    timing = Timing(seconds=(100.0, 200.0, 300.0), device="cpu (test)", trial="t", budget="1 epoch per trial")
    cost = EngineCost(ray_start_s=5.0, first_trial_s=3.0, between_s=0.4, report_s=0.1, end_s=2.0, measured_at=0.0,
                      shutdown_s=1.5)
    plan = make_plan(study, SweepOptions(sweep="s", cpus_per_trial=1.0, gpus_per_trial=0.0, num_cpus=2, num_gpus=0),
                     timing, cost=cost, so_far=7.0, before=4.0)
    read = planned("\n".join(plan.lines))
    assert read["command_s"] == pytest.approx(plan.command_s, abs=0.5)
    assert read["sweep_s"] == pytest.approx(plan.wall_s, abs=0.5)
