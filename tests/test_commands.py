"""The commands as an install without a clone has them: the search spaces are package data, found through
importlib.resources and shipped in the wheel; the installed commands run the sweeps' own mains; `--help` and a
mistyped flag answer before torch, Ray or MLflow load."""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from conftest import REPO, load_script, subprocess_env
from pefusion.cli import commands
from pefusion.cli.flags import ENTRY_POINTS, search_space_path

# sweep -> its default search space, and the presets with a file of their own
SPACES = {"arxiv_grid": "arxiv_grid.yaml", "lr_batch_asha": "lr_batch.yaml", "lambda_cv": "lambda_cv.yaml",
          "phase_diagram": "phase_diagram.yaml"}
MAINS = {"arxiv_grid": commands.grid_main, "lr_batch_asha": commands.search_main,
         "lambda_cv": commands.lambda_cv_main, "phase_diagram": commands.phase_diagram_main}


def test_the_default_search_spaces_are_package_data_found_through_importlib_resources():
    shipped = resources.files("pefusion.search_spaces")
    assert Path(str(shipped)).resolve() == (REPO / "search_spaces").resolve()  # the clone's folder, editable install
    for sweep, name in SPACES.items():
        for preset, file in (("arxiv", name), ("demo", name.replace(".yaml", "_demo.yaml"))):
            args = argparse.Namespace(search_space=None, default_search_space=name, preset=preset)
            assert search_space_path(args) == str(shipped / file), (sweep, preset)
            assert (shipped / file).is_file()
    for preset in ("agnews", "imdb"):  # the paper's Table 1 cells
        args = argparse.Namespace(search_space=None, default_search_space="arxiv_grid.yaml", preset=preset)
        assert search_space_path(args) == str(shipped / f"arxiv_grid_{preset}.yaml")
    mine = argparse.Namespace(search_space="my_space.yaml", default_search_space="lr_batch.yaml", preset="demo")
    assert search_space_path(mine) == "my_space.yaml"


def test_the_wheel_ships_the_search_spaces_and_the_installed_commands(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source)
    for folder in ("pefusion", "search_spaces"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("pefusion-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = z.read(entry_points).decode()
    in_repo = {p.name for p in (REPO / "search_spaces").glob("*.yaml")}
    assert {n.split("/")[-1] for n in names if n.startswith("pefusion/search_spaces/")} - {"__init__.py"} == in_repo
    # pyproject lists the packages (a mapped folder is not discovered): every module of pefusion/ is in the wheel
    modules = {str(p.relative_to(REPO)) for p in (REPO / "pefusion").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules <= names, sorted(modules - names)
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert all(f"{name} = {target}" in scripts for name, target in declared.items()), scripts
    # each sweep's installed command is the one recorded for a main called in-process
    assert {declared[command] for command in ENTRY_POINTS.values()} == {
        f"pefusion.cli.commands:{fn}" for fn in ("grid", "search", "lambda_cv", "phase_diagram")}


@pytest.mark.parametrize("sweep", list(SPACES))
def test_the_sweep_scripts_and_the_installed_commands_run_the_same_main(sweep, monkeypatch, capsys):
    assert load_script(f"sweeps/{sweep}.py").main is MAINS[sweep]
    command = ENTRY_POINTS[sweep]
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"][command]
    monkeypatch.setattr(sys, "argv", [command, "--gpus-per-trial", "x"])
    with pytest.raises(SystemExit) as stop:
        getattr(commands, target.split(":")[1])()
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: --gpus-per-trial 'x'")


# (script, flags, exit code): --help, and input errors caught before the study's wiring loads anything heavy
CASES = [*((f"sweeps/{sweep}.py", ["--help"], 0) for sweep in SPACES), ("scripts/report.py", ["--help"], 0),
         ("scripts/export_model.py", ["--help"], 0), ("scripts/export_model.py", ["--register", "x"], 2),
         ("sweeps/arxiv_grid.py", ["--gpus-per-trial", "x"], 2),
         ("sweeps/arxiv_grid.py", ["--pe-types", "nope"], 2),
         ("sweeps/arxiv_grid.py", ["--cpus-per-trial", "0"], 2),
         ("sweeps/phase_diagram.py", ["--max-concurrent", "-1"], 2),
         ("sweeps/lr_batch_asha.py", ["--no-such-flag"], 2),
         ("sweeps/lambda_cv.py", ["--alphas", "0"], 2)]
PROBE = """
import json, runpy, sys
for script, flags, _ in json.loads(sys.argv[1]):
    sys.argv = [script, *flags]
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code
    print(json.dumps([code, sorted({m.split(".")[0] for m in sys.modules} & {"ray", "torch", "mlflow"})]))
"""


def test_help_and_input_errors_load_neither_torch_ray_nor_mlflow(tmp_path):
    """One interpreter for every case: what one case imports stays in sys.modules, so a case that imports a
    heavy module fails its own line and every later one."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps([[str(REPO / s), f, c] for s, f, c in CASES])],
                          cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    seen = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("[")]
    assert seen == [[code, []] for _, _, code in CASES], proc.stderr[-3000:]
