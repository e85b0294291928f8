"""A hyperparameter search's tables (sweeps/lr_batch_asha.py): the trials best first, the finished trials' scores
against the keys searched, how much each key mattered (parameter importances of an Optuna study rebuilt from the
runs) and the epochs the scheduler spent against the full budget.

Pure functions over the trial frame of pefusion.analysis.runs, plus the search-space file its parent run names
when that file can still be read. A trial's score is its best epoch's validation accuracy (`best_val_acc`, in %
here): trials stopped early by ASHA count with the best epoch they reached, failed ones not at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd

from pefusion import record as R
from pefusion.analysis.runs import TRIAL_ID, column
from pefusion.errors import ConfigError
from pefusion.fusion.config import RULES, TRIAL_KEYS
from pefusion.sweep.space import load_search_space, to_optuna

SCORE = R.BEST_VAL_ACC
MAX_EPOCHS = "max_epochs"  # TrainConfig field, a param of every trial run: the search's max_t
LOG, LINEAR, CATEGORICAL = "log", "linear", "categorical"  # how a key's values are spaced (and drawn)
IMPORTANCE_SEED = 0  # fANOVA's random forest: fixed, so a report is the same every time it is written
# fANOVA fits a forest to the trials: on 3 trials it split two keys about 50/50 whatever the objective did.
MIN_IMPORTANCE_TRIALS = 5


def varied_keys(trials: pd.DataFrame) -> list[str]:
    """The trial config keys that take more than one value among the trials, in config order."""
    return [k for k in TRIAL_KEYS if k in trials and trials[k].nunique(dropna=True) > 1]


def search_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials of a hyperparameter search, best first: the config keys that vary, status, and the metrics that
    rank them (accuracies as the trials recorded them, fractions; formats.csv_ready and formats.display show
    them in percent)."""
    metrics = [m for m in (R.BEST_VAL_ACC, R.OPTIMISED_METRIC, R.TEST_ACC, R.EPOCHS_RUN) if m in trials]
    out = trials[[TRIAL_ID, *varied_keys(trials), R.STATUS, *metrics]].copy()
    rank = R.BEST_VAL_ACC if R.BEST_VAL_ACC in out else R.OPTIMISED_METRIC
    if rank in out:
        out = out.sort_values(rank, ascending=R.OPTIMISED_MODE != "max", na_position="last")
    return out.reset_index(drop=True)


# ---------------------------------------------------------------------------------------------------------
# The finished trials as points of the search space
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchPoints:
    """The finished trials (ok, or stopped by the scheduler) that have a score, and the space they sample."""

    frame: pd.DataFrame  # one row per trial: trial_id, status, <keys>, best_val_acc (%)
    keys: list[str]  # the searched keys that vary among these trials
    distributions: dict[str, Any]  # key -> Optuna distribution
    origin: dict[str, str]  # key -> "search space <file>" or "inferred from the values"
    n_unscored: int  # finished trials without a score, left out

    def kind(self, key: str) -> str:
        """LOG, LINEAR or CATEGORICAL: how the key's values are spaced."""
        dist = self.distributions[key]
        if not hasattr(dist, "low"):
            return CATEGORICAL
        return LOG if getattr(dist, "log", False) else LINEAR


def _values(series: pd.Series) -> list:
    """Python values (Optuna checks them against its distributions by type)."""
    return series.dropna().astype(object).tolist()


