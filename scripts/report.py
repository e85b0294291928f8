"""One self-contained HTML page for a sweep, its CSVs and figures, logged to its MLflow parent run (`--help` for
every flag); installed as `pefusion-report`. The parser and main are in pefusion/cli/commands.py."""
from pefusion.cli.commands import report_main as main
from pefusion.cli.flags import run_main

if __name__ == "__main__":
    run_main(main)
