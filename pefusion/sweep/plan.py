"""What a sweep will cost, said before Ray starts (`--plan`, and the first lines of every sweep): its trials and runs,
the most epochs (or steps) a trial trains, and an estimate of its wall time and device-hours.

The study times its trials (`StudySweep.timer`: a few training steps of its largest trials on throwaway models, on
the device the trials will use); this module turns those seconds into the sweep's: how many trials run at once
(`trials_at_once`: CPUs per trial against the node's CPUs, GPUs per trial against its GPUs, --max-concurrent) and
the wall time of running them in Tune's order, each in the first slot to free (`makespan`). Around the trials' own
seconds, the command's wall time counts what the process spent before the sweep (Python's start, imports), what the
sweep has spent so far (the data; the timing where `--plan` kept none), Ray's start, each slot's first trial
process, the gap between two trials of a slot, each trial's final report, the sweep's end and Ray's shutdown as the
command exits, as a tiny sweep measured them on this machine (`pefusion.sweep.enginecost`; not on a joined cluster,
whose figures this machine cannot measure); the sweep's own wall, what it records, leaves out the first and the
last. Trials that share a card are counted as taking turns on it, so on GPUs the slots are the cards in use: an
upper bound, since 3 packed bf16 trials on an H200 reached 1.65x one trial's throughput (docs/benchmarks.md), a gain
measured for that one case only. Timed in a fresh process where the trials use a GPU, so that the driver never holds
the card; on a CPU in this process (`_in_this_process`), with the trial's thread count; a sweep takes the timing
`--plan` (or an earlier sweep of the same trials) made within a day, kept in the cache folder (`time_trials`). A
resumed sweep plans the trials it has left (`finished_configs`).

Device-hours: card-hours where the trials use GPUs (the wall time × the cards in use: what `record.CARD_HOURS`
measures), core-hours on CPUs (Σ trial seconds × CPUs per trial: the report's CPU-hours).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import heapq
import json
import math
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pefusion import cache_home
from pefusion import record as R
from pefusion.sweep.cluster import start_cluster
from pefusion.sweep.console import counted
from pefusion.sweep.enginecost import EngineCost, engine_cost, keep, kept, tune_env
from pefusion.sweep.gpus import in_fresh_process, local_node
from pefusion.sweep.options import SweepOptions, is_remote
from pefusion.sweep.space import Constant, Grid, Stack, grid_size
from pefusion.sweep.study import StudySweep, Timing


@dataclass(frozen=True)
class SweepPlan:
    """The estimate, and the lines that say it."""

    trials: int
    runs: int
    at_once: int
    wall_s: float  # the sweep's own, as it records it (`record.SWEEP_WALL_S`)
    command_s: float  # the command's: the process's start and Ray's shutdown as well
    device_hours: float
    unit: str  # card-hours | core-hours
    longest_s: float
    at_most: bool
    device: str
    lines: tuple[str, ...]
    testing_s: float = 0.0  # a trial's last phase, the mean over the trials left (`pefusion.sweep.progress`)

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


def makespan(seconds: Sequence[float], slots: int, first: float = 0.0) -> float:
    """The wall time of trials of `seconds`, started in order, each in the first of `slots` to free; each slot
    free after `first` seconds (its process's start)."""
    free = [first] * max(1, slots)
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


def time_trials(study: StudySweep, opts: SweepOptions, shipped: Mapping[str, Any], *, fresh: bool = True,
                cache: Path | None = None) -> Timing:
    """The study's timer run on the device the trials will use: the GPU in a fresh process where they get one and
    this machine has one, else this machine's CPU. Each timing is kept in pefusion's cache folder for a day (`enginecost.kept`),
    under what was timed (`timing_key`); with `fresh` False (a sweep, not `--plan`) a kept one is taken instead of
    timing again: the seconds a sweep would spend before Ray starts, and exactly the plan `--plan` printed."""
    timer, device, path = _timer(study, opts, shipped, cache)
    saved = None if fresh else kept(path)
    try:
        if saved is not None:
            values = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["timing"].items()}
            return Timing(**{**values, "kept_from": saved["measured_at"]})
    except (KeyError, TypeError, AttributeError):  # kept by a version with other fields
        pass
    timing = in_fresh_process(timer, "cuda") if device == "cuda" else _in_this_process(timer, "cpu")
    keep(path, {"measured_at": time.time(), "timing": dataclasses.asdict(timing)})
    return timing


