"""Real-text benchmark: the text preset's search against a hand-tuned notebook's settings, TF-IDF + logistic
regression, and the paper's recipe, on the corpus in --data-dir. The benchmark lives in benchmarks/real_text.py;
`--help` says what it runs, docs/benchmarks.md what it measured.

    python scripts/bench_real_text.py --data-dir DIR            # the full benchmark
    python scripts/bench_real_text.py --data-dir DIR --quick    # the pipeline checked, 4 samples and 1 epoch
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of benchmarks/

from benchmarks.real_text import main  # noqa: E402
from pefusion.cli.flags import run_main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
