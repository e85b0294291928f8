"""Learning-rate × batch-size search of study A under ASHA (`--help` for every flag); installed as
`pefusion-search`. The parser and main are in pefusion/cli/commands.py."""
from pefusion.cli.commands import search_main as main
from pefusion.cli.flags import run_main

if __name__ == "__main__":
    run_main(main)
