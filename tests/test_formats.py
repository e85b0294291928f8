"""CSVs as a paper needs them (formats.csv_ready): written, read back as text, and checked for units in the
headers, rounding, integers and ISO 8601 times, against values computed here."""
from __future__ import annotations

import csv
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from pefusion import record as R
from pefusion.analysis import formats as FM

LR = 0.0063219123456789012  # a sampled learning rate: a configuration value, kept to the last digit


def _read(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_sweep_rows_written_with_units_rounded_integers_and_iso_times(tmp_path):
    """The sweep's per-trial rows as the driver holds them (the record's fractions, Unix times, float epochs)."""
    started = 1_764_032_962.25
    rows = pd.DataFrame({
        "trial_id": ["a", "b"], "lr": [LR, 1e-3], R.STATUS: [R.STATUS_OK, R.STATUS_STOPPED],
        R.TEST_ACC: [0.258, np.nan], R.VAL_ACC: [0.671, 0.40], R.BEST_VAL_ACC: [0.671, 0.5],
        R.length_metric("le128"): [0.3333333333, np.nan], R.EPOCHS_RUN: [8.0, 3.0], R.BEST_EPOCH: [5.0, np.nan],
        R.PARAMS: [40868.0, 40868.0], R.LAT_MS_MEAN: [0.123456789, np.nan], R.TRAIN_TIME_S: [12.3456, 4.0],
        "started_at": [started, started + 60], "ended_at": [started + 30.5, np.nan]})
    assert 0.671 * 100 != 67.1  # what an unformatted CSV holds: 67.10000000000001
    out = _read(FM.write_csv(rows, tmp_path / "rows.csv"))
    assert list(out[0]) == ["trial_id", "lr", R.STATUS, "test_acc_pct", "val_acc_pct", "best_val_acc_pct",
                            "test_acc_len_le128_pct", R.EPOCHS_RUN, R.BEST_EPOCH, R.PARAMS, R.LAT_MS_MEAN,
                            R.TRAIN_TIME_S, "started_at", "ended_at"]
    a, b = out
    assert (a["test_acc_pct"], a["val_acc_pct"], a["test_acc_len_le128_pct"]) == ("25.8", "67.1", "33.33")
    assert b["test_acc_pct"] == "" and b["best_val_acc_pct"] == "50.0"
    assert (a[R.EPOCHS_RUN], b[R.EPOCHS_RUN], a[R.BEST_EPOCH], b[R.BEST_EPOCH]) == ("8", "3", "5", "")
    assert a[R.PARAMS] == "40868" and a[R.LAT_MS_MEAN] == "0.123" and a[R.TRAIN_TIME_S] == "12.35"
    assert float(a["lr"]) == LR  # never rounded
    iso = datetime.fromtimestamp(int(started), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert a["started_at"] == iso and a["ended_at"].endswith("Z") and b["ended_at"] == ""
    assert datetime.fromisoformat(b["started_at"]).timestamp() == int(started) + 60


def test_percent_and_points_columns_are_named_and_p_values_keep_two_figures(tmp_path):
    """Tables computed in percent and points get the unit in the header; p-values 2 significant figures, the
    student's errors 5."""
    table = pd.DataFrame({"fusion": ["concat"], "test_acc_mean": [25.799999999999997], "delta_mean": [1 / 3],
                          "ci95_low": [-2.0000001], "t_pvalue": [0.012345], "wilcoxon_pvalue": [0.25],
                          R.EPS_G: [0.00143341234], "n_pairs": [3.0]})
    (row,) = _read(FM.write_csv(table, tmp_path / "t.csv"))
    assert row == {"fusion": "concat", "test_acc_mean_pct": "25.8", "delta_mean_pp": "0.33", "ci95_low_pp": "-2.0",
                   "t_pvalue": "0.012", "wilcoxon_pvalue": "0.25", R.EPS_G: "0.0014334", "n_pairs": "3"}
