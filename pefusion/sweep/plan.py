"""What a sweep will cost, said before Ray starts (`--plan`, and the first lines of every sweep): its trials and
runs, the most epochs (or steps) a trial trains, and an estimate of its wall time and device-hours.

The study times its trials (`StudySweep.timer`: a few training steps of its largest trials on throwaway models,
on the device the trials will use); this module turns those seconds into the sweep's: how many trials run at once
(`trials_at_once`: CPUs per trial against the node's CPUs, GPUs per trial against its GPUs, --max-concurrent) and
the wall time of running them in Tune's order, each in the first slot to free (`makespan`). Trials that share a
card time-slice it (packed trials reached the same samples/s as one alone on an H200, docs/gpus.md), so on GPUs
the slots are the cards in use. Timed in a fresh process where the trials use a GPU, so that the driver never
holds the card; on a CPU in this process (`_in_this_process`), with the trial's thread count.

Device-hours: card-hours where the trials use GPUs (the wall time × the cards in use: what `record.CARD_HOURS`
measures), core-hours on CPUs (Σ trial seconds × CPUs per trial: the report's CPU-hours).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pefusion import record as R
from pefusion.sweep.console import counted
from pefusion.sweep.gpus import in_fresh_process, local_node
from pefusion.sweep.space import Constant, Grid, Stack, grid_size

if TYPE_CHECKING:
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.study import StudySweep


@dataclass(frozen=True)
class Timing:
    """What a study's timer measured (`StudySweep.timer`)."""

    seconds: tuple[float, ...]  # per point it was given: the trial's seconds at its whole budget
    device: str  # what was timed, e.g. "cpu (AMD EPYC 7B13, 1 thread)", "cuda (NVIDIA H200)"
    trial: str  # the longest trial, in words
    budget: str  # the most a trial trains, e.g. "20 epochs per trial", "5000 steps per fit"
    ends_early: str = ""  # the study's own reason a trial may train less, e.g. "GD ends a fit at a fixed point"


@dataclass(frozen=True)
class SweepPlan:
    """The estimate, and the lines that say it."""

    trials: int
    runs: int
    at_once: int
    wall_s: float
    device_hours: float
    unit: str  # card-hours | core-hours
    longest_s: float
    at_most: bool
    device: str
    lines: tuple[str, ...]

    def metrics(self) -> dict[str, float]:
        return {R.PLAN_WALL_S: self.wall_s, R.PLAN_DEVICE_HOURS: self.device_hours, R.PLAN_TRIAL_S: self.longest_s,
                R.PLAN_CONCURRENT: float(self.at_once), R.PLAN_AT_MOST: float(self.at_most)}

    def tags(self) -> dict[str, str]:
        return {R.TAG_PLAN: "\n".join(self.lines), R.TAG_PLAN_DEVICE: self.device, R.TAG_PLAN_UNIT: self.unit}


def trials_at_once(cpus_per_trial: float, gpus_per_trial: float, node: Mapping[str, float], max_concurrent: int,
                   trials: int) -> tuple[int, int]:
    """(trials at once, cards they use) on `node` (Ray's resources of one node): as many as its CPUs and GPUs hold
    at the per-trial request, at most `max_concurrent` (0: no limit) and `trials`, at least 1."""
    fits = [math.floor(node.get("CPU", 1.0) / cpus_per_trial + 1e-9)]
    if gpus_per_trial > 0:
        fits.append(math.floor(node.get("GPU", 0.0) / gpus_per_trial + 1e-9))
    if max_concurrent:
        fits.append(max_concurrent)
    at_once = max(1, min(*fits, trials))
    cards = min(math.ceil(at_once * gpus_per_trial - 1e-9), math.ceil(node.get("GPU", 0.0))) if gpus_per_trial else 0
    return at_once, max(cards, 1) if gpus_per_trial else 0


def makespan(seconds: Sequence[float], slots: int) -> float:
    """The wall time of trials of `seconds`, started in order, each in the first of `slots` to free."""
    free = [0.0] * max(1, slots)
    for s in seconds:
        heapq.heappush(free, heapq.heappop(free) + s)
    return max(free)


