"""Search-space files: a small YAML schema, validated before Ray starts, converted to Ray Tune objects (and to
Optuna distributions, with which the analysis rebuilds a finished search).

A file maps each key to one dimension::

    pe_type: {grid: [sinusoidal, learned]}     # every value, crossed with the other grids
    batch_size: {choice: [16, 32, 64]}         # sampled
    lr: {loguniform: [1e-4, 1e-2]}             # low, high (also: uniform)
    gate_kernel: {randint: [3, 8]}             # low inclusive, high exclusive, like tune.randint
    dropout: 0.1                               # a plain value is a constant
    seed: {stack: [0, 1, 2]}                   # every value, trained together in one trial: one run each

Each key is checked against the study's `KeyRule` (type, allowed names, numeric range; `pefusion.errors`), and
every point the space can produce against the study's `Rules.check_point`. The engine knows no study: the rules
come with the call. Every problem raises a
`SearchSpaceError` whose message is one line naming the file, the key and what is allowed; command lines turn
it into exit code 2 like any `ConfigError`.
"""
from __future__ import annotations

import difflib
import itertools
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import yaml

from pefusion.errors import TYPE_NAMES, ConfigError, KeyRule


class SearchSpaceError(ConfigError):
    """A bad search space; the message is one line naming the file, the key and the allowed values."""


# ---------------------------------------------------------------------------------------------------------
# Dimensions
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    values: tuple  # every value is run (tune.grid_search)


@dataclass(frozen=True)
class Choice:
    values: tuple  # one value sampled per trial (tune.choice)


@dataclass(frozen=True)
class Uniform:
    lo: float
    hi: float


@dataclass(frozen=True)
class LogUniform:
    lo: float
    hi: float


@dataclass(frozen=True)
class RandInt:
    lo: int
    hi: int  # exclusive, as tune.randint: randint [1, 4] samples 1, 2 or 3


@dataclass(frozen=True)
class Constant:
    value: Any


@dataclass(frozen=True)
class Stack:
    """Every value, like a grid, but all of them in one trial: the trial's config holds the list, and the trial
    carries one run per value (the seeds of a grid cell trained as one batched model). At most one per space."""

    values: tuple


Dimension = Union[Grid, Choice, Uniform, LogUniform, RandInt, Constant, Stack]
_DIMENSION_TYPES = (Grid, Choice, Uniform, LogUniform, RandInt, Constant, Stack)
_KINDS = {"grid": Grid, "choice": Choice, "uniform": Uniform, "loguniform": LogUniform, "randint": RandInt,
          "stack": Stack}
_KIND_NAMES = ", ".join(_KINDS) + " (or a plain value for a constant)"

# ---------------------------------------------------------------------------------------------------------
# Parsing and validation
# ---------------------------------------------------------------------------------------------------------




def _is_kind(value: Any, kind: type) -> bool:
    if kind in (int, float) and isinstance(value, bool):  # bool is an int subclass, never a number here
        return False
    if kind is float:  # (an integer past a float's range is no number here either: isfinite raises on it)
        return isinstance(value, (int, float)) and abs(value) <= sys.float_info.max and math.isfinite(value)
    return isinstance(value, kind)


