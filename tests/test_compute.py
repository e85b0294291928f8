"""The report's compute section: per run speed, epoch time and peak memory, the sweep's wall time, GPU-hours and
CPU-hours from frames made here with hours worked out by hand, and the machine's utilisation figure from a parent
run's system metrics in a real sqlite MLflow store (drawn when they exist, absent otherwise)."""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import pytest

from pefusion import record as R
from pefusion.analysis import compute as CO
from pefusion.analysis import runs as RU
from pefusion.analysis.report.compute import compute_section
from pefusion.analysis.report.page import build_report

H200, CPU = "NVIDIA H200", "Intel(R) Xeon(R) CPU"
# Four runs: a whole trial on half a GPU; a stacked trial of two seeds on a quarter GPU, each run given half of it
# (0.125) and half its CPU; a CPU trial; and a run from before costs were recorded (no wall time, no share).
TRIALS = pd.DataFrame({
    RU.RUN_ID: ["ra", "rb", "rc", "rd", "re"], RU.TRIAL_ID: ["a", "b/seed=0", "b/seed=1", "d", "e"],
    R.STATUS: ["ok", "ok", "ok", "ok", "error"], R.PE_TYPE: ["rope"] * 5, R.SEED: [0, 0, 1, 2, 3],
    R.DEVICE_NAME: [H200, H200, H200, CPU, np.nan], R.PRECISION: ["bf16", "bf16", "bf16", "fp32", np.nan],
    R.GPU_SHARE: [0.5, 0.125, 0.125, 0.0, np.nan], R.CPU_SHARE: [2.0, 0.5, 0.5, 1.0, np.nan],
    R.WALL_S: [7200.0, 3600.0, 3600.0, 1800.0, np.nan],
    R.STARTED_AT: [1000.0, 2000.0, 2000.0, 7200.0, np.nan], R.ENDED_AT: [8200.0, 5600.0, 5600.0, 9000.0, np.nan],
})
# By hand: GPU-hours 7200 × 0.5 + 2 × 3600 × 0.125 = 4500 s = 1.25 h; CPU-hours (7200 × 2 + 2 × 3600 × 0.5 + 1800)
# / 3600 = 5.5; the sweep's wall time from the first start (1000) to the last end (9000): 8000 s.
GPU_HOURS, CPU_HOURS, SWEEP_WALL_S = 1.25, 5.5, 8000.0
# The parent run's record of what the sweep held: its command ran 9 000 s (Ray's start and the probe included) on a
# cluster of 2 GPUs: 9000 × 2 / 3600 = 5 card-hours, against the 1.25 GPU-hours its trials were given.
PARENT = {R.SWEEP_WALL_S: 9000.0, R.CLUSTER_GPUS: 2.0, R.CARD_HOURS: 5.0}
EPOCHS = pd.DataFrame({  # run a's two epochs (GPU: memory), run d's one (CPU: none), run e's one
    RU.RUN_ID: ["ra", "ra", "rd", "re"], R.EPOCH: [1, 2, 1, 1],
    R.TRAIN_SAMPLES_PER_S: [100.0, 300.0, 40.0, 10.0], R.TRAIN_TOKENS_PER_S: [1e4, 3e4, 4e3, 1e3],
    R.EPOCH_S: [2.0, 4.0, 9.0, 1.0], R.PEAK_MEM_ALLOC_MIB: [400.0, 300.0, np.nan, np.nan],
    R.PEAK_MEM_RESERVED_MIB: [500.0, 700.0, np.nan, np.nan]})


