"""User-caused configuration problems: `ConfigError` and the value checks every config's `__post_init__` uses.

A `ConfigError` message is one line that names the key and the fix; command lines (pefusion.cli) turn it into
`error: <line>` on stderr and exit code 2, before Ray starts.
"""
from __future__ import annotations

import math
from typing import Any, Iterable


class ConfigError(ValueError):
    """A user-caused configuration problem. Its message is one line that names the key and the fix."""


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
