"""What a sweep cost: per run its training speed, epoch time and peak memory, where it ran and its share of the
resources; for the sweep its wall time, GPU-hours and CPU-hours, and the card-hours it held.

Pure functions over the trial frame of pefusion.analysis.runs (final values, params) and the runs' per-epoch
points (`runs.epoch_points`). A run's hours are its wall seconds over every process that ran it (`wall_s`:
retries and resumes each counted once, up to their last checkpoint) times the share of the trial's GPUs or CPUs
it was given (a stacked trial's runs split them, so the sum counts each trial once), over 3600. The card-hours
are what renting the cluster cost, busy or not: the sweep command's wall time times its cluster's GPUs, as its
parent run recorded them (`record.CARD_HOURS`); beside them what `--plan` estimated before the sweep started
(`record.PLAN_WALL_S`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping

import pandas as pd

from pefusion import record as R
from pefusion.analysis.runs import RUN_ID, TRIAL_ID, column
from pefusion.analysis.search import varied_keys

# The per-epoch series the table summarises, and how: rates and epoch time by their mean over epochs, memory by
# its peak. The columns are named <series>_mean or _max.
MEAN_SERIES = (R.TRAIN_SAMPLES_PER_S, R.TRAIN_TOKENS_PER_S, R.EPOCH_S)
MAX_SERIES = (R.PEAK_MEM_ALLOC_MIB, R.PEAK_MEM_RESERVED_MIB)
SERIES = MEAN_SERIES + MAX_SERIES
GPU_HOURS, CPU_HOURS = "gpu_hours", "cpu_hours"


def compute_table(trials: pd.DataFrame, epochs: pd.DataFrame) -> pd.DataFrame:
    """One row per run of `trials` that recorded any cost: trial_id, the config keys that vary, status, where it
    ran (device name, precision, GPU and CPU share), epochs, the mean over its epochs of samples/s, tokens/s and
    epoch seconds, its peak memory (CUDA runs only), its wall seconds and GPU- and CPU-hours.

    `epochs`: one row per (run_id, epoch) with a column per name of SERIES the runs have (runs.epoch_points)."""
    per_run = epochs.groupby(RUN_ID)
    summary = pd.DataFrame(index=pd.Index(trials[RUN_ID].unique(), name=RUN_ID))
    for name in SERIES:
        if name in epochs and epochs[name].notna().any():
            how = "mean" if name in MEAN_SERIES else "max"
            summary[f"{name}_{how}"] = per_run[name].agg(how)
    where = [k for k in (R.DEVICE_NAME, R.PRECISION, R.GPU_SHARE, R.CPU_SHARE) if k in trials]
    keys = [k for k in varied_keys(trials) if k not in where]
    out = trials[[RUN_ID, TRIAL_ID, *keys, R.STATUS, *where]].join(summary, on=RUN_ID)
    out[R.EPOCHS_RUN] = out[RUN_ID].map(per_run.size()).astype("Int64")
    wall = column(trials, R.WALL_S).astype(float)
    out[R.WALL_S] = wall
    out[GPU_HOURS] = wall * column(trials, R.GPU_SHARE).astype(float) / 3600
    out[CPU_HOURS] = wall * column(trials, R.CPU_SHARE).astype(float) / 3600
    measured = [c for c in out if c.endswith(("_mean", "_max"))] + [R.WALL_S]
    out = out[out[measured].notna().any(axis=1)].sort_values(TRIAL_ID, kind="stable")  # (Tune's order)
    return out.drop(columns=RUN_ID).reset_index(drop=True)


@dataclass(frozen=True)
class Totals:
    """What the sweep's runs cost together."""

    runs: int  # runs in the table
    wall_s: float  # from the first run's start to the last run's end (their own clocks); nan when none recorded
    gpu_hours: float  # Σ wall_s × gpu_share / 3600 over the runs that recorded both
    cpu_hours: float  # the same with cpu_share
    unpriced: int  # runs of the table without a wall time or a share: left out of the hours
    devices: tuple[str, ...]  # the device names the runs name
    # What the sweep held, from its parent run (nan where it recorded none): the command's wall seconds, Ray's start
    # and the probe included; the cluster's GPUs; their product / 3600, summed over invocations.
    sweep_wall_s: float
    cluster_gpus: float
    card_hours: float
    # What `--plan` estimated before the sweep started (nan where its parent run has no estimate): its wall seconds,
    # device-hours (card-hours where trials used GPUs, else core-hours) and whether it was an upper bound.
    plan_wall_s: float = float("nan")
    plan_device_hours: float = float("nan")
    plan_at_most: bool = False


def totals(trials: pd.DataFrame, table: pd.DataFrame, parent_metrics: Mapping[str, float]) -> Totals:
    """The sweep's wall time from `trials` (the runs' started_at and ended_at), its hours from `table`
    (compute_table), and the card time it held from its parent run's metrics."""
    start, end = column(trials, R.STARTED_AT).min(), column(trials, R.ENDED_AT).max()
    priced = table[[R.WALL_S, GPU_HOURS, CPU_HOURS]].notna().all(axis=1) if len(table) else pd.Series(dtype=bool)
    names = column(table, R.DEVICE_NAME).dropna().astype(str)
    return Totals(runs=len(table), wall_s=float(end - start), gpu_hours=float(table.loc[priced, GPU_HOURS].sum()),
                  cpu_hours=float(table.loc[priced, CPU_HOURS].sum()), unpriced=int((~priced).sum()),
                  devices=tuple(dict.fromkeys(names)),
                  **{k: float(parent_metrics.get(name, float("nan"))) for k, name in (
                      ("sweep_wall_s", R.SWEEP_WALL_S), ("cluster_gpus", R.CLUSTER_GPUS),
                      ("card_hours", R.CARD_HOURS), ("plan_wall_s", R.PLAN_WALL_S),
                      ("plan_device_hours", R.PLAN_DEVICE_HOURS))},
                  plan_at_most=bool(parent_metrics.get(R.PLAN_AT_MOST, 0.0)))


def utilisation_names(names: Collection[str]) -> list[str]:
    """Of a parent run's metric names, the ones the utilisation figure draws: the machine's CPU and each GPU's
    busy time, in percent (MLflow's system metrics, `record.SYSTEM_CPU`, `record.system_gpu`)."""
    gpus = sorted(n for n in names if n.startswith(R.SYSTEM_PREFIX + "gpu_") and n.endswith("_" + R.GPU_UTILISATION))
    return [n for n in (R.SYSTEM_CPU, *gpus) if n in names]
