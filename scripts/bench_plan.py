"""`--plan` against the sweep it plans, whole commands: the three demo sweeps. The benchmark lives in
benchmarks/plan.py; `--help` says what it measures.

    python scripts/bench_plan.py --json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of benchmarks/

from benchmarks.plan import main  # noqa: E402
from pefusion.cli.flags import run_main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