def kept_timing(study: StudySweep, opts: SweepOptions, shipped: Mapping[str, Any],
                cache: Path | None = None) -> Path:
    """Where the timing of the trials of `study` under `opts` is kept (`time_trials`)."""
    return _timer(study, opts, shipped, cache)[2]


def _timer(study: StudySweep, opts: SweepOptions, shipped: Mapping[str, Any],
           cache: Path | None) -> tuple[Callable[[str], Timing], str, Path]:
    """The study's timer of the sweep's trials, the device it times on, and where its timing is kept."""
    import torch

    timer = study.timer(study.space.trial_points(), shipped)
    device = "cuda" if opts.gpus_per_trial > 0 and torch.cuda.is_available() else "cpu"
    return timer, device, (cache or cache_home()) / "plan_timing" / f"{timing_key(timer, device)}.json"


def timing_key(timer: Any, device: str) -> str:
    """What a timing depends on, hashed: the study's timer with everything it was given (the points, the preset,
    the data's samples and lengths, the threads; as it is pickled for a fresh process, which is the same bytes in
    every process of the same sweep) and the code of its module, the device, this machine and torch's version."""
    import pickle
    import sys

    import torch

    func = timer.func if isinstance(timer, functools.partial) else timer
    code = hashlib.sha256(Path(sys.modules[func.__module__].__file__ or "").read_bytes()).hexdigest()
    what = [hashlib.sha256(pickle.dumps(timer)).hexdigest(), code, device, socket.gethostname(), torch.__version__]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


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


def process_age() -> float | None:
    """Seconds since this process started (Linux's /proc), or None where that cannot be read."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def finished_configs(path: str) -> list[dict[str, Any]]:
    """The configs of the trials of the local experiment at `path` that ended (their last result has a final
    status): what a `--resume` does not run again. Read from Tune's trial folders (params.json, result.json)."""
    done = []
    for folder in Path(path).glob("*/"):
        params, results = folder / "params.json", folder / "result.json"
        if not (params.is_file() and results.is_file()):
            continue
        lines = results.read_text().strip().splitlines()
        try:
            last = json.loads(lines[-1]) if lines else {}
            if last.get(R.STATUS) in R.FINAL_STATUSES:
                done.append(json.loads(params.read_text()))
        except ValueError:
            continue
    return done


