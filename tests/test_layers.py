"""The layers of the house, checked from the code's imports by import-linter against the contracts of
pyproject.toml's `[tool.importlinter]`: no import cycle in any package, the house's layers and the sweep engine's
in order, no study importing the analysis, the engine importing no study, the analysis writing nothing to MLflow,
no benchmark running a study's command. Imports inside a function and under `TYPE_CHECKING` count like any other.

Each contract is also seen breaking, on a copy of the source with one import planted where its rule forbids it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGES = ("pefusion", "benchmarks")


def lint(root: Path, contract: str | None = None) -> subprocess.CompletedProcess:
    """`lint-imports` over the packages under `root` with the contracts of its pyproject.toml (or the one with
    id `contract`); the packages are read from `root` (the interpreter's path starts at its working folder)."""
    command = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
               "--no-cache", "--no-logo", *(["--contract", contract] if contract else [])]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})  # a contract's name on one line


def test_the_house_keeps_its_import_contracts():
    run = lint(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout and "Contracts: 7 kept" in run.stdout, run.stdout


# contract id -> (file, the planted import, a line of what the broken contract must say)
TYPE_ONLY = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    {}\n"
IN_A_FUNCTION = "def _planted():\n    {}\n"
PLANTS = {
    # a type-only back edge: corpus imports config, and config now corpus
    "no-cycles": ("pefusion/data/config.py", TYPE_ONLY.format("from pefusion.data.corpus import load_corpus"),
                  ".config -> .corpus"),
    "house": ("pefusion/data/cache.py", IN_A_FUNCTION.format("from pefusion.tracking.store import check_tracking"),
              "pefusion.data.cache -> pefusion.tracking.store"),
    "engine": ("pefusion/sweep/console.py", IN_A_FUNCTION.format("from pefusion.sweep.gpus import cuda_card"),
               "pefusion.sweep.console -> pefusion.sweep.gpus"),
    "studies-below-analysis": ("pefusion/student/point.py",
                               IN_A_FUNCTION.format("from pefusion.analysis.formats import csv_ready"),
                               "pefusion.student.point -> pefusion.analysis.formats"),
    "engine-knows-no-study": ("pefusion/tracking/trials.py",
                              TYPE_ONLY.format("from pefusion.fusion.config import Preset"),
                              "pefusion.tracking.trials -> pefusion.fusion.config"),
    "analysis-reads": ("pefusion/analysis/compute.py",
                       IN_A_FUNCTION.format("from pefusion.tracking.recorder import SweepRecorder"),
                       "pefusion.analysis.compute -> pefusion.tracking.recorder"),
    "benchmarks-no-study-commands": ("benchmarks/timing.py",
                                     IN_A_FUNCTION.format("from pefusion.cli.fusion import run_arxiv_grid"),
                                     "benchmarks.timing -> pefusion.cli.fusion"),
}


@pytest.mark.parametrize("contract", sorted(PLANTS))
def test_each_contract_breaks_on_a_planted_import(tmp_path, contract):
    """The contract kept by the source as it is, and broken, naming the import, once one import is planted."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    assert lint(tmp_path, contract).returncode == 0
    file, planted, said = PLANTS[contract]
    with (tmp_path / file).open("a") as source:
        source.write("\n\n" + planted)
    run = lint(tmp_path, contract)
    assert run.returncode == 1 and "BROKEN" in run.stdout, run.stdout + run.stderr
    assert said in run.stdout, run.stdout
