"""The cache: computed points and α_c values on disk, keyed by their parameters and a hash of everything else
that can change them (`settings_key`), so that the reports can put the theory beside every simulated point
without recomputing it and never serve a value computed under other settings."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from pefusion.errors import ConfigError
from pefusion.student.config import ALPHA_C_PUBLISHED, TEACHER_A
from pefusion.student.theory.continuation import BRANCH_START, COLUMNS, fixed_points
from pefusion.student.theory.crossing import alpha_c
from pefusion.student.theory.settings import Solver

# Part of every cache key: points computed by an earlier algorithm are recomputed, never served. 1: each point
# alone by the damped iteration on a 4-D tensor rule; 2: the switch-split rule, Newton and continuation.
THEORY_VERSION = 2
SETTINGS = "settings"  # the key's column: settings_key's hash
POINT_KEYS = ("sigma", "lam", "omega", "teacher_A", "alpha", "branch", SETTINGS)
ALPHA_C_KEYS = ("sigma", "lam", "omega", "teacher_A", SETTINGS)
CACHE_POINTS, CACHE_ALPHA_C = "student_theory_points.csv", "student_theory_alpha_c.csv"


def settings_key(solver: Solver) -> str:
    """A hash of everything besides a point's parameters that its value depends on: every field of `solver`,
    THEORY_VERSION, the branches' starting points, the teachers' A (a point names its teacher) and the published
    α_c(ω) that α_c's bracket search starts from."""
    settings = {"version": THEORY_VERSION, "solver": asdict(solver), "branch_start": BRANCH_START,
                "teacher_A": TEACHER_A, "alpha_c_start": {str(k): v for k, v in ALPHA_C_PUBLISHED.items()}}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _read(path: Path) -> pd.DataFrame | None:
    """A cache file, with the key column an older version did not write added empty (so it matches nothing)."""
    if not path.exists():
        return None
    frame = pd.read_csv(path, dtype={SETTINGS: str})  # a hash of digits and an e is no number
    return frame if SETTINGS in frame else frame.assign(**{SETTINGS: ""})


def _keyed(frame: pd.DataFrame, keys: Sequence[str]) -> pd.Series:
    """One string per row naming its parameters (floats at 12 significant digits, so CSV round trips match)."""
    parts = [frame[k].map(lambda v: f"{v:.12g}" if isinstance(v, (float, np.floating)) else str(v)) for k in keys]
    return pd.Series(["|".join(row) for row in zip(*parts)], index=frame.index)


def cached_points(points: pd.DataFrame, cache_dir: str | Path, solver: Solver = Solver()) -> pd.DataFrame:
    """The fixed points of `points` (columns sigma, lam, omega, teacher_A, alpha, branch), one row each with the
    point's columns, `settings` and COLUMNS; those not in <cache_dir>/student_theory_points.csv (for this
    settings_key) are computed as one batch and added to it."""
    cache_dir = Path(cache_dir)
    path = cache_dir / CACHE_POINTS
    wanted = points[list(POINT_KEYS[:6])].drop_duplicates().assign(**{SETTINGS: settings_key(solver)})
    wanted = wanted.assign(alpha=wanted["alpha"].astype(float), sigma=wanted["sigma"].astype(float),
                           lam=wanted["lam"].astype(float), omega=wanted["omega"].astype(float))
    cached = _read(path)
    known = set() if cached is None else set(_keyed(cached, POINT_KEYS))
    todo = wanted[~_keyed(wanted, POINT_KEYS).isin(known)] if len(wanted) else wanted
    if len(todo):
        solved = fixed_points(todo["alpha"].tolist(), todo["branch"].tolist(), sigma=todo["sigma"].tolist(),
                              lam=todo["lam"].tolist(), omega=todo["omega"].tolist(),
                              teacher_A=todo["teacher_A"].tolist(), solver=solver)
        new = pd.concat([todo.reset_index(drop=True), solved.drop(columns=["alpha", "branch"])], axis=1)
        cached = new if cached is None else pd.concat([cached, new], ignore_index=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
        cached.to_csv(path, index=False)
    if cached is None:
        return pd.DataFrame(columns=[*POINT_KEYS, *COLUMNS[2:]])
    found = cached[_keyed(cached, POINT_KEYS).isin(set(_keyed(wanted, POINT_KEYS)))]
    return found.drop_duplicates(subset=list(POINT_KEYS), keep="last").reset_index(drop=True)


def cached_alpha_c(omegas: Sequence[float], cache_dir: str | Path, sigma: float = 0.5, lam: float = 0.01,
                   teacher_A: str = "default", solver: Solver = Solver()) -> dict[float, float]:
    """α_c(ω) for each ω, from <cache_dir>/student_theory_alpha_c.csv (for this settings_key) or computed and
    added to it; an ω where no α_c is found maps to NaN (and is cached as such)."""
    cache_dir = Path(cache_dir)
    path = cache_dir / CACHE_ALPHA_C
    cached = _read(path)
    wanted = pd.DataFrame({"sigma": float(sigma), "lam": float(lam), "omega": [float(o) for o in omegas],
                           "teacher_A": teacher_A, SETTINGS: settings_key(solver)})
    found = {} if cached is None else dict(zip(_keyed(cached, ALPHA_C_KEYS), cached["alpha_c"]))
    rows = []
    for key, row in zip(_keyed(wanted, ALPHA_C_KEYS), wanted.itertuples(index=False)):
        if key not in found:
            try:
                found[key] = alpha_c(row.omega, sigma, lam, teacher_A, solver)
            except ConfigError:
                found[key] = math.nan
            rows.append({**row._asdict(), "alpha_c": found[key]})
    if rows:
        cache_dir.mkdir(parents=True, exist_ok=True)
        new = pd.DataFrame(rows)
        (new if cached is None else pd.concat([cached, new], ignore_index=True)).to_csv(path, index=False)
    return {float(o): float(found[k]) for o, k in zip(wanted["omega"], _keyed(wanted, ALPHA_C_KEYS))}