def make_plan(study: StudySweep, opts: SweepOptions, timing: Timing, *, cost: EngineCost | None = None,
              so_far: float = 0.0, before: float | None = None,
              finished: Sequence[Mapping[str, Any]] = ()) -> SweepPlan:
    """The sweep's estimate from its trials' `timing` and the resources of `opts` (its GPUs per trial resolved):
    with the engine's `cost` measured on this machine (None: a joined cluster's, not counted), `so_far` seconds the
    sweep has already run (its data, this timing: what its recorded wall time, `record.SWEEP_WALL_S`, counts),
    `before` seconds its process ran before the sweep began (Python's start, imports: in the command's wall, not
    the sweep's), and the configs of trials `finished` before (a resumed sweep: planned without them)."""
    trials = grid_size(study.space) * study.num_samples
    stacked = study.space.stacked_key()
    points = study.space.trial_points()
    grid = is_grid(study)
    # A search samples its trials from the space: each is counted at the mean over the points it can be (a choice's
    # values equally likely; a range's two ends)
    seconds = list(timing.seconds) if grid else [sum(timing.seconds) / len(timing.seconds)] * trials
    testing = list(timing.testing_s) or [0.0] * len(timing.seconds)
    testing = testing if grid else [sum(testing) / len(testing)] * trials
    if grid:
        left = [i for i, p in enumerate(points) if not any(_same_point(p, c) for c in finished)]
    else:
        left = list(range(max(trials - len(finished), 0)))
    seconds, testing = [seconds[i] for i in left], [testing[i] for i in left]
    n_left = len(left)
    runs = trials * (len(study.space[stacked].values) if stacked else 1)
    reasons = [r for r, holds in ((timing.ends_early, bool(timing.ends_early)),
                                  ("early stopping or a scheduler may end trials sooner",
                                   any(study.may_end_early(p) for p in points))) if holds]
    gpu = opts.gpus_per_trial > 0
    node = local_node(opts)
    at_once, cards = trials_at_once(opts.cpus_per_trial, opts.gpus_per_trial, node, opts.max_concurrent,
                                    max(n_left, 1))
    packed = gpu and opts.gpus_per_trial < 1 and at_once > cards
    if packed:
        reasons.append("trials sharing a card are counted as taking turns on it, though packed trials gain "
                       "(1.65x for 3 bf16 trials on an H200)")
    at_most = bool(reasons)
    slots = cards if gpu else at_once
    per_trial = cost.between_s + cost.report_s if cost else 0.0
    trials_s = makespan([s + per_trial for s in seconds], slots, cost.first_trial_s if cost else 0.0) if left else 0.0
    ray_s, end_s, shutdown_s = (cost.ray_start_s, cost.end_s - cost.shutdown_s, cost.shutdown_s) if cost else (0.0,) * 3
    wall = so_far + ray_s + trials_s + end_s  # what the sweep records as its own wall (`record.SWEEP_WALL_S`)
    command = (before or 0.0) + wall + shutdown_s  # the command's, from Python's start to its exit
    hours = wall * cards / 3600 if gpu else sum(seconds) * opts.cpus_per_trial / 3600
    unit = "card-hours" if gpu else "core-hours"
    bound = "at most " if at_most else ""

    what = f"{counted(trials, 'trial')}" + (f" ({counted(runs, 'run')}, {len(study.space[stacked].values)} stacked "
                                            f"per trial)" if stacked else "")
    if opts.resume:
        what += f", {n_left} left to run"
    why = f" ({'; '.join(reasons)})" if reasons else ""
    lines = [f"plan: {what} of {opts.sweep} --preset {study.preset}, {bound}{timing.budget}{why}"]
    ran_on = "a CPU, as the trials will" if not gpu else "a GPU, as the trials will"
    if gpu and not timing.device.startswith("cuda"):
        ran_on = "this driver's CPU: it sees no GPU, so the cluster's GPU trials may be much faster"
    where = f" (--address {opts.address}: timed on this driver's machine)" if opts.address else ""
    kinds = f"{counted(timing.kinds, 'kind')} of trial timed, " if timing.kinds else ""
    if timing.kept_from:
        kinds = f"at {time.strftime('%H:%M', time.localtime(timing.kept_from))} (the same trials' timing, kept a " \
                f"day), " + kinds
    last = f", of which its test and latency {duration(max(timing.testing_s))}" if any(timing.testing_s) else ""
    lines.append(f"plan: timed on {timing.device}, {ran_on}{where}: {kinds}the longest trial, {timing.trial}, "
                 f"{bound}{duration(max(timing.seconds))}{last}" + ("" if grid else f"; a sampled trial {bound}"
                                                                         f"{duration(seconds[0] if seconds else 0)} "
                                                                         f"on average"))
    if gpu:
        share = (f"{counted(at_once, 'trial')} at once on {counted(cards, 'GPU')} ({opts.gpus_per_trial:g} GPU per "
                 f"trial)")
    else:
        share = f"{counted(at_once, 'trial')} at once ({opts.cpus_per_trial:g} CPU per trial of {node['CPU']:g})"
    assumed = " (the cluster is not joined to plan: one node like this machine, or --max-concurrent)" \
        if opts.address else ""
    lines.append(f"plan: {share}{assumed}: wall {bound}{duration(command)} for the command, of which the sweep "
                 f"{bound}{duration(wall)} (what its parent run records as its own), {hours:.3g} {unit}")
    started = f"this process's start {duration(before)} (Python, imports), " if before else ""
    if cost:
        lines.append(f"plan: the command's wall is {started}the sweep so far {duration(so_far)} (the data; "
                     f"the trials' timing where --plan kept none), Ray's start {duration(ray_s)}, the trials {duration(trials_s)} (a slot's first trial "
                     f"process {duration(cost.first_trial_s)}, then {per_trial:.2f} s of Ray's per trial), the "
                     f"sweep's end {duration(end_s)} and Ray's shutdown {duration(shutdown_s)}; Ray's figures "
                     f"measured on this machine {cost.when()}")
    else:
        left_out = ("the cluster's start and Ray's per-trial overhead there are not in it" if opts.address else
                    "Ray's start, per-trial overhead and shutdown are not in it (not measured on this machine "
                    "today: --plan measures them)")
        lines.append(f"plan: the command's wall is {started}the sweep so far {duration(so_far)} and the trials "
                     f"{duration(trials_s)}: {left_out}")
    return SweepPlan(trials=trials, runs=runs, at_once=at_once, wall_s=wall, command_s=command, device_hours=hours,
                     unit=unit,
                     longest_s=max(timing.seconds), at_most=at_most, device=timing.device, lines=tuple(lines),
                     testing_s=sum(testing) / len(testing) if testing else 0.0)