def _inferred(values: list) -> Any:
    """A distribution that holds the values: sampled floats (no value repeats) are a range, log-spaced when they
    span more than a decade; integers, strings and repeated floats are choices."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    floats = all(isinstance(v, float) for v in values)
    if floats and len(set(values)) == len(values):
        lo, hi = min(values), max(values)
        return FloatDistribution(lo, hi, log=lo > 0 and hi / lo > 10)
    return CategoricalDistribution(sorted(set(values)))


def _holds(dist: Any, values: list) -> bool:
    if hasattr(dist, "choices"):
        return all(v in dist.choices for v in values)
    return all(dist.low <= v <= dist.high for v in values)


def recorded_space(path: str | None) -> dict[str, Any]:
    """The Optuna distributions of the search-space file a sweep recorded (tag pefusion.search_space), or {}
    when it is not recorded or cannot be read here (another machine, moved, edited into an invalid file)."""
    if not path:
        return {}
    try:
        return to_optuna(load_search_space(path, RULES))
    except ConfigError:
        return {}


def search_points(trials: pd.DataFrame, space: Mapping[str, Any] | None = None,
                  space_file: str = "") -> SearchPoints:
    """The scored finished trials and, per varying key, the distribution of `space` (from `space_file`) when it
    holds every value, else one inferred from the values."""
    done = trials[trials[R.STATUS].isin(R.SUCCESS_STATUSES)]
    scored = done[column(done, SCORE).notna()]
    keys = varied_keys(scored)
    distributions, origin = {}, {}
    for key in keys:
        values = _values(scored[key])
        dist = (space or {}).get(key)
        if dist is not None and _holds(dist, values):
            distributions[key], origin[key] = dist, f"search space {space_file}".strip()
        else:
            distributions[key], origin[key] = _inferred(values), "inferred from the values"
    frame = scored[[TRIAL_ID, R.STATUS, *keys]].assign(**{SCORE: scored[SCORE].astype(float) * 100})
    return SearchPoints(frame.reset_index(drop=True), keys, distributions, origin, len(done) - len(scored))


def describe(dist: Any) -> str:
    """'log-uniform [0.0001, 0.003]', 'categorical {16, 32, 64}', ... for tables."""
    if hasattr(dist, "choices"):
        return "categorical {" + ", ".join(map(str, dist.choices)) + "}"
    name = "integers" if isinstance(dist.low, int) else ("log-uniform" if dist.log else "uniform")
    return f"{name} [{dist.low:g}, {dist.high:g}]"


# ---------------------------------------------------------------------------------------------------------
# Parameter importances
# ---------------------------------------------------------------------------------------------------------

IMPORTANCE_COLUMNS = ("param", "importance", "distribution", "origin")


def param_importances(points: SearchPoints) -> tuple[pd.DataFrame, str]:
    """fANOVA importances (optuna.importance, forest seed IMPORTANCE_SEED, summing to 1) of the varying keys for
    the trials' score, most important first, with the distribution each key was given; or an empty frame and a
    one-line reason when there is nothing to weigh (fewer than two keys vary, too few trials, equal scores)."""
    empty = pd.DataFrame(columns=list(IMPORTANCE_COLUMNS))
    n = len(points.frame)
    if len(points.keys) < 2:
        varied = f"only {points.keys[0]} varies" if points.keys else "no searched key varies"
        return empty, f"no parameter importances: {varied} among the {n} scored trials"
    if n < MIN_IMPORTANCE_TRIALS:
        return empty, (f"no parameter importances: {n} scored trials, fewer than the {MIN_IMPORTANCE_TRIALS} "
                       f"a forest needs to tell the keys apart")
    if points.frame[SCORE].nunique() < 2:
        return empty, f"no parameter importances: all {n} scored trials have the same {SCORE}"

    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory" in a report run
    try:
        study = optuna.create_study(direction="maximize" if R.OPTIMISED_MODE == "max" else "minimize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    params = points.frame[points.keys].astype(object).to_dict("records")  # Python values, as Optuna checks them
    for row, score in zip(params, points.frame[SCORE]):
        study.add_trial(optuna.trial.create_trial(params=row, distributions=points.distributions, value=float(score)))
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)
    importances = optuna.importance.get_param_importances(study, evaluator=evaluator)
    frame = pd.DataFrame([{"param": k, "importance": float(v), "distribution": describe(points.distributions[k]),
                           "origin": points.origin[k]} for k, v in importances.items()],
                         columns=list(IMPORTANCE_COLUMNS))
    return frame, ""


# ---------------------------------------------------------------------------------------------------------
# The epoch budget
# ---------------------------------------------------------------------------------------------------------


def budget_summary(rows: pd.DataFrame, max_t: int) -> dict[str, float]:
    """Epochs actually trained against the epochs of the same samples run to max_t (every trial, failed ones
    with the epochs they ran)."""
    trained = float(rows[R.EPOCHS_RUN].fillna(0).sum())
    full = float(len(rows) * max_t)
    return {R.EPOCHS_TRAINED: trained, R.EPOCHS_FULL_BUDGET: full, R.BUDGET_FRACTION: trained / full if full else 0.0,
            R.N_STOPPED: float((rows[R.STATUS] == R.STATUS_STOPPED).sum()),
            "n_failed": float((~rows[R.STATUS].isin(R.SUCCESS_STATUSES)).sum()),
            R.BEST_VAL_ACC: float(rows[R.VAL_ACC].max()) if R.VAL_ACC in rows and rows[R.VAL_ACC].notna().any()
            else float("nan")}


@dataclass(frozen=True)
class Budget:
    """The epochs each trial ran against max_t, and the sweep's totals."""

    per_trial: pd.DataFrame  # trial_id, status, epochs_run; most epochs first
    max_t: int
    epochs_trained: float
    epochs_full_budget: float
    fraction: float
    from_parent: bool  # totals as the parent run recorded them (else summed here from the trial runs)


def search_budget(trials: pd.DataFrame, parent_metrics: Mapping[str, float]) -> Budget | None:
    """The budget of a search: max_t from the trials' max_epochs param (else the parent's full budget over the
    trial count), totals from the parent run when it recorded them (a finished sweep), else from the trials.
    None when max_t is known from neither."""
    per_trial = trials[[TRIAL_ID, R.STATUS]].assign(**{R.EPOCHS_RUN: column(trials, R.EPOCHS_RUN).fillna(0)})
    per_trial = per_trial.sort_values(R.EPOCHS_RUN, ascending=False, kind="stable").reset_index(drop=True)
    from_parent = all(k in parent_metrics for k in (R.EPOCHS_TRAINED, R.EPOCHS_FULL_BUDGET, R.BUDGET_FRACTION))
    max_epochs = column(trials, MAX_EPOCHS).dropna()
    if len(max_epochs):
        max_t = int(max_epochs.mode().iloc[0])
    elif from_parent and len(trials):
        max_t = round(parent_metrics[R.EPOCHS_FULL_BUDGET] / len(trials))
    else:
        return None
    totals = parent_metrics if from_parent else budget_summary(per_trial, max_t)
    return Budget(per_trial, max_t, float(totals[R.EPOCHS_TRAINED]), float(totals[R.EPOCHS_FULL_BUDGET]),
                  float(totals[R.BUDGET_FRACTION]), from_parent)
