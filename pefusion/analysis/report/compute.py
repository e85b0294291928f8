"""The compute section of any sweep's report: each run's speed, epoch time, peak memory, where it ran and its hours,
the sweep's totals in one line (with what `--plan` estimated beside what it took), and the machine's utilisation
over the sweep.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Mapping

import pandas as pd

from pefusion import record as R
from pefusion.analysis import compute as CO
from pefusion.analysis import formats as FM
from pefusion.analysis import runs as RU
from pefusion.analysis import search as SE
from pefusion.analysis.figures.canvas import save_figure
from pefusion.analysis.figures.utilisation import utilisation_figure
from pefusion.analysis.report.markup import image_html, table_html


def compute_line(totals: CO.Totals) -> str:
    """The sweep's cost in one line: its runs and devices, wall time, GPU-hours and CPU-hours (Σ wall × share),
    the card-hours it held (its wall time × its cluster's GPUs), and how each is counted."""
    wall = "not recorded" if pd.isna(totals.wall_s) else \
        f"{totals.wall_s:.0f} s ({totals.wall_s / 3600:.3g} h)"
    unpriced = f" {totals.unpriced} runs recorded no wall time or share and are left out of the hours." \
        if totals.unpriced else ""
    held = "Card-hours not recorded (a sweep that did not finish, or from before they were)." \
        if pd.isna(totals.card_hours) else \
        (f"Card-hours {totals.card_hours:.3g}: what renting the cluster cost, busy or not: the sweep command's wall "
         f"time, {totals.sweep_wall_s:.0f} s (Ray's start and the GPU probe included), × the {totals.cluster_gpus:g} "
         f"GPUs its Ray cluster had.")
    return (f"{totals.runs} runs on {', '.join(totals.devices) or 'devices not recorded'}. Sweep wall time {wall}, "
            f"from the first run's start to the last run's end (the trials' own clocks). GPU-hours "
            f"{totals.gpu_hours:.3g}, CPU-hours {totals.cpu_hours:.3g}: the sum over runs of wall × share ÷ 3600, "
            f"a run's wall summed over the processes that ran it (retries and resumes), its share the part of its "
            f"trial's GPUs or CPUs Ray gave it: the time the trials were given.{unpriced} {held}{plan_line(totals)}")


def plan_line(totals: CO.Totals) -> str:
    """What `--plan` estimated before the sweep started, beside what it measured (the command's wall time, which
    the estimate covers less Ray's start), or nothing where the parent run has no estimate."""
    if pd.isna(totals.plan_wall_s):
        return ""
    bound = "at most " if totals.plan_at_most else ""
    unit = "card-hours" if totals.gpu_hours > 0 else "core-hours"
    measured = "" if pd.isna(totals.sweep_wall_s) else \
        (f", against the {totals.sweep_wall_s:.0f} s the sweep command took "
         f"({totals.sweep_wall_s / totals.plan_wall_s:.2f}x the estimate)")
    return (f" Estimated before it started (--plan): wall {bound}{totals.plan_wall_s:.0f} s, {bound}"
            f"{totals.plan_device_hours:.3g} {unit}{measured}.")


def compute_section(trials: pd.DataFrame, epochs: pd.DataFrame, system: pd.DataFrame,
                    parent_metrics: Mapping[str, float], out: Path) -> tuple[list[str], list[Path]]:
    """The compute section and its files: per run its speed, epoch time, peak memory, where it ran and its hours
    (compute_runs.csv; `epochs`: runs.epoch_points of compute.SERIES), the sweep's totals (with the card time its
    parent run recorded, `parent_metrics`), and the machine's
    utilisation over the sweep when its parent run has system metrics (`system`: runs.system_points). Nothing
    when the runs recorded no cost and there are no system metrics."""
    table = CO.compute_table(trials, epochs)
    figure = utilisation_figure(system)
    if table.empty and figure is None:
        return [], []
    parts, written = ["<h2>Compute</h2>"], []
    if len(table):
        written.append(FM.write_csv(table, out / "compute_runs.csv"))
        parts.append(f"<p><b>{html.escape(compute_line(CO.totals(trials, table, parent_metrics)))}</b></p>")
        named = len(table.columns.intersection(SE.varied_keys(trials)))
        parts.append(table_html(FM.display(table, drop=(RU.TRIAL_ID,) if named else ()),
                                 "Per run: training samples and tokens per second and the epoch's seconds "
                                 "(training and validation), means over its epochs (an epoch trains on every "
                                 "training document once); the peak memory torch held on the GPU in any epoch "
                                 "(CUDA runs only); its wall time and hours."))
    if figure is not None:
        png = save_figure(figure, out / "figures", "utilisation")
        written.append(png)
        parts.append(image_html(png, "MLflow's system metrics of the sweep's parent run: the whole machine's CPU "
                                      f"and each GPU as NVML sees it, every process included. {R.GPU_BUSY_LABEL}."))
    return parts, written
