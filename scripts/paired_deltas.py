"""Paired-seed deltas against a baseline fusion from the MLflow runs, with their figures (`--help` for every flag);
installed as `pefusion-deltas`. The parser and main are in pefusion/cli/commands.py."""
from pefusion.cli.commands import deltas_main as main
from pefusion.cli.flags import run_main

if __name__ == "__main__":
    run_main(main)
