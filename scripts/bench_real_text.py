"""Real-text benchmark (issue 18): the text preset's search against a hand-tuned notebook's settings, TF-IDF +
logistic regression, and the paper's recipe, on ../shared/data/imdb/small or any --data-dir. The benchmark lives
in benchmarks/real_text.py; `--help` says what it runs.

    python scripts/bench_real_text.py            # about 40 minutes on 2 cores
    python scripts/bench_real_text.py --quick    # a few minutes
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of benchmarks/

from benchmarks.real_text import main  # noqa: E402
from pefusion.cli.flags import run_main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