def _same_point(point: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """Whether a trial's `config` (as Tune stored it: JSON) is the space's `point`."""
    return all(k in config and config[k] == (list(v) if isinstance(v, tuple) else v) for k, v in point.items())


def say_plan(study: StudySweep, opts: SweepOptions, shipped: Mapping[str, Any], start: float,
             path: str | None, measure: bool) -> SweepPlan | None:
    """Print the sweep's description, its stacking, and its plan (`make_plan`; None for a study that
    cannot time its trials): the engine's costs measured on this machine unless the sweep joins a cluster, and
    for a resumed sweep (its experiment at `path`) the trials it has left. `start`: the sweep's `time.monotonic()`
    at its start, from which its wall time is counted. `measure`: whether Ray's costs may be measured now (`--plan`)
    or only taken as `--plan` kept them (a sweep: a tiny Ray sweep before its own would cost more than it tells)."""
    line = study.describe(shipped)
    if line:
        print(line, flush=True)
    stacked = study.space.stacked_key()
    if stacked:
        values = study.space[stacked].values
        print(f"{stacked} {', '.join(map(str, values))} stacked: each of the {grid_size(study.space)} trials trains "
              f"its {len(values)} runs together, as one batched model", flush=True)
    if study.timer is None:
        return None
    timing_from = time.monotonic()
    timing = time_trials(study, opts, shipped, fresh=measure)
    at_once, _ = trials_at_once(opts.cpus_per_trial, opts.gpus_per_trial, local_node(opts), opts.max_concurrent,
                                grid_size(study.space) * study.num_samples)
    # Ray started as the sweep will start it (its dashboard or not), on a cluster of the slots' CPUs
    tiny = dataclasses.replace(opts, num_cpus=at_once, num_gpus=0, cpus_per_trial=1.0, gpus_per_trial=0.0,
                               max_concurrent=0, verbose=0)
    cost = None if opts.address else engine_cost(at_once, tune_env(), study.trainable.__module__,
                                                 functools.partial(start_cluster, tiny),
                                                 "dashboard" if opts.dashboard else "", measure_now=measure)
    finished = finished_configs(path) if opts.resume and path and not is_remote(opts) else []
    now, age = time.monotonic(), process_age()
    # `--plan`'s own timing and measuring are not the sweep's: it takes what they kept
    so_far = (timing_from if measure else now) - start
    plan = make_plan(study, opts, timing, cost=cost, so_far=so_far, before=age - (now - start) if age else None,
                     finished=finished)
    print("\n".join(plan.lines), flush=True)
    return plan
