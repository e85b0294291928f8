"""Phase diagram of the student attention model, study B (`--help` for every flag); installed as `pefusion-phase`.
The parser and main are in pefusion/cli/commands.py."""
from pefusion.cli.commands import phase_diagram_main as main
from pefusion.cli.flags import run_main

if __name__ == "__main__":
    run_main(main)
