"""Every figure the MLflow runs allow, as PNG and PDF (`--help` for every flag); installed as `pefusion-figures`.
The parser and main are in pefusion/cli/commands.py."""
from pefusion.cli.commands import figures_main as main
from pefusion.cli.flags import run_main

if __name__ == "__main__":
    run_main(main)
