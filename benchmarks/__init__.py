"""Benchmarks of the library against naive baselines (the paper notebook's pipeline, straightforward student
fits), outside the library so that no user of `pefusion` imports them; `scripts/bench_*.py` are their command
lines.

Importing this package imports `pefusion` first: it sets PyTorch's huge-page switch, which torch reads when it
loads, so every benchmark measures the library as its users run it.
"""
import pefusion  # noqa: F401
