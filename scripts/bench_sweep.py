"""Sweep-engine benchmark: a grid on Ray Tune against the same trials one after another, and Ray's overhead per
trial. The benchmark lives in benchmarks/sweep.py; `--help` says what it measures.

    python scripts/bench_sweep.py --preset demo --seeds 0 --json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of benchmarks/

from benchmarks.sweep import main  # noqa: E402
from pefusion.cli.flags import run_main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