def _coerce(where: str, value: Any, rule: KeyRule, *, check_range: bool = True) -> Any:
    """One value of a key, converted to the rule's type and checked; `where` is 'file: key'."""
    if rule.kind in (int, float) and isinstance(value, str):
        try:  # PyYAML reads 1e-4 (no dot) as a string, and command-line values are strings
            value = float(value)
        except ValueError:
            pass
    if rule.kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_kind(value, rule.kind):
        raise SearchSpaceError(f"{where}: {value!r} is not {TYPE_NAMES[rule.kind]}; {rule.allowed()}")
    value = rule.kind(value)
    if rule.choices and value not in rule.choices:
        hint = difflib.get_close_matches(str(value), list(map(str, rule.choices)), n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise SearchSpaceError(f"{where}: {value!r} is not allowed{did_you_mean}; {rule.allowed()}")
    if check_range and rule.kind in (int, float) and not rule.in_range(value):
        raise SearchSpaceError(f"{where}: {value!r} is out of range; {rule.allowed()}")
    return value


def _check_dimension(source: str, key: str, dim: Dimension, rule: KeyRule) -> Dimension:
    """The dimension with its values coerced to the rule's type, or a SearchSpaceError."""
    where = f"{source}: {key}"
    if isinstance(dim, Constant):
        return Constant(_coerce(where, dim.value, rule))
    name = next(k for k, cls in _KINDS.items() if isinstance(dim, cls))
    if isinstance(dim, (Grid, Choice, Stack)):
        if not dim.values:
            raise SearchSpaceError(f"{where}: {name} is empty; list at least one value ({rule.allowed()})")
        values = tuple(_coerce(where, v, rule) for v in dim.values)
        if len(set(values)) < len(values):
            raise SearchSpaceError(f"{where}: {name} {list(values)} repeats a value; list each value once")
        return type(dim)(values)
    # uniform / loguniform / randint
    wanted = int if isinstance(dim, RandInt) else float
    if rule.kind is not wanted or rule.choices:
        use = "grid or choice" if rule.choices or rule.kind in (str, bool) else (
            "randint" if rule.kind is int else "uniform or loguniform")
        samples = "integers" if wanted is int else "real numbers"
        raise SearchSpaceError(f"{where}: {name} samples {samples} but {key} takes {TYPE_NAMES[rule.kind]}; "
                               f"use {use}")
    lo, hi = (_coerce(where, v, rule, check_range=False) for v in (dim.lo, dim.hi))
    if isinstance(dim, LogUniform) and not 0 < lo < hi:
        raise SearchSpaceError(f"{where}: loguniform needs 0 < low < high, got [{lo}, {hi}]")
    if not lo < hi:
        exclusive = " (high is exclusive)" if wanted is int else ""
        raise SearchSpaceError(f"{where}: {name} needs low < high{exclusive}, got [{lo}, {hi}]")
    largest = hi - 1 if wanted is int else hi
    for v in (lo, largest):
        if not rule.in_range(v):
            raise SearchSpaceError(f"{where}: {name} [{lo}, {hi}] reaches {v!r}, out of range; {rule.allowed()}")
    return type(dim)(lo, hi)


def _to_dimension(where: str, raw: Any) -> Dimension:
    """The YAML shape of one entry -> an unchecked Dimension."""
    if isinstance(raw, list):
        raise SearchSpaceError(f"{where}: a bare list is ambiguous; write {{grid: [...]}} or {{choice: [...]}}")
    if not isinstance(raw, dict):
        return Constant(raw)
    if len(raw) != 1 or next(iter(raw)) not in _KINDS:
        raise SearchSpaceError(f"{where}: unknown dimension {list(raw)}; use exactly one of {_KIND_NAMES}")
    kind, arg = next(iter(raw.items()))
    if kind in ("grid", "choice", "stack"):
        if not isinstance(arg, list):
            raise SearchSpaceError(f"{where}: {kind} needs a list of values, got {arg!r}")
        return _KINDS[kind](tuple(arg))
    if not (isinstance(arg, list) and len(arg) == 2):
        raise SearchSpaceError(f"{where}: {kind} needs [low, high], got {arg!r}")
    return _KINDS[kind](*arg)


@dataclass(frozen=True)
class SearchSpace(Mapping):
    """An ordered, validated mapping key -> Dimension, with the rules and source it was checked against."""

    dims: Mapping[str, Dimension]
    rules: Mapping[str, KeyRule]
    source: str = "search space"

    def __getitem__(self, key: str) -> Dimension:
        return self.dims[key]

    def __iter__(self):
        return iter(self.dims)

    def __len__(self) -> int:
        return len(self.dims)

    def points(self) -> list[dict[str, Any]]:
        """Every combination of the values a trial can take: grid and choice values, constants, and both ends of
        each sampled range (the one place a space is enumerated: validation, benchmarks)."""
        def values(dim: Dimension) -> tuple:
            if isinstance(dim, (Grid, Choice, Stack)):  # each stacked value is a run: checked as one
                return dim.values
            if isinstance(dim, Constant):
                return (dim.value,)
            return (dim.lo, dim.hi - 1 if isinstance(dim, RandInt) else dim.hi)
        keys = list(self.dims)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(values(self.dims[k]) for k in keys))]

    def trial_points(self) -> list[dict[str, Any]]:
        """`points` as trials see them: a Stack's values as one list (what a trial that carries them needs to
        know, such as the GPU memory of its models together)."""
        stacked = self.stacked_key()
        if stacked is None:
            return self.points()
        rest = SearchSpace({k: d for k, d in self.dims.items() if k != stacked}, self.rules, self.source).points()
        return [{**point, stacked: list(self.dims[stacked].values)} for point in rest]

    def check_points(self, defaults: Mapping[str, Any] | None = None) -> None:
        """The rules' whole-point check on every point, keys the space lacks taken from `defaults`."""
        check = getattr(self.rules, "check_point", None)
        if check is None:
            return
        for point in self.points():
            try:
                check({**(defaults or {}), **point})
            except ConfigError as e:
                raise SearchSpaceError(f"{self.source}: {e}") from None

    def override(self, key: str, dim: Dimension) -> SearchSpace:
        """A copy with `key` replaced (or added), validated like a file entry."""
        return parse_search_space({**self.dims, key: dim}, self.rules, self.source)

    def override_values(self, key: str, values: str | Sequence, flag: str = "") -> SearchSpace:
        """Replace `key` from a command line, e.g. ('pe_type', 'sinusoidal,rope'): keeps a Choice a Choice and
        a Stack a Stack, anything else becomes a Grid. `flag` names where the values came from (`--pe-types`): a
        value the key's rule refuses is then reported against the flag as typed, not the file it narrows."""
        items = tuple(v.strip() for v in values.split(",")) if isinstance(values, str) else tuple(values)
        dim = (type(self.dims[key]) if isinstance(self.dims.get(key), (Choice, Stack)) else Grid)(items)
        if flag and key in self.rules:
            _check_dimension(f"{flag} {','.join(map(str, items))}", key, dim, self.rules[key])
        return self.override(key, dim)
    def stacked_key(self) -> str | None:
        """The key whose values one trial trains together (a `Stack`), if any."""
        return next((key for key, dim in self.dims.items() if isinstance(dim, Stack)), None)

    def stacked(self, key: str) -> SearchSpace:
        """A copy whose `key` (a grid or a constant) is a Stack of the same values: what `--stack-seeds` makes of
        the seed grid."""
        dim = self.dims.get(key)
        if isinstance(dim, (Grid, Stack)):
            return self.override(key, Stack(dim.values))
        if isinstance(dim, Constant):
            return self.override(key, Stack((dim.value,)))
        raise SearchSpaceError(f"{self.source}: {key}: only a grid's values (or a constant) can be stacked in one "
                               f"trial, not a {type(dim).__name__.lower() if dim else 'missing key'}")

    def unstacked(self, key: str) -> SearchSpace:
        """A copy whose Stack `key` is a grid of the same values: one trial per value."""
        dim = self.dims[key]
        return self.override(key, Grid(dim.values)) if isinstance(dim, Stack) else self


