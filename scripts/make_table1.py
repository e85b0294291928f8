"""The summary table (the report's Table 1) from the MLflow runs, as CSV, Markdown and LaTeX (`--help` for every
flag); installed as `pefusion-table1`. The parser and main are in pefusion/cli/commands.py."""
from pefusion.cli.commands import table1_main as main
from pefusion.cli.flags import run_main

if __name__ == "__main__":
    run_main(main)
