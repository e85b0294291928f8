"""docs/cli.md holds what the commands do: its command table names every installed command of pyproject.toml (and
no other), each beside the script that runs the same main, and every flag the page names is a flag of some
command's `--help`."""
from __future__ import annotations

import re
import tomllib

from conftest import REPO, help_text, load_script
from pefusion.cli import commands

CLI_MD = REPO / "docs" / "cli.md"
ROW = re.compile(r"^\| `python ((?:sweeps|scripts)/\w+\.py)` \| `(pefusion-[\w-]+)` \|", re.M)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
OTHER_TOOLS = re.compile(r"`(?:pip|mlflow|ray|ssh|mkdocs) [^`]*`")  # their flags are theirs, not ours


def _installed() -> dict[str, str]:
    """pyproject's [project.scripts]: command -> function of pefusion.cli.commands."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert all(target.startswith("pefusion.cli.commands:") for target in scripts.values()), scripts
    return {command: target.split(":")[1] for command, target in scripts.items()}


def _table() -> dict[str, str]:
    rows = ROW.findall(CLI_MD.read_text())
    assert rows, "docs/cli.md has no command table"
    return {command: script for script, command in rows}


def test_the_command_table_is_pyprojects_installed_commands():
    assert sorted(_table()) == sorted(_installed())


def test_each_script_and_its_installed_command_run_the_same_main():
    installed = _installed()
    for command, script in _table().items():
        main = commands.MAINS[installed[command]]
        assert load_script(script).main is main, (script, command)


def test_every_flag_docs_cli_names_is_a_flag_of_some_command():
    helps = {name: help_text(main) for name, main in commands.MAINS.items()}
    known = {flag for text in helps.values() for flag in FLAG.findall(text)}
    named = set(FLAG.findall(OTHER_TOOLS.sub("", CLI_MD.read_text())))
    assert named, "docs/cli.md names no flag"
    assert sorted(named - known) == [], "flags named in docs/cli.md that no command's --help shows"
