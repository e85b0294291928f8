"""The PE × fusion × seed grid of study A (`--help` for every flag); installed as `pefusion-grid`. The parser and
main are in pefusion/cli/commands.py."""
from pefusion.cli.commands import grid_main as main
from pefusion.cli.flags import run_main

if __name__ == "__main__":
    run_main(main)
