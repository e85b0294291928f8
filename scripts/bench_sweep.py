"""Benchmark the sweep engine: a grid on Ray Tune with N concurrent one-CPU trials against the same trials run one
after another in one process (the naive way), and Ray's per-trial scheduling overhead.

    python scripts/bench_sweep.py --preset demo                         # the whole demo grid (60 trials)
    python scripts/bench_sweep.py --preset demo --seeds 0 --json        # 20 trials, one JSON line

Prints wall-clock seconds of both, their ratio (sequential / Ray), and the overhead per trial:
(Ray wall × concurrency − Σ time inside the trials) / trials, i.e. what scheduling, process start-up, result
reporting, checkpointing and MLflow logging add to each trial.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of benchmarks/

from benchmarks.sweep import main  # noqa: E402
from pefusion.cli.flags import run_main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
