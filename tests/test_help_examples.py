"""Every example a command's `--help` shows parses: each command line in it (`python sweeps/…`, `python scripts/…`,
`pefusion-…`) with the parser of the command it names, and each flag's `e.g. --flag VALUE` with the parser of the
command whose help gives it. Parsing only: the command is stopped right after argparse accepts the line."""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import tomllib

import pytest

from conftest import REPO, help_text, load_script
from pefusion.cli import commands

EXAMPLE = re.compile(r"^\s*((?:python (?:sweeps|scripts)/\w+\.py|pefusion-[\w-]+)(?: .*)?)$", re.M)
FLAG_EXAMPLE = re.compile(r"e\.g\.\s+(--[a-z][\w-]*)(?:\s+([^\s;)-][^\s;)]*))?")


class Parsed(Exception):
    """Raised in place of running the command once its flags parsed."""


def _mains() -> dict[str, object]:
    """Each way an example names a command -> its main."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    by_name = {name: commands.MAINS[target.split(":")[1]] for name, target in scripts.items()}
    for folder in ("sweeps", "scripts"):
        for path in sorted((REPO / folder).glob("*.py")):
            module = load_script(f"{folder}/{path.name}")
            if hasattr(module, "main"):
                by_name[f"python {folder}/{path.name}"] = module.main
    return by_name


def _parses(main, argv: list[str], monkeypatch) -> None:
    """Run `main(argv)` up to its top-level parse_args: argparse's error (exit 2) fails the test."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), pytest.raises(Parsed):
            main(argv)
    except SystemExit:
        raise AssertionError(err.getvalue().strip().splitlines()[-1]) from None
    finally:
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", original)
    assert not err.getvalue(), err.getvalue()


def _examples() -> list[tuple[str, str]]:
    found = []
    for name, main in commands.MAINS.items():
        text = help_text(main)
        found += [(name, m.group(1)) for m in EXAMPLE.finditer(text)]
        found += [(name, "flag " + " ".join(g.rstrip(",.") for g in m.groups() if g))
                  for m in FLAG_EXAMPLE.finditer(text)]
    return found


def test_the_helps_show_examples():
    examples = _examples()
    assert len(examples) >= 25 and {name for name, _ in examples} >= {"grid", "search", "report", "data"}


def test_every_example_in_every_help_parses(monkeypatch):
    mains = _mains()
    failures = []
    for name, line in _examples():
        if line.startswith("flag "):  # `e.g. --flag VALUE` in a flag's help: a flag of this command
            main, argv = commands.MAINS[name], shlex.split(line[5:])
        else:
            words = shlex.split(line.split("  #")[0].split(" # ")[0])
            command = " ".join(words[:2]) if words[0] == "python" else words[0]
            if command not in mains:
                failures.append(f"{name}: {line!r} names no command")
                continue
            main, argv = mains[command], words[2:] if words[0] == "python" else words[1:]
        try:
            _parses(main, argv, monkeypatch)
        except (AssertionError, SystemExit, pytest.fail.Exception) as e:
            failures.append(f"{name}: {line!r}: {e}")
    assert failures == []
