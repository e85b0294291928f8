"""How the benchmarks measure and print: `timed` (wall and CPU seconds of one call), `Side` and
`train_interleaved` (two implementations' steps run in turn, each step clocked to its side) and `emit` (a record
as one JSON line)."""
from __future__ import annotations

import gc
import time
from typing import Callable, Iterator, TextIO

from pefusion.cli.flags import json_line


def timed(fn: Callable[[], object], *, collect: bool = False) -> tuple[object, float, float]:
    """(result, wall seconds, CPU seconds).

    collect=True starts from a collected heap: otherwise the first measurement after the imports pays for a full
    garbage collection over torch's ~10^6 objects (0.1 s here), whatever it times. It is not the default because
    the collection also leaves the CPU caches cold: the student benchmark's vectorised teacher at d = 40 (0.2 ms)
    measures 2-3x slower after one."""
    if collect:
        gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


class Side:
    """One implementation under test: its training steps and the wall/CPU clocks spent in them."""

    def __init__(self, steps: Callable[[int], Iterator[int]]):
        self.steps = steps  # steps(epoch) runs one training step per next() and yields the batch size
        self.wall = self.cpu = 0.0
        self.samples = 0


def train_interleaved(sides: list[Side], epochs: int) -> None:
    """Run the sides' epochs one training step of each in turn, clocking each step (its batch loading included)
    to its side: whatever else the machine runs slows both sides alike."""
    for epoch in range(epochs):
        running = {id(side): (side, side.steps(epoch)) for side in sides}
        while running:
            for key, (side, steps) in list(running.items()):
                wall, cpu = time.perf_counter(), time.process_time()
                n = next(steps, None)
                side.wall += time.perf_counter() - wall
                side.cpu += time.process_time() - cpu
                if n is None:
                    del running[key]
                else:
                    side.samples += n


def rounded(record: dict) -> dict:
    """The record with its floats cut to 4 significant digits (also inside lists and dicts), as the benchmarks
    print them."""
    def cut(v):
        if isinstance(v, float):
            return float(f"{v:.4g}")
        if isinstance(v, (list, tuple)):
            return [cut(x) for x in v]
        return {k: cut(x) for k, x in v.items()} if isinstance(v, dict) else v
    return cut(record)


def emit(record: dict, also: TextIO | None = None) -> None:
    """The record, rounded, as one JSON line on stdout and, with `also`, the same line into that file; flushed:
    a long benchmark's lines appear as they are measured."""
    line = json_line(rounded(record))
    print(line, flush=True)
    if also is not None:
        also.write(line + "\n")
        also.flush()
