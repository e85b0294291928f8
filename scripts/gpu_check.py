"""Check a card: every model the PE-fusion study builds trains and evaluates on it (each PE × fusion pair at the paper
presets' sizes and the text preset's options, auto and fp32, separate and stacked), then a two-run sweep through Ray
and MLflow; one line per case, exit code 1 on any failure. Installed as `pefusion-gpu-check`; the logic is in
pefusion/cli/gpu_check.py.

    python scripts/gpu_check.py                 # on the card
    python scripts/gpu_check.py --device cpu    # the same cases shrunk, about a minute: the command itself works
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of pefusion/

from pefusion.cli.flags import run_main  # noqa: E402
from pefusion.cli.commands import gpu_check_main as main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
