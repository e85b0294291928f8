"""What a study hands the engine for one sweep (`StudySweep`), and what the engine reads off it, with the shapes of
what its GPU probe and its timer give (`GpuProbe`, `CardMemory`, `Timing`): plain values on the engine's bottom
floor, which the floors that measure and plan read.

Everything study-specific lives here as data: the MLflow experiment, the trainable and what it is shipped, the
search space, the optimised metric and mode, how a trial is named, identified and shown in the progress lines.
The engine (`pefusion.sweep`) and the recording below it (`pefusion.tracking`) name no metric and no experiment of
their own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from pefusion.sweep.space import Choice, Constant, Grid, SearchSpace


# The study's probe: given the points the sweep's trials can be (`SearchSpace.trial_points()`), the peak GPU memory
# in bytes that the largest of their trials holds (torch's reserved memory) on the current CUDA device, and which
# trial that is, in words. The engine runs it in a spawned process, so it must pickle: a module-level function or a
# functools.partial of one.
GpuProbe = Callable[[Sequence[dict[str, Any]]], tuple[int, str]]
# The card the probe measures on: its free and total bytes and its name (`pefusion.sweep.gpus.cuda_card`: the
# current CUDA device). A
# study could only replace it where its trials see a card another way; the engine never calls CUDA itself.
CardMemory = Callable[[], tuple[int, int, str]]


@dataclass(frozen=True)
class Timing:
    """What a study's timer measured (`StudySweep.timer`)."""

    seconds: tuple[float, ...]  # per point it was given: the trial's seconds at its whole budget
    device: str  # what was timed, e.g. "cpu (AMD EPYC 7B13, 1 thread)", "cuda (NVIDIA H200)"
    trial: str  # the longest trial, in words
    budget: str  # the most a trial trains, e.g. "20 epochs per trial", "5000 steps per fit"
    ends_early: str = ""  # the study's own reason a trial may train less, e.g. "GD ends a fit at a fixed point"
    testing_s: tuple[float, ...] = ()  # per point, of its seconds: its last phase after training (test, latency)
    kinds: int = 0  # the kinds of trial timed (0: not said)
    kept_from: float = 0.0  # Unix seconds of the timing a sweep took from the cache (`time_trials`); 0: timed now


@dataclass(frozen=True)
class StudySweep:
    """What a study hands the engine for one sweep."""

    sweep: str  # the command's name: arxiv_grid | lr_batch_asha | lambda_cv | phase_diagram
    preset: str
    experiment: str  # the study's MLflow experiment (`--experiment` overrides it)
    space: SearchSpace
    trainable: Callable[..., None]
    # The trainable's keyword arguments, built after validation (loading a corpus can take minutes) and put in
    # Ray's object store once for every trial (tune.with_parameters).
    ship: Callable[[], Mapping[str, Any]]
    check_point: Callable[[dict[str, Any]], None]  # a ConfigError for a trial config that cannot run
    static_params: Mapping[str, Any]  # recorded on every child run beside its config
    identity: Mapping[str, Any]  # values of the identity columns for trials whose config does not set them
    sort_keys: Sequence[str]
    run_name: Callable[[dict[str, Any]], str]
    # The progress line of a trial that ended shows the first of these record keys it has, formatted, e.g.
    # {TEST_ACC: lambda v: f"test {100 * v:.1f} %", ...}: a trial the scheduler stopped has no test accuracy.
    shown: Mapping[str, Callable[[float], str]] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)  # short names of searched keys in progress lines
    # The epochs a trial of this config trains at most (its budget: a preset's max_epochs, a scheduler's), from
    # which the progress lines estimate the time left until trials have ended; None: the study's trials report no
    # epochs (the estimate then waits for the first trial to end). `may_end_early`: whether such a trial may end
    # sooner (early stopping, a scheduler that stops trials), which makes that estimate an upper bound.
    planned_epochs: Callable[[dict[str, Any]], int] | None = None
    may_end_early: Callable[[dict[str, Any]], bool] = lambda config: False
    describe: Callable[[Mapping[str, Any]], str] = lambda shipped: ""  # printed before Ray starts
    results_file: str = "results"
    # The study's CSV form of a frame (units in the headers, rounding): every CSV the sweep writes goes through it.
    csv: Callable[[pd.DataFrame], pd.DataFrame] = lambda frame: frame
    tables: Callable[[pd.DataFrame], Mapping[str, pd.DataFrame]] = lambda rows: {}
    parent_metrics: Callable[[pd.DataFrame], Mapping[str, float]] = lambda rows: {}
    # A search (ASHA, Optuna): metric and mode are set here once and reach both through TuneConfig. A trial the
    # scheduler stops has no final record of its own: its row holds its last epoch's `metric` and, under
    # `best_metric`, the best value of `metric` over its epochs.
    metric: str | None = None
    mode: str | None = None
    best_metric: str | None = None
    scheduler: Any = None
    search_alg: Any = None
    num_samples: int = 1
    # `--gpus-per-trial auto`: the largest trial's peak GPU memory among the space's points (`pefusion.sweep.gpus`);
    # None: the study's trials never use a GPU, so auto means none.
    gpu_probe: GpuProbe | None = None
    # The card the probe measures on (free, total bytes, name); None: the current CUDA device (`gpus.cuda_card`).
    gpu_card: CardMemory | None = None
    # Config keys whose value a trial resolves where it runs (a precision of `auto`): their params are recorded from
    # what the trial reports (`record.TRIAL_INFO`), not from the config, since MLflow never changes a param.
    resolved_keys: Sequence[str] = ()
    # A key whose grid values the study's trainable can train together in one trial, one run each (the seeds of a
    # PE-fusion cell): `--stack-seeds` makes that grid a `stack`, and left out, it is stacked where trials get a GPU.
    stackable: str | None = None
    # Files the sweep's parent run keeps from its start, by artifact folder, from what `ship` built: what a finished
    # trial's model needs besides its checkpoint (the tokeniser of each corpus the trials read).
    parent_files: Callable[[Mapping[str, Any]], Mapping[str, Sequence[Path]]] = lambda shipped: {}
    # `--plan` and the first lines of every sweep (`pefusion.sweep.plan`): given the points the trials can be
    # (`SearchSpace.trial_points()`) and what `ship` built, a callable that times the trials on a device ("cpu" or
    # "cuda") and returns their seconds (a `Timing`). It must pickle (the engine runs it in a fresh process on a
    # GPU), so it carries samples of the data, not the data.
    timer: Callable[[Sequence[dict[str, Any]], Mapping[str, Any]], Callable[[str], Timing]] | None = None
    # What `--plan` times on, where it differs from `ship`: a study whose data is not downloaded yet may stand in a
    # profile of it (the fusion study: a paper dataset's published sizes and lengths), which the plan says.
    plan_ship: Callable[[], Mapping[str, Any]] | None = None


def varying_keys(space: SearchSpace) -> list[str]:
    """The keys whose value differs between trials (what names a trial in the progress lines), in file order."""
    return [key for key, dim in space.items() if not isinstance(dim, Constant)
            and not (isinstance(dim, (Grid, Choice)) and len(set(map(repr, dim.values))) == 1)]
