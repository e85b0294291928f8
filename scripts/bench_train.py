"""Training-throughput benchmark: the library's pipeline vs the paper notebook's, side by side.
The benchmark lives in benchmarks/train.py; `--help` says what it measures.

    python scripts/bench_train.py --make-data /tmp/bench_loguniform --n-docs 1000 --length-dist loguniform
    python scripts/bench_train.py --data-dir /tmp/bench_loguniform --max-len 512 --batch-size 32 --json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of benchmarks/

from benchmarks.train import main  # noqa: E402
from pefusion.cli.flags import run_main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
