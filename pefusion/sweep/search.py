"""Schedulers and search algorithms by name, and the rules of each, checked before Ray starts.

A command line names a search algorithm (`grid`, `random`, `optuna` for Optuna's TPE, `cmaes` for Optuna's CMA-ES)
and a scheduler (`fifo`, `asha`, `hyperband`, `pbt` for population-based training) in a `SearchPlan`; the study says
what is optimised in an `Objective` (metric, mode, the per-epoch counter its trainable reports, whether it restores
from a checkpoint, which keys it takes up mid-run). `check` refuses a combination that cannot work in one line
naming the fix; `build` returns StudySweep's metric, mode, scheduler, search_alg and num_samples. This module knows
no study: every metric and key name comes from the caller.

Why the rules live here: each one is a way a Ray Tune run goes wrong silently or late (Optuna crossing a grid it
cannot sample, CMA-ES falling back to independent sampling on a categorical key, ASHA waiting forever for a second
report, PBT restarting a trial whose trainable cannot restore). Ray imports are lazy: `--help` and validation
must not import Ray or Optuna.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from pefusion.errors import ConfigError
from pefusion.sweep.space import (Choice, Constant, Grid, LogUniform, RandInt, SearchSpace, SearchSpaceError,
                                  Uniform, require_no_grid)

SEARCHES = ("grid", "random", "optuna", "cmaes")
SCHEDULERS = ("fifo", "asha", "hyperband", "pbt")
EARLY_STOPPING = ("asha", "hyperband")  # schedulers that stop trials at their rungs
NEEDS_METRIC_SEARCHES = ("optuna", "cmaes")


@dataclass(frozen=True)
class SearchPlan:
    """What the command line chose (`pefusion.cli.flags.add_search_flags`)."""

    search: str = "random"
    scheduler: str = "fifo"
    num_samples: int = 1
    max_t: int = 1  # ASHA/HyperBand: the epoch budget of a trial, in the objective's time_attr units
    grace_period: int = 1  # ASHA: reports before a trial can be stopped
    reduction_factor: float = 3.0  # ASHA/HyperBand: keep 1/η of the trials at each rung
    sampler_seed: int = 0  # Optuna's TPE and CMA-ES samplers; PBT's perturbations are Ray's
    perturbation_interval: int = 2  # PBT: reports between exploit/explore steps


@dataclass(frozen=True)
class Objective:
    """What a study optimises, and what its trainable can do."""

    metric: str | None  # None: the study has nothing to optimise (a grid of complete runs)
    mode: str | None = None  # "max" | "min"
    time_attr: str | None = None  # the counter each per-epoch report carries; None: the trainable reports once
    checkpoints: bool = False  # the trainable restores itself from tune.get_checkpoint() (PBT restarts trials)
    perturbable: tuple[str, ...] = ()  # keys a restored trial takes up from its new config (PBT mutates them)


def check(plan: SearchPlan, objective: Objective, space: SearchSpace) -> None:
    """A ConfigError (one line naming the fix) for a plan that cannot run on `space` for `objective`."""
    if plan.search not in SEARCHES:
        raise ConfigError(f"--search {plan.search}: unknown; choose one of {', '.join(SEARCHES)}")
    if plan.scheduler not in SCHEDULERS:
        raise ConfigError(f"--scheduler {plan.scheduler}: unknown; choose one of {', '.join(SCHEDULERS)}")
    if plan.num_samples < 1:
        raise ConfigError(f"--num-samples={plan.num_samples} must be >= 1")
    if objective.metric is None and (plan.search in NEEDS_METRIC_SEARCHES or plan.scheduler != "fifo"):
        used = f"--search {plan.search}" if plan.search in NEEDS_METRIC_SEARCHES else f"--scheduler {plan.scheduler}"
        raise ConfigError(f"{used} optimises a metric, and this sweep has none: use --search grid or random with "
                          f"--scheduler fifo")
    stacked = space.stacked_key()
    if stacked and objective.metric is not None:
        raise SearchSpaceError(f"{space.source}: {stacked}: a stacked trial reports its metric once per run, and "
                               f"a search or scheduler judges a trial by one: write {stacked} as a grid")
    sampled = [key for key, dim in space.items() if not isinstance(dim, (Grid, Constant))]
    if plan.search == "grid":
        if sampled:
            raise SearchSpaceError(f"{space.source}: {sampled[0]}: --search grid runs every grid value once and "
                                   f"samples nothing; write {sampled[0]} as {{grid: [...]}}, or use --search random")
        if plan.num_samples > 1:
            raise ConfigError(f"--search grid runs each grid point once; --num-samples {plan.num_samples} would "
                              f"repeat identical trials: drop --num-samples, or use --search random")
    if plan.search == "optuna":
        require_no_grid(space, "with Optuna (it samples every key)")
    if plan.search == "cmaes":
        require_no_grid(space, "with CMA-ES (it samples every key)")
        for key, dim in space.items():
            if isinstance(dim, Choice):
                raise SearchSpaceError(f"{space.source}: {key}: CMA-ES samples numeric ranges only and {key} is a "
                                       f"choice; make it a constant or a range, or use --search optuna (TPE)")
        if not sampled:
            raise SearchSpaceError(f"{space.source}: --search cmaes has no range to sample; give at least one key "
                                   f"as uniform, loguniform or randint")
        if importlib.util.find_spec("cmaes") is None:
            raise ConfigError("--search cmaes needs the `cmaes` package (Optuna's CMA-ES sampler): pip install cmaes")
    if plan.scheduler in EARLY_STOPPING + ("pbt",) and objective.time_attr is None:
        raise ConfigError(f"--scheduler {plan.scheduler} acts between a trial's per-epoch reports, and this "
                          f"sweep's trials report once: use --scheduler fifo")
    if plan.scheduler in EARLY_STOPPING:
        if plan.max_t < 1:
            raise ConfigError(f"--max-t={plan.max_t} must be >= 1")
        if plan.grace_period < 1 or plan.reduction_factor <= 1:
            raise ConfigError("--grace-period must be >= 1 and --reduction-factor > 1")
    if plan.scheduler == "hyperband" and not objective.checkpoints:
        raise ConfigError("--scheduler hyperband pauses trials at each rung and resumes them from their checkpoint, "
                          "and this sweep's trainable does not restore from one: use --scheduler asha")
    if plan.scheduler == "pbt":
        _check_pbt(plan, objective, space, sampled)


def _check_pbt(plan: SearchPlan, objective: Objective, space: SearchSpace, sampled: list[str]) -> None:
    if not objective.checkpoints:
        raise ConfigError("--scheduler pbt restarts trials from each other's checkpoints, and this sweep's trainable "
                          "does not restore from one: use --scheduler asha or fifo")
    if plan.search != "random":
        raise ConfigError(f"--scheduler pbt samples its population from the space and mutates it itself; "
                          f"--search {plan.search} would propose points it never sees: use --search random")
    if plan.perturbation_interval < 1:
        raise ConfigError(f"--perturbation-interval={plan.perturbation_interval} must be >= 1")
    allowed = ", ".join(objective.perturbable) or "none"
    for key in sampled:
        if key not in objective.perturbable:
            raise SearchSpaceError(f"{space.source}: {key}: PBT changes sampled keys mid-run, and a restored trial "
                                   f"keeps its old {key} (perturbable: {allowed}); make {key} a constant or a grid")
    if not sampled:
        raise SearchSpaceError(f"{space.source}: --scheduler pbt has nothing to perturb; sample at least one of: "
                               f"{allowed}")


def build(plan: SearchPlan, objective: Objective, space: SearchSpace) -> dict[str, Any]:
    """StudySweep's metric, mode, scheduler, search_alg and num_samples for a checked plan (imports Ray)."""
    check(plan, objective, space)
    return {"metric": objective.metric, "mode": objective.mode, "scheduler": _scheduler(plan, objective, space),
            "search_alg": _search_alg(plan), "num_samples": plan.num_samples}