def duration(seconds: float) -> str:
    """'0.4 s', '45 s', '12 min 5 s', '3 h 20 min', '2.5 days'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {seconds % 60:.0f} s"
    if seconds < 48 * 3600:
        return f"{int(seconds // 3600)} h {(seconds % 3600) / 60:.0f} min"
    return f"{seconds / 86400:.1f} days"


def is_grid(study: StudySweep) -> bool:
    """Whether the sweep's trials are exactly its space's points (a grid, run once): a search samples its trials."""
    return study.num_samples == 1 and study.search_alg is None and all(
        isinstance(d, (Grid, Constant, Stack)) for d in study.space.values())


def time_trials(study: StudySweep, opts: SweepOptions, shipped: Mapping[str, Any]) -> Timing:
    """The study's timer run on the device the trials will use: the GPU in a fresh process where they get one and
    this machine has one, else this machine's CPU."""
    points = study.space.trial_points()
    timer = study.timer(points, shipped)
    import torch

    if opts.gpus_per_trial > 0 and torch.cuda.is_available():
        return in_fresh_process(timer, "cuda")
    return _in_this_process(timer, "cpu")


def _in_this_process(timer: Callable[[str], Timing], device: str) -> Timing:
    """timer(device), this process left as it was: the random states its models seed (Ray's random search samples
    from numpy's global one in this process) and torch's thread count."""
    import random

    import numpy as np
    import torch

    state = random.getstate(), np.random.get_state(), torch.get_rng_state(), torch.get_num_threads()
    try:
        return timer(device)
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
        torch.set_num_threads(state[3])


def make_plan(study: StudySweep, opts: SweepOptions, timing: Timing) -> SweepPlan:
    """The sweep's estimate from its trials' `timing` and the resources of `opts` (its GPUs per trial resolved)."""
    trials = grid_size(study.space) * study.num_samples
    stacked = study.space.stacked_key()
    runs = trials * (len(study.space[stacked].values) if stacked else 1)
    points = study.space.trial_points()
    grid = is_grid(study)
    # A search samples its trials from the space: each is counted at the mean over the points it can be (a choice's
    # values equally likely; a range's two ends)
    seconds = list(timing.seconds) if grid else [sum(timing.seconds) / len(timing.seconds)] * trials
    reasons = [r for r, holds in ((timing.ends_early, bool(timing.ends_early)),
                                  ("early stopping or a scheduler may end trials sooner",
                                   any(study.may_end_early(p) for p in points))) if holds]
    at_most = bool(reasons)
    node = local_node(opts)
    at_once, cards = trials_at_once(opts.cpus_per_trial, opts.gpus_per_trial, node, opts.max_concurrent, trials)
    gpu = opts.gpus_per_trial > 0
    wall = makespan(seconds, cards if gpu else at_once)
    hours = wall * cards / 3600 if gpu else sum(seconds) * opts.cpus_per_trial / 3600
    unit = "card-hours" if gpu else "core-hours"
    bound = "at most " if at_most else ""

    what = f"{counted(trials, 'trial')}" + (f" ({counted(runs, 'run')}, {len(study.space[stacked].values)} stacked "
                                            f"per trial)" if stacked else "")
    why = f" ({'; '.join(reasons)})" if reasons else ""
    lines = [f"plan: {what} of {opts.sweep} --preset {study.preset}, {bound}{timing.budget}{why}"]
    ran_on = "a CPU, as the trials will" if not gpu else "a GPU, as the trials will"
    if gpu and not timing.device.startswith("cuda"):
        ran_on = "this driver's CPU: it sees no GPU, so the cluster's GPU trials may be much faster"
    where = f" (--address {opts.address}: timed on this driver's machine)" if opts.address else ""
    lines.append(f"plan: timed on {timing.device}, {ran_on}{where}: the longest trial, {timing.trial}, "
                 f"{bound}{duration(max(timing.seconds))}" + ("" if grid else f"; a sampled trial {bound}"
                                                                      f"{duration(seconds[0])} on average"))
    if gpu:
        share = (f"{counted(at_once, 'trial')} at once on {counted(cards, 'GPU')} ({opts.gpus_per_trial:g} GPU per "
                 f"trial; trials sharing a card time-slice it)")
    else:
        share = f"{counted(at_once, 'trial')} at once ({opts.cpus_per_trial:g} CPU per trial of {node['CPU']:g})"
    assumed = " (the cluster is not joined to plan: one node like this machine, or --max-concurrent)" \
        if opts.address else ""
    lines.append(f"plan: {share}{assumed}: wall {bound}{duration(wall)}, {hours:.3g} {unit}")
    return SweepPlan(trials=trials, runs=runs, at_once=at_once, wall_s=wall, device_hours=hours, unit=unit,
                     longest_s=max(timing.seconds), at_most=at_most, device=timing.device, lines=tuple(lines))
