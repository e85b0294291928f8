"""Stacked seeds against separate trials: the demo grid both ways on this machine, wall times and Table 1 side by
side; or, with `--padding DIR`, the token slots stacked seeds compute per real token in the batch plan of DIR's
training split. The benchmark lives in benchmarks/stacked.py; `--help` says what it measures.

    python scripts/bench_stacked.py
    python scripts/bench_stacked.py --padding DIR
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of benchmarks/

from benchmarks.stacked import main  # noqa: E402
from pefusion.cli.flags import run_main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
