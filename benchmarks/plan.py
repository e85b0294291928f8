"""Benchmark `--plan` against the sweep it plans, as a user meets both: whole commands. Each sweep command is run
with `--plan`, then run for real in a temporary folder (its own Ray experiment, sqlite MLflow store and result
CSVs), and its `--plan` estimate of the command's wall time is put beside the wall time the command took, from
the process's start to its exit; beside that, the estimate of the sweep's own wall against what the sweep recorded
on its MLflow parent run (`sweep_wall_s`, what the report compares).

    python scripts/bench_plan.py                         # the three demo sweeps, one after another
    python scripts/bench_plan.py --only phase_diagram --json

The demo grid runs with early stopping on, as its preset does, so its estimate is "at most"; a GD fit that reaches
its fixed point ends early, so the student sweeps' are too. Run it on an idle machine: the estimate is timed at one
moment and the sweep runs at another, and other work on the cores moves both.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from pefusion import record as R
from pefusion.cli.flags import print_result

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "demo_grid": ["sweeps/arxiv_grid.py", "--preset", "demo", "--seeds", "0"],
    "phase_diagram": ["sweeps/phase_diagram.py", "--preset", "demo"],
    "lambda_cv": ["sweeps/lambda_cv.py", "--preset", "demo"],
}
_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "days": 86400.0}


def seconds_of(said: str) -> float:
    """The seconds of a duration as the plan prints it (`pefusion.sweep.plan.duration`): '0.4 s', '45 s',
    '12 min 5 s', '3 h 20 min', '2.5 days'."""
    parts = re.findall(r"([\d.]+) (days|min|s|h)\b", said)
    if not parts:
        raise ValueError(f"not a duration: {said!r}")
    return sum(float(n) * _UNITS[unit] for n, unit in parts)


def planned(lines: str) -> dict[str, float]:
    """The command's and the sweep's wall time from the plan's lines."""
    found = re.search(r"wall (?:at most )?(.+?) for the command, of which the sweep (?:at most )?(.+?) \(", lines)
    if not found:
        raise ValueError(f"no wall time in the plan's lines:\n{lines}")
    return {"command_s": seconds_of(found.group(1)), "sweep_s": seconds_of(found.group(2))}


def compare(name: str, argv: Sequence[str]) -> dict[str, Any]:
    """`argv --plan`, then `argv` timed, in a temporary folder; the estimates beside the measurements."""
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as tmp:
        flags = ["--storage-path", f"{tmp}/ray", "--tracking-uri", f"sqlite:///{tmp}/mlflow.db", "--out",
                 f"{tmp}/results"]
        command = [sys.executable, *(str(REPO / argv[0]), *argv[1:]), *flags]
        plan = subprocess.run([*command, "--plan"], capture_output=True, text=True, cwd=tmp, check=True)
        estimate = planned(plan.stdout)
        start = time.perf_counter()
        sweep = subprocess.run(command, capture_output=True, text=True, cwd=tmp)
        took = time.perf_counter() - start
        if sweep.returncode != 0:
            raise RuntimeError(f"{name}: the sweep exited {sweep.returncode}: {sweep.stderr[-2000:]}")
        parent = re.search(r"parent run ([0-9a-f]{32})", sweep.stdout).group(1)
        recorded = MlflowClient(f"sqlite:///{tmp}/mlflow.db").get_run(parent).data.metrics[R.SWEEP_WALL_S]
    return {"sweep": name, "command": " ".join(argv), "plan_command_s": estimate["command_s"],
            "command_s": round(took, 1), "command_over_plan": round(took / estimate["command_s"], 3),
            "plan_sweep_s": estimate["sweep_s"], "sweep_wall_s": round(recorded, 1),
            "sweep_over_plan": round(recorded / estimate["sweep_s"], 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(COMMANDS), action="append",
                        help="this sweep only (repeatable; default: all three)")
    parser.add_argument("--json", action="store_true", help="one JSON line per sweep")
    args = parser.parse_args(argv)
    for name in args.only or COMMANDS:
        print_result(compare(name, COMMANDS[name]), args.json)
    return 0