def test_compute_table_and_totals_by_hand():
    table = CO.compute_table(TRIALS, EPOCHS).set_index(RU.TRIAL_ID)
    a, d = table.loc["a"], table.loc["d"]
    assert (a[f"{R.TRAIN_SAMPLES_PER_S}_mean"], a[f"{R.TRAIN_TOKENS_PER_S}_mean"], a[f"{R.EPOCH_S}_mean"]) \
        == (200.0, 2e4, 3.0)
    assert (a[f"{R.PEAK_MEM_ALLOC_MIB}_max"], a[f"{R.PEAK_MEM_RESERVED_MIB}_max"], a[R.EPOCHS_RUN]) == (400, 700, 2)
    assert np.isnan(d[f"{R.PEAK_MEM_RESERVED_MIB}_max"]) and d[R.EPOCHS_RUN] == 1  # a CPU run holds no GPU memory
    assert (a[CO.GPU_HOURS], a[CO.CPU_HOURS], d[CO.GPU_HOURS], d[CO.CPU_HOURS]) == (1.0, 4.0, 0.0, 0.5)
    assert table.loc["b/seed=0", CO.GPU_HOURS] == 0.125 and table.loc["e", R.EPOCHS_RUN] == 1
    assert R.SEED in table and R.PE_TYPE not in table  # the keys that vary name the runs
    totals = CO.totals(TRIALS, table.reset_index(), PARENT)
    assert (totals.gpu_hours, totals.cpu_hours, totals.wall_s) == pytest.approx((GPU_HOURS, CPU_HOURS, SWEEP_WALL_S))
    assert (totals.sweep_wall_s, totals.cluster_gpus, totals.card_hours) == (9000.0, 2.0, 5.0)
    assert np.isnan(CO.totals(TRIALS, table.reset_index(), {}).card_hours)  # a parent run without them
    assert (totals.runs, totals.unpriced, totals.devices) == (5, 1, (H200, CPU))