def parse_search_space(mapping: Mapping[str, Any], allowed: Mapping[str, KeyRule],
                       source: str = "search space") -> SearchSpace:
    """Validate a {key: YAML entry or Dimension} mapping against `allowed` rules."""
    if not isinstance(mapping, Mapping):
        raise SearchSpaceError(f"{source}: a search space is a mapping of key: dimension, "
                               f"got {type(mapping).__name__}")
    dims: dict[str, Dimension] = {}
    for key, raw in mapping.items():
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise SearchSpaceError(f"{source}: unknown key {key!r}{did_you_mean}; allowed: {', '.join(allowed)}")
        dim = raw if isinstance(raw, _DIMENSION_TYPES) else _to_dimension(f"{source}: {key}", raw)
        dims[key] = _check_dimension(source, key, dim, allowed[key])
    stacks = [key for key, dim in dims.items() if isinstance(dim, Stack)]
    if len(stacks) > 1:
        raise SearchSpaceError(f"{source}: {', '.join(stacks)}: a trial stacks the values of one key only; make "
                               f"the others grids")
    space = SearchSpace(dims, allowed, source)
    space.check_points()
    return space


def load_search_space(path: str | Path, allowed: Mapping[str, KeyRule]) -> SearchSpace:
    """Read and validate a YAML search-space file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SearchSpaceError(f"{source}: cannot read the search-space file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise SearchSpaceError(f"{source}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                               f"a search space is a YAML file") from None
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or " ".join(str(e).split())
        raise SearchSpaceError(f"{source}: malformed YAML{at}: {problem}") from None
    return parse_search_space({} if mapping is None else mapping, allowed, source)


# ---------------------------------------------------------------------------------------------------------
# Queries used by the sweep drivers
# ---------------------------------------------------------------------------------------------------------


def grid_size(space: SearchSpace) -> int:
    """Trials per sample: the product of the grid lengths (1 without grids; a Stack makes no more trials)."""
    return math.prod(len(d.values) for d in space.values() if isinstance(d, Grid))


def require_no_grid(space: SearchSpace, reason: str) -> None:
    """Reject grids where a searcher must sample, e.g. reason='with Optuna (it samples every key)'."""
    for key, dim in space.items():
        if isinstance(dim, Stack):
            raise SearchSpaceError(f"{space.source}: {key}: stack cannot be used {reason}; a stacked trial "
                                   f"trains its runs together to the end: write {key}: {{grid: {list(dim.values)}}}")
        if isinstance(dim, Grid):
            raise SearchSpaceError(f"{space.source}: {key}: grid cannot be used {reason}; "
                                   f"write {key}: {{choice: {list(dim.values)}}} instead")


def to_tune(space: SearchSpace) -> dict[str, Any]:
    """The Ray Tune param_space: grid_search / choice / uniform / loguniform / randint, constants as-is."""
    from ray import tune  # lazy: validating a file must not import Ray

    def convert(dim: Dimension) -> Any:
        if isinstance(dim, Grid):
            return tune.grid_search(list(dim.values))
        if isinstance(dim, Choice):
            return tune.choice(list(dim.values))
        if isinstance(dim, Uniform):
            return tune.uniform(dim.lo, dim.hi)
        if isinstance(dim, LogUniform):
            return tune.loguniform(dim.lo, dim.hi)
        if isinstance(dim, RandInt):
            return tune.randint(dim.lo, dim.hi)
        if isinstance(dim, Stack):
            return list(dim.values)  # one trial, its config holding every value
        return dim.value

    return {key: convert(dim) for key, dim in space.items()}


def to_optuna(space: SearchSpace) -> dict[str, Any]:
    """Optuna distributions of the keys a trial samples (grid and choice: categorical; ranges as Ray Tune's
    OptunaSearch converts them, randint's high exclusive); constants are left out."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    def convert(dim: Dimension) -> Any:
        if isinstance(dim, (Grid, Choice, Stack)):
            return CategoricalDistribution(dim.values)
        if isinstance(dim, (Uniform, LogUniform)):
            return FloatDistribution(dim.lo, dim.hi, log=isinstance(dim, LogUniform))
        return IntDistribution(dim.lo, dim.hi - 1)

    return {key: convert(dim) for key, dim in space.items() if not isinstance(dim, Constant)}