def _scheduler(plan: SearchPlan, objective: Objective, space: SearchSpace) -> Any:
    from ray.tune.schedulers import (ASHAScheduler, FIFOScheduler, HyperBandScheduler,
                                     PopulationBasedTraining)

    # ASHA and HyperBand stop any trial whose report reaches max_t; one epoch of headroom lets a trial that
    # trained the whole budget deliver its final record, which follows its last epoch report.
    if plan.scheduler == "asha":
        return ASHAScheduler(time_attr=objective.time_attr, max_t=plan.max_t + 1,
                             grace_period=min(plan.grace_period, plan.max_t), reduction_factor=plan.reduction_factor)
    if plan.scheduler == "hyperband":
        return HyperBandScheduler(time_attr=objective.time_attr, max_t=plan.max_t + 1,
                                  reduction_factor=plan.reduction_factor)
    if plan.scheduler == "pbt":
        return PopulationBasedTraining(time_attr=objective.time_attr, perturbation_interval=plan.perturbation_interval,
                                       hyperparam_mutations={k: _mutation(d) for k, d in space.items()
                                                             if k in objective.perturbable
                                                             and not isinstance(d, (Grid, Constant))})
    return FIFOScheduler()


def checkpoints_to_keep(scheduler: Any) -> int | None:
    """How many checkpoints of each trial Ray keeps under `scheduler`: the latest one (what a resumed trial
    needs), or under PBT all of them, since PBT clones a trial from the checkpoint of its last perturbation, which
    that trial's later epochs would otherwise delete (Ray warns for num_to_keep <= 2)."""
    from ray.tune.schedulers import PopulationBasedTraining

    return None if isinstance(scheduler, PopulationBasedTraining) else 1


def _mutation(dim: Any) -> Any:
    """PBT's resampling distribution of one sampled key: the space's own range."""
    from ray import tune

    if isinstance(dim, Choice):
        return list(dim.values)
    if isinstance(dim, LogUniform):
        return tune.loguniform(dim.lo, dim.hi)
    if isinstance(dim, Uniform):
        return tune.uniform(dim.lo, dim.hi)
    assert isinstance(dim, RandInt)
    return tune.randint(dim.lo, dim.hi)


def _search_alg(plan: SearchPlan) -> Any:
    """None for grid and random (Ray's variant generator crosses the grids and samples the rest); Optuna's
    sampler with the plan's seed otherwise."""
    if plan.search not in NEEDS_METRIC_SEARCHES:
        return None
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    sampler = (optuna.samplers.TPESampler(seed=plan.sampler_seed) if plan.search == "optuna"
               else optuna.samplers.CmaEsSampler(seed=plan.sampler_seed))
    return OptunaSearch(sampler=sampler)