def test_compute_section_writes_its_csv_and_draws_utilisation_only_from_system_metrics(tmp_path):
    """The section's CSV (through formats.csv_ready: hours to 3 significant figures, rates to 0.1) and its
    line; the utilisation figure with system metrics, none without."""
    no_system = pd.DataFrame(columns=["name", "timestamp", "value"])
    parts, written = compute_section(TRIALS, EPOCHS, no_system, PARENT, tmp_path)
    assert written == [tmp_path / "compute_runs.csv"]
    page = "\n".join(parts)
    assert "Sweep wall time 8000 s (2.22 h)" in page and "GPU-hours 1.25, CPU-hours 5.5" in page
    assert "Card-hours 5: " in page and "9000 s" in page and "the 2 GPUs" in page
    assert "Card-hours not recorded" in "\n".join(compute_section(TRIALS, EPOCHS, no_system, {}, tmp_path)[0])
    assert "1 runs recorded no wall time or share" in page and "data:image/png" not in page
    csv = pd.read_csv(written[0]).set_index(RU.TRIAL_ID)
    assert csv[CO.GPU_HOURS].sum() == pytest.approx(GPU_HOURS) and csv.loc["a", CO.CPU_HOURS] == 4.0

    system = pd.DataFrame({"name": [R.SYSTEM_CPU] * 3 + [R.system_gpu(0, R.GPU_UTILISATION)] * 3,
                           "timestamp": [0, 10_000, 20_000] * 2, "value": [50.0, 90.0, 70.0, 100.0, 95.0, 0.0]})
    parts, written = compute_section(TRIALS, EPOCHS, system, PARENT, tmp_path)
    assert written[-1] == tmp_path / "figures" / "utilisation.png" and written[-1].exists()
    assert sum("data:image/png" in p for p in parts) == 1 and html.escape(R.GPU_BUSY_LABEL) in "\n".join(parts)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """Two sweeps in a real sqlite store, one trial run each with two epochs of costs: the first's parent run has
    MLflow's system metrics (CPU and RAM), the second's none."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from pefusion.tracking.store import new_sqlite_store

    root = tmp_path_factory.mktemp("compute")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    new_sqlite_store(uri)  # (a copy of a migrated empty store: seconds faster than MLflow making one)
    client = MlflowClient(uri)
    exp = client.create_experiment("pe-fusion", artifact_location=(root / "art").as_uri())
    parents = []
    for system in (True, False):
        parent = client.create_run(exp, tags={R.TAG_ROLE: "sweep", R.TAG_SWEEP: "arxiv_grid"}).info.run_id
        if system:
            client.log_batch(parent, metrics=[Metric(name, v, 1_700_000_000_000 + 10_000 * i, i)
                                              for i, v in enumerate((20.0, 60.0, 40.0))
                                              for name in (R.SYSTEM_CPU, R.SYSTEM_RAM_MB)])
        client.log_batch(parent, metrics=[Metric(name, v, 0, 0) for name, v in PARENT.items()])
        client.set_terminated(parent, "FINISHED")
        trial = client.create_run(exp, tags={R.TAG_PARENT: parent, R.TAG_ROLE: "trial", R.TAG_TRIAL_ID: "t0",
                                             R.TAG_STATUS: R.STATUS_OK}).info.run_id
        epochs = [Metric(name, v, 0, step) for step, (rate, secs) in enumerate(((100.0, 2.0), (300.0, 4.0)), 1)
                  for name, v in ((R.TRAIN_SAMPLES_PER_S, rate), (R.EPOCH_S, secs), (R.WALL_S, 3.0 * step))]
        final = [Metric(name, v, 0, 0) for name, v in ((R.TEST_ACC, 0.5), (R.BEST_VAL_ACC, 0.5), (R.EPOCHS_RUN, 2),
                                                       (R.STARTED_AT, 100.0),
                                                       (R.ENDED_AT, 107.2))]
        params = [Param(k, str(v)) for k, v in ((R.DATASET, "synthetic"), (R.PE_TYPE, "rope"), (R.FUSION, "add"),
                                                (R.SEED, 0), (R.DEVICE_NAME, CPU), (R.GPU_SHARE, 0.0),
                                                (R.CPU_SHARE, 1.0))]
        # the final wall time one step past the epochs, as the recorder logs a final value of a series
        client.log_batch(trial, metrics=epochs + final + [Metric(R.WALL_S, 7.2, 0, 3)], params=params)
        client.set_terminated(trial, "FINISHED")
        parents.append(parent)
    return {"uri": uri, "system": parents[0], "none": parents[1]}


def test_the_report_reads_costs_and_system_metrics_from_mlflow(store, tmp_path):
    """From MLflow: the run's epochs (not its final wall_s one step past them), its hours from its final wall
    time, the sweep's wall time from its start and end, and the CPU's utilisation figure of the parent run's
    system metrics (RAM is not drawn)."""
    sweep = RU.load_sweep(store["uri"], "pe-fusion", store["system"])
    epochs = RU.epoch_points(sweep, CO.SERIES)
    assert list(epochs[R.EPOCH]) == [1, 2] and list(epochs[R.TRAIN_SAMPLES_PER_S]) == [100.0, 300.0]
    points = RU.system_points(sweep, CO.utilisation_names(sweep.parent_metrics))
    assert list(points["name"]) == [R.SYSTEM_CPU] * 3 and list(points["value"]) == [20.0, 60.0, 40.0]
    build_report(sweep, tmp_path, log_to_mlflow=False, theory=None)
    row = pd.read_csv(tmp_path / "compute_runs.csv").iloc[0]
    assert (row[f"{R.TRAIN_SAMPLES_PER_S}_mean"], row[f"{R.EPOCH_S}_mean"]) == (200.0, 3.0)
    assert (row[R.WALL_S], row[CO.CPU_HOURS], row[CO.GPU_HOURS]) == (7.2, 0.002, 0.0)
    page = next(tmp_path.glob("report_*.html")).read_text()
    assert "Sweep wall time 7 s" in page and "CPU-hours 0.002" in page and "Card-hours 5: " in page
    assert (tmp_path / "figures" / "utilisation.png").exists()


def test_a_parent_run_without_system_metrics_has_no_utilisation_figure(store, tmp_path):
    sweep = RU.load_sweep(store["uri"], "pe-fusion", store["none"])
    points = RU.system_points(sweep, CO.utilisation_names(sweep.parent_metrics))
    assert points.empty
    parts, written = compute_section(sweep.trials, RU.epoch_points(sweep, CO.SERIES), points, sweep.parent_metrics,
                                     tmp_path)
    assert written == [tmp_path / "compute_runs.csv"] and not any("data:image/png" in p for p in parts)
