"""`python scripts/gpu_check.py`: does everything the project trains run on this machine's card?

Every model case of the PE-fusion study (`pefusion.fusion.check`: each PE × fusion pair at the two paper presets'
sizes and the `text` preset's options, each precision, separate and as S = 2 stacked seeds; per size, 5 stacked
seeds and ALiBi across long padding; every weight and validation loss finite after each; the training steps
watched for host-device synchronisations), then a grid sweep of
two runs through Ray and MLflow (`SWEEP_ARGS`: the demo preset's sinusoidal+add cell, seeds 0 and 1, one epoch; the
`auto` GPU probe and every other flag at its default), in a temporary folder that is removed after. One line per case, `ok` or the error's last line, and
exit code 1 when any failed. With `--device cpu` the same cases run shrunk (`--smoke` sizes) and the sweep sees no
GPU: a check that the command itself works, run by the test suite.

This module may import both the study and the sweep's command line; the study's cases know nothing of sweeps.
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch

import pefusion
from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.fusion.check import SyncCount, batch_note, cases, precisions, run_cases
from pefusion.fusion.device import (bf16_supported, compute_dtype, cudnn_self_test, device_name,
                                    resolve_precision)

# Two runs of the demo grid: the model cases cover every pair already; the sweep checks Ray, MLflow, the GPU probe
# and stacking's default on the card.
SWEEP_ARGS = ("--preset", "demo", "--pe-types", "sinusoidal", "--fusions", "add", "--seeds", "0,1", "--epochs", "1",
              "--no-dashboard")  # the check needs no dashboard, so it runs where Ray's cannot start
SWEEP_TIMEOUT_S = 600
SWEEP_NAME = "sweep      demo sinusoidal+add seeds 0,1, 1 epoch, Ray + MLflow"
# What to compare a card run with (printed on a GPU).
ON_A_CARD = """\
Every line above ok, with 0 syncs per training step, means the card trains every case. How fast it trains, to
compare with the H200's numbers in docs/benchmarks.md (GPU):
  python scripts/bench_gpu.py --fusions add --attention policy,efficient --packing 1 --stacked 0 --json-out gpu.jsonl
Stacked seeds against one trial and against packed separate trials: docs/gpus.md, "Stacked seeds on a card"."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:2]))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (the default): the paper's sizes on the card; cpu: the same cases shrunk, and a "
                         "sweep that sees no GPU (about a minute)")
    return ap.parse_args(argv)


def sweep_check(device: str) -> str:
    """Run the two-run sweep in a fresh process and a temporary folder (its MLflow store, Ray results and CSVs
    there): 'ok' when it exits 0 and every run of its results CSV is ok, else the last line it wrote."""
    code = "from pefusion.cli.commands import grid_main; from pefusion.cli.flags import run_main; run_main(grid_main)"
    root = str(Path(pefusion.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the folder's store, not a server
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # nothing of the check on the card
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as folder:
        try:
            proc = subprocess.run([sys.executable, "-c", code, *SWEEP_ARGS], cwd=folder, env=env, text=True,
                                  capture_output=True, timeout=SWEEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"timed out after {SWEEP_TIMEOUT_S} s"
        lines = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        if proc.returncode != 0:
            return f"exit code {proc.returncode}: {lines[-1] if lines else 'no output'}"
        rows = [row for path in Path(folder, "results").glob("*_results_by_seed.csv")
                for row in csv.DictReader(path.open())]
        statuses = sorted(row[R.STATUS] for row in rows)
        if statuses != [R.STATUS_OK, R.STATUS_OK]:
            return f"runs ended {statuses or 'without a results CSV'}, not [ok, ok]"
    return "ok"


def self_test_line(device: torch.device) -> str:
    """The outcome of cuDNN's attention self-test in each dtype the cases compute in (run once per process)."""
    if device.type != "cuda":
        return "cuDNN attention self-test: none on a CPU"
    dtypes = dict.fromkeys(compute_dtype(resolve_precision(p, "cuda", bf16_supported(device)))
                           for p in precisions(device))
    outcomes = [f"{str(d).removeprefix('torch.')} {cudnn_self_test(device, d) or 'passed'}" for d in dtypes]
    return f"cuDNN attention self-test: {'; '.join(outcomes)}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; on a machine without a card use --device cpu")
    device, tiny = torch.device(args.device), args.device == "cpu"
    if tiny:
        torch.set_num_threads(1)  # models of --smoke size gain nothing from more threads
    todo = cases(device)
    print(f"gpu_check on {device_name(device)}, torch {torch.__version__}: {len(todo)} model cases"
          f"{' (shrunk)' if tiny else ''}, then a sweep", flush=True)
    print(batch_note(tiny), flush=True)
    print(self_test_line(device), flush=True)
    start, failed, syncs = time.monotonic(), 0, SyncCount(device)
    for done in run_cases(device, tiny, syncs):
        failed += done.outcome != "ok"
        kernels = ", ".join(f"{k} {n}" for k, n in sorted(done.kernels.items()))
        print(f"{done.case.name}{f'  [attention: {kernels}]' if kernels else ''}  {done.outcome}", flush=True)
    cases_s = time.monotonic() - start
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the sweep's trials share the card with this process
    outcome = sweep_check(args.device)
    failed += outcome != "ok"
    print(f"{SWEEP_NAME}  {outcome}", flush=True)
    print(f"{failed} of {len(todo) + 1} failed; {time.monotonic() - start:.0f} s (cases {cases_s:.0f} s); "
          f"{syncs.summary()}", flush=True)
    if device.type == "cuda":
        print(ON_A_CARD)
    return 1 if failed else 0
