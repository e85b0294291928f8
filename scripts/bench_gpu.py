"""GPU training benchmark: samples/s, tokens/s, peak memory, fp32 vs bf16, the attention kernel, latency
and K trials packed on one GPU, for the arxiv and agnews_imdb models and each fusion; one JSON line per
configuration. Needs torch and this package only. The benchmark lives in benchmarks/gpu/; `--help` says what
each line holds.

    python scripts/bench_gpu.py --json-out gpu.jsonl
    python scripts/bench_gpu.py --device cpu --tiny      # a smoke run of seconds, not a measurement
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of benchmarks/

from benchmarks.gpu.command import main  # noqa: E402
from pefusion.cli.flags import run_main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
