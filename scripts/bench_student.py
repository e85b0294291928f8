"""Benchmarks of the student-attention library against straightforward implementations, single core.
The benchmarks live in benchmarks/student.py, which says what they measure.

    python scripts/bench_student.py                    # the three measurements, one JSON line each
    python scripts/bench_student.py --naive-iters 500  # time 500 naive steps and extrapolate to 5 000 (said so)
    python scripts/bench_student.py --only authors     # our d = 1000 fits beside the authors' released data
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of benchmarks/

from benchmarks.student import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
