"""A finished PE-fusion trial run's best model as an MLflow model that classifies raw text (`--help` for every
flag); installed as `pefusion-export`. The parser and main are in pefusion/cli/commands.py."""
from pefusion.cli.commands import export_main as main
from pefusion.cli.flags import run_main

if __name__ == "__main__":
    run_main(main)
