"""GPUs per trial: `--gpus-per-trial auto`, how many trials share one GPU, decided before Ray starts from a measured
peak (`resolve_gpus`); and whether a node can hold one trial's request of CPUs and GPUs (`check_resources`).

Ray divides a GPU's *scheduling* (0.25: four trials on one card), not its memory: four trials whose peaks do not
fit together end in CUDA out-of-memory errors. `auto` has the study measure the largest trial of the sweep on a
card (its probe) and packs as many trials per card as fit with a margin: `pack_trials`, a pure function of the
numbers. Where the probe runs is a `ProbeSite`: on this machine, a fresh process (`_in_fresh_process`), so that
the driver never holds the card the trials share; on a joined cluster (`--address`), a Ray task on a GPU node of
each kind of card, a label and a total memory (`pefusion.sweep.cluster.probe_on_cluster`), the driver needing no
GPU of its own, and the fraction is the one that fits the smallest card.

Assumed, and said in docs/gpus.md: a trial is one process on one card, and the cards of one kind are alike.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence

from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.sweep.options import AUTO, SweepOptions
from pefusion.sweep.study import CardMemory, GpuProbe, StudySweep

GIB = 1024 ** 3
# What a process holds on the card outside torch's caching allocator: the CUDA context, the cuBLAS/cuDNN handles
# and the kernels it loads. torch's memory statistics never count it (nvidia-smi does); a few hundred MiB per
# process is typical with CUDA 12's lazy module loading. Not measured here: an upper guess.
CONTEXT_BYTES = GIB // 2
# The share of the card left unplanned: the allocator's fragmentation growing over a long run, and batches the
# probe's random token ids do not reproduce exactly (the probe measures shapes, the longest batch).
MARGIN = 0.10
# Without MPS the processes on one card take turns on it, so past a few trials per card another one adds a CUDA
# context and memory pressure more than throughput. A guess, not a measurement: scripts/bench_gpu.py measures
# packings of 1, 2, 4 and 8.
MAX_PER_CARD = 8
# Ray counts resources in units of 0.0001 (ray_constants.MIN_RESOURCE_GRANULARITY): 1/K is rounded *down* to that,
# so that K trials still fit on one card.
RAY_RESOURCE_DECIMALS = 4


@dataclass(frozen=True)
class CardReading:
    """What the probe measured on one card: the largest trial's peak and which trial, the card's free and total
    bytes before the probe trained, its name, and the Ray node it is on ("" on this machine)."""

    peak: int
    trial: str
    free: int
    total: int
    card: str
    node: str = ""


# Where the probe runs: given the probe, the card reader and the points, one reading per kind of card (none: no GPU).
ProbeSite = Callable[[GpuProbe, CardMemory, Sequence[dict[str, Any]]], list[CardReading]]


@dataclass(frozen=True)
class Packing:
    """What `auto` decided: trials per card, the fraction Ray gets, and why (one line)."""

    per_card: int  # 0: the trials run on CPU
    gpus_per_trial: float
    reason: str


def _gib(n: float) -> str:
    n = float(n)
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2 ** 20:.0f} MiB"


def pack_trials(peak_bytes: int, card_bytes: int, *, margin: float = MARGIN, context_bytes: int = CONTEXT_BYTES,
                max_per_card: int = MAX_PER_CARD, trial: str = "one trial", card: str = "the card") -> Packing:
    """The largest K <= max_per_card with K * (peak_bytes + context_bytes) <= (1 - margin) * card_bytes, as
    gpus_per_trial = 1/K rounded down to Ray's 4 decimals (K = 3: 0.3333).

    A trial that does not fit even alone is refused with a ConfigError naming the fix: a sweep of out-of-memory
    errors would show it only after Ray started. `margin` is taken as the decimal it is written as (0.1 = 1/10),
    so the boundary K * per_trial == budget is exact.
    """
    per_trial = peak_bytes + context_bytes
    budget = Fraction(card_bytes) * (1 - Fraction(str(margin)))
    fit = int(budget // per_trial) if per_trial > 0 else max_per_card
    k = min(fit, max_per_card)
    peak = f"{trial} peaks at {_gib(peak_bytes)} + {_gib(context_bytes)} CUDA context = {_gib(per_trial)}"
    room = f"{_gib(budget)} ({100 * (1 - margin):g} % of {_gib(card_bytes)} on {card})"
    if k < 1:
        raise ConfigError(f"--gpus-per-trial auto: {peak}, more than {room}: shrink the largest trial (its batch "
                          f"size or sequence length; bf16 halves activations) or pass --gpus-per-trial 1 to give "
                          f"it the whole card without the margin")
    scale = 10 ** RAY_RESOURCE_DECIMALS
    gpus = math.floor(scale / k) / scale
    capped = f" (the cap; {fit} would fit)" if fit > max_per_card else ""
    per = "1 trial" if k == 1 else f"{k} trials"
    return Packing(k, gpus, f"{gpus:g} GPU per trial, {per} per card{capped}: {peak}; {k} x {_gib(per_trial)} "
                            f"fits in {room}")


def auto_packing(probe: GpuProbe | None, points: Sequence[dict[str, Any]], *, sweep: str, remote: bool,
                 declared_gpus: float | None, card: CardMemory | None = None,
                 site: ProbeSite | None = None) -> Packing:
    """What `--gpus-per-trial auto` means for this sweep, measured by `probe` on a `card` where `site` runs it
    (default: this machine's GPU, in a fresh process).

    No probe (the study never uses a GPU), a local cluster declared without GPUs (--num-gpus 0), no CUDA device
    visible here (locally), or a joined cluster (`remote`) whose site finds no GPU node: no GPU. Several kinds of
    card: the fraction that fits the smallest.
    """
    if probe is None:
        return Packing(0, 0.0, f"the {sweep} trials do not use a GPU; trials run on CPU")
    if declared_gpus == 0 and not remote:
        return Packing(0, 0.0, "--num-gpus 0 declares no GPU on the local cluster; trials run on CPU")
    card = card or cuda_card
    if site is None:
        import torch

        if not torch.cuda.is_available():
            return Packing(0, 0.0, "no GPU visible on this machine; trials run on CPU")
        print("--gpus-per-trial auto: measuring the sweep's largest trial on this machine's GPU ...", flush=True)
        site = _in_fresh_process
    readings = site(probe, card, points)
    if not readings:
        return Packing(0, 0.0, "the cluster has no GPU; trials run on CPU")
    return fit_smallest(readings)


def fit_smallest(readings: Sequence[CardReading]) -> Packing:
    """The packing of each kind of card measured, and the one that fits the smallest (the fewest trials per card),
    its line naming where it was measured and, with several kinds, what each would hold."""
    packings = []
    for r in readings:
        # The probe's own context was on the card when it read `free`; the trials will have the card without it.
        usable = min(r.total, r.free + CONTEXT_BYTES)
        held = f", {_gib(r.total - usable)} of its {_gib(r.total)} held by other processes" \
            if r.total - usable > GIB else ""
        packings.append(pack_trials(r.peak, usable, trial=r.trial, card=r.card + held))
    chosen = min(range(len(readings)), key=lambda i: (packings[i].per_card, i))
    where = [f"{r.card} on node {r.node}" for r in readings if r.node]
    said = packings[chosen].reason + (f"; measured on {', '.join(where)}" if where else "")
    if len(readings) > 1:
        said += "; the smallest card's fraction (" + ", ".join(
            f"{r.card}: {p.per_card} per card" for r, p in zip(readings, packings)) + ")"
    return dataclasses.replace(packings[chosen], reason=said)


def in_fresh_process(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a spawned process (fn and args must pickle): its CUDA context and the memory its allocator
    caches end with it, so the driver never holds the card its trials share."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def cuda_card() -> tuple[int, int, str]:
    """The current CUDA device's free and total bytes, and its name."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return free, total, torch.cuda.get_device_name()


def _in_fresh_process(probe: GpuProbe, card: CardMemory, points: Sequence[dict[str, Any]]) -> list[CardReading]:
    """`measure` in a spawned process (`in_fresh_process`)."""
    return [out_of_memory_refused(lambda: in_fresh_process(measure, probe, card, list(points)))]


def out_of_memory_refused(result: Callable[[], CardReading]) -> CardReading:
    """`result()`, a probe's reading, with CUDA's out-of-memory error (the trial alone is larger than the card) as
    a one-line ConfigError."""
    import torch

    try:
        return result()
    except torch.cuda.OutOfMemoryError as exc:
        # From a Ray task the error is Ray's wrapper (its first line `ray::_measure_on_node() (pid=..)`, in colour
        # codes); CUDA's own message is its cause.
        cause = getattr(exc, "cause", None)
        said = str(cause if isinstance(cause, torch.cuda.OutOfMemoryError) else exc).strip().splitlines()
        raise ConfigError(f"--gpus-per-trial auto: {said[0] if said else 'CUDA out of memory'}: shrink the largest "
                          f"trial (its batch size or sequence length; bf16 halves activations)") from None


def measure(probe: GpuProbe, card: CardMemory, points: list[dict[str, Any]], node: str = "") -> CardReading:
    """The card's reading before the probe trains, then the probe's, where this runs (`node`: its Ray node)."""
    free, total, name = card()
    peak, trial = probe(points)
    return CardReading(peak, trial, free, total, name, node)


def resolve_gpus(study: StudySweep, opts: SweepOptions, site: ProbeSite | None = None) -> SweepOptions:
    """`opts` with `--gpus-per-trial auto` (typed, or the flag left out) replaced by the fraction it means where
    `site` runs the probe (None: this machine), printed and tagged on the parent run with its reason; a number as
    it is. Left out for a study whose trials never use a GPU: no GPU, and nothing to say."""
    if opts.gpus_per_trial is None and study.gpu_probe is None:
        return dataclasses.replace(opts, gpus_per_trial=0.0)
    if opts.gpus_per_trial not in (AUTO, None):
        return opts
    explicit = opts.gpus_per_trial == AUTO
    packing = auto_packing(study.gpu_probe, study.space.trial_points(), sweep=study.sweep, remote=bool(opts.address),
                           declared_gpus=opts.num_gpus, card=study.gpu_card, site=site)
    print(f"--gpus-per-trial auto{'' if explicit else ' (the default)'}: {packing.reason}", flush=True)
    return dataclasses.replace(opts, gpus_per_trial=packing.gpus_per_trial,
                               tags={**opts.tags, R.TAG_GPUS_PER_TRIAL: f"{packing.gpus_per_trial:g}",
                                     R.TAG_GPUS_AUTO: packing.reason})


def unfit_request(cpus: float, gpus: float, nodes: list[Mapping[str, float]], *, local: bool) -> str | None:
    """Why no node of `nodes` (their Ray resources) can ever hold one trial's request, or None if one can.

    A pure function of what Ray reports, so the message is testable without a cluster of that shape.
    """
    most_cpus = max((n.get("CPU", 0.0) for n in nodes), default=0.0)
    most_gpus = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    declare = "--num-gpus N" if local else "`ray start --num-gpus N` on a node"
    if gpus > 0 and most_gpus == 0:
        return (f"--gpus-per-trial {gpus:g} but the cluster has no GPU; declare logical GPUs with {declare} "
                f"or leave the flag out")
    if gpus > most_gpus:
        return f"--gpus-per-trial {gpus:g} but the largest node has {most_gpus:g} GPUs; lower --gpus-per-trial"
    if cpus > most_cpus:
        more = "--num-cpus N" if local else "a node with more CPUs"
        return (f"--cpus-per-trial {cpus:g} but the largest node has {most_cpus:g} CPUs; lower --cpus-per-trial "
                f"or declare more with {more}")
    if not any(n.get("CPU", 0.0) >= cpus and n.get("GPU", 0.0) >= gpus for n in nodes):
        return (f"--cpus-per-trial {cpus:g} with --gpus-per-trial {gpus:g}: no node has both (nodes: "
                + ", ".join(f"{n.get('CPU', 0):g} CPU/{n.get('GPU', 0):g} GPU" for n in nodes) + ")")
    return None


def local_node(opts: SweepOptions) -> dict[str, float]:
    """What the local cluster this command would start declares: --num-cpus/--num-gpus, else this machine's."""
    gpus = opts.num_gpus
    if gpus is None:
        import torch  # Ray counts the GPUs CUDA shows; torch asks the same driver without starting a cluster

        gpus = torch.cuda.device_count()
    return {"CPU": float(opts.num_cpus or os.cpu_count() or 1), "GPU": float(gpus)}


def check_resources(opts: SweepOptions, nodes: list[Mapping[str, float]]) -> None:
    """Refuse, before any trial starts, a per-trial request that no node of `nodes` can ever hold (Ray would
    wait for it forever); with `--autoscaling` the wait is the cluster's to end."""
    if opts.autoscaling:
        return
    why = unfit_request(opts.cpus_per_trial, opts.gpus_per_trial, nodes, local=not opts.address)
    if why:
        raise ConfigError(why + ("" if not opts.address else " (pass --autoscaling if the cluster adds nodes)"))
