"""User-caused configuration problems: `ConfigError`, the value checks, and the rules a study declares per key.

A study states what each of its keys accepts once, as `Rules` next to its config: the config's `__post_init__`
checks values with them, and the sweep engine validates search-space files with the same objects.

A `ConfigError` message is one line that names the key and the fix; command lines (pefusion.cli) turn it into
`error: <line>` on stderr and exit code 2, before Ray starts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping


class ConfigError(ValueError):
    """A user-caused configuration problem. Its message is one line that names the key and the fix."""


class SweepInterrupted(Exception):
    """A sweep stopped by Ctrl-C or SIGTERM after saving its state. Its message is the one line a command prints
    (what finished, what did not, the exact --resume command); command lines exit with 130."""


def check_choice(key: str, value: Any, allowed: Iterable) -> None:
    """A ConfigError naming the allowed values unless `value` is one of them."""
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def check_positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    """A ConfigError unless `value` is finite and > 0 (>= 0 with allow_zero)."""
    ok = value >= 0 if allow_zero else value > 0
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{key}={value!r} is out of range; it must be {bound}")


TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


@dataclass(frozen=True)
class KeyRule:
    """What one key accepts: a type (int, float, bool or str), optional allowed values and a numeric range."""

    kind: type
    choices: tuple = ()
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    note: str = ""  # appended to the message of a rejected value, e.g. why only L=2 exists

    def allowed(self) -> str:
        if self.choices:
            text = "choose from " + ", ".join(map(str, self.choices))
        elif self.lo is not None and self.hi is not None:
            text = f"allowed: {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        elif self.lo is not None:
            text = f"allowed: {'>' if self.lo_open else '>='} {self.lo:g}"
        else:
            text = f"allowed: {TYPE_NAMES[self.kind]}"
        return f"{text} ({self.note})" if self.note else text

    def in_range(self, x: float) -> bool:
        lo_ok = self.lo is None or (x > self.lo if self.lo_open else x >= self.lo)
        hi_ok = self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)
        return lo_ok and hi_ok

    def check(self, key: str, value: Any) -> None:
        """A ConfigError unless `value` is allowed (choices and range; the type is the search space's concern,
        since Ray Tune may hand a config numpy numbers)."""
        if value is None:
            return
        if self.choices and value not in self.choices:
            raise ConfigError(f"{key}={value!r} is not allowed; {self.allowed()}")
        if self.kind in (int, float) and not self.choices and not (math.isfinite(value) and self.in_range(value)):
            raise ConfigError(f"{key}={value!r} is out of range; {self.allowed()}")


POSITIVE = dict(lo=0, lo_open=True)
NONNEGATIVE = dict(lo=0)
UNIT_INTERVAL = dict(lo=0, hi=1)


@dataclass(frozen=True)
class Rules(Mapping):
    """A study's rules: key -> KeyRule, plus an optional check of one whole point (keys that constrain each
    other, e.g. a PE that acts inside attention needs fusion 'none'). Its message is one line, no source."""

    by_key: Mapping[str, KeyRule]
    check_point: Callable[[Mapping[str, Any]], None] | None = None

    def __getitem__(self, key: str) -> KeyRule:
        return self.by_key[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_key)

    def __len__(self) -> int:
        return len(self.by_key)

    def check(self, values: Mapping[str, Any]) -> None:
        """Every value with a rule, by its rule (the configs' `__post_init__`)."""
        for key, value in values.items():
            if key in self.by_key:
                self.by_key[key].check(key, value)
