"""Real-text benchmark: does a pefusion search beat a hand-tuned notebook on a corpus this project did not write?

    python scripts/bench_real_text.py --data-dir DIR            # any train/validation/test folder; d 64, 2 layers
    python scripts/bench_real_text.py --data-dir DIR --quick    # 4 samples, 1 epoch

On one corpus and one model size, four ways to a text classifier, in one table (test accuracy, wall time, epochs):

(a) search: `sweeps/lr_batch_asha.py --preset text --search optuna` over search_spaces/lr_batch_text.yaml (16
    samples under ASHA), run as a user runs it, in a subprocess; its result is the test accuracy of the trial with
    the best validation accuracy among those that trained to the end (ASHA's stopped trials are never tested).
(b) notebook: the same model (the text preset) at the five hand-picked lr x batch settings of the 20 Newsgroups
    notebook (lr 1e-3, 1e-4, 5e-3 at batch 64; lr 1e-3 at batch 16 and 256), each trained for the search's epoch
    budget, the best validation epoch tested, as the search's trials are.
(c) tfidf: TF-IDF (unigrams and bigrams, sublinear tf) + logistic regression, C chosen on the validation split:
    the floor any text classifier is judged against.
(d) paper recipe: (a)'s best configuration retrained with the paper's recipe (whitespace split, post-LN + ReLU,
    no final LayerNorm), everything else equal.

Then the ASHA check: on the full validation curves the benchmark has (every (b) run and every (a) trial that
trained to the end), does the rank at ASHA's rungs predict the rank of the best epoch? Spearman's ρ per rung, and
whether the eventual best curve would have survived each rung.

(b) and (d) run in a pool of two processes, one thread each, like the search's two one-CPU trials.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import yaml

from pefusion import record as R
from pefusion.cli.flags import SEARCH_SPACES
from pefusion.data.config import DataConfig
from pefusion.fusion.config import PRESETS, Preset, split_trial_config, trial_data

REPO = Path(__file__).resolve().parents[1]
SEARCH_SPACE = SEARCH_SPACES / "lr_batch_text.yaml"
NOTEBOOK_SETTINGS = ((1e-3, 64), (1e-4, 64), (5e-3, 64), (1e-3, 16), (1e-3, 256))  # (lr, batch), seed 002
PAPER_RECIPE = {"tokenizer": "whitespace", "norm_first": False, "activation": "relu", "final_norm": False}
RUN_NAME = "realtext"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", help="train/validation/test files (JSONL, CSV or Parquet) with text and label columns")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--num-samples", type=int, help="the search's samples (default: 16; 4 with --quick)")
    p.add_argument("--epochs", type=int, help="epochs per run (default: the text preset's; 1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="4 samples and 1 epoch per run: checks the whole pipeline in a few minutes, not its numbers")
    p.add_argument("--workdir", help="where the search writes its runs (default: a temporary folder)")
    p.add_argument("--json-out", help="also write every row and the ASHA check as JSON here")
    args = p.parse_args(argv)
    args.num_samples = args.num_samples or (4 if args.quick else 16)
    args.epochs = args.epochs or (1 if args.quick else None)
    return args


# --quick checks the pipeline, not the numbers: one timed latency pass instead of the preset's 5 + 10 over the test
# split (on IMDB's 5 000 test reviews those take ~50 s per run, more than an epoch of training), as --smoke does.
QUICK_TIMING = {"timing_repeats": 1, "timing_warmup": 0}


def bench_preset(args: argparse.Namespace) -> Preset:
    """The text preset at the benchmark's size, data and epoch budget, without in-trial early stopping (the
    search's protocol: the whole budget, the best validation epoch tested)."""
    base = PRESETS["text"]
    model = dataclasses.replace(base.model, d_model=args.d_model, num_layers=args.num_layers, max_len=args.max_len)
    train = dataclasses.replace(base.train, max_epochs=args.epochs or base.train.max_epochs, early_stopping=False,
                                **(QUICK_TIMING if args.quick else {}))
    data = dataclasses.replace(base.data, data_dir=args.data_dir, max_len=args.max_len)
    return dataclasses.replace(base, model=model, train=train, data=data)


# ---------------------------------------------------------------------------------------------------------
# (a) the search, as a user runs it
# ---------------------------------------------------------------------------------------------------------

def bench_space(args: argparse.Namespace) -> dict[str, Any]:
    """search_spaces/lr_batch_text.yaml with the benchmark's model size (and --quick's timing) as constants."""
    return {**yaml.safe_load(SEARCH_SPACE.read_text()), "d_model": args.d_model, "num_layers": args.num_layers,
            **(QUICK_TIMING if args.quick else {})}


def run_search(args: argparse.Namespace, preset: Preset, space: dict[str, Any],
               workdir: Path) -> tuple[dict[str, Any], list[list[float]]]:
    """(a): the lr_batch_asha sweep in a subprocess; its row and the validation curves of its completed trials."""
    space_file = workdir / "space.yaml"
    space_file.write_text(yaml.safe_dump(space))
    cmd = [sys.executable, str(REPO / "sweeps" / "lr_batch_asha.py"), "--preset", "text", "--data-dir", args.data_dir,
           "--search", "optuna", "--num-samples", str(args.num_samples), "--search-space", str(space_file),
           "--max-len", str(args.max_len), "--max-t", str(preset.train.max_epochs), "--name", RUN_NAME,
           "--storage-path", str(workdir / "ray"), "--out", str(workdir / "results"), "--cache-dir",
           str(workdir / "cache"), "--tracking-uri", f"sqlite:///{workdir / 'mlflow.db'}",
           "--experiment", "bench-real-text", "--no-dashboard", "-q"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=workdir)
    wall = time.perf_counter() - start
    rows = pd.read_csv(workdir / "results" / f"{RUN_NAME}_results_by_seed.csv")
    done = rows[rows[R.STATUS] == R.STATUS_OK]
    best = done.loc[done[R.BEST_VAL_ACC + "_pct"].idxmax()]  # the CSV's accuracies are in percent
    searched = [k for k in space if isinstance(space[k], dict)]
    row = {"run": "(a) search", "setting": ", ".join(f"{k}={_short(best[k])}" for k in searched),
           "test_acc": float(best[R.TEST_ACC + "_pct"]) / 100,
           "best_val_acc": float(best[R.BEST_VAL_ACC + "_pct"]) / 100, "wall_s": wall,
           "epochs": int(rows[R.EPOCHS_RUN].sum()), "trials": len(rows), "completed": len(done),
           "config": {k: _plain(best[k]) for k in space if k in best}}
    return row, _completed_curves(workdir / "ray" / RUN_NAME, preset.train.max_epochs)


def _completed_curves(experiment: Path, epochs: int) -> list[list[float]]:
    """Per-epoch validation accuracy of each trial that reported every epoch of the budget (Ray's result.json)."""
    curves = []
    for result in sorted(experiment.glob("*/result.json")):
        reports = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
        curve = [r[R.VAL_ACC] for r in reports if R.TEST_ACC not in r and R.VAL_ACC in r]
        if len(curve) == epochs:
            curves.append(curve)
    return curves


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


# ---------------------------------------------------------------------------------------------------------
# (b), (d): single trainings, two at a time
# ---------------------------------------------------------------------------------------------------------

def train_one(name: str, setting: str, config: dict[str, Any], preset: Preset) -> dict[str, Any]:
    """One training of `config` over `preset` on one thread: its row and its validation curve."""
    import torch

    from pefusion.data.corpus import load_corpus
    from pefusion.fusion.training import train_and_evaluate

    torch.set_num_threads(1)
    start = time.perf_counter()
    model, train = split_trial_config(config, preset)
    corpus = load_corpus(trial_data(config, preset))
    curve: list[float] = []
    record = train_and_evaluate(model, train, corpus, length_edges=preset.data.length_edges,
                                on_epoch=lambda metrics, trainer: curve.append(metrics[R.VAL_ACC]))
    return {"run": name, "setting": setting, "test_acc": record[R.TEST_ACC], "best_val_acc": record[R.BEST_VAL_ACC],
            "wall_s": time.perf_counter() - start, "epochs": record[R.EPOCHS_RUN], "curve": curve}


def notebook_jobs(constants: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(b): the notebook's five lr x batch settings on the search space's constants (the same model)."""
    return [("(b) notebook", f"lr={lr:g}, batch_size={bs}", {**constants, "lr": lr, "batch_size": bs})
            for lr, bs in NOTEBOOK_SETTINGS]


def paper_job(best: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(d): (a)'s best configuration with the paper's tokeniser and encoder stack."""
    return ("(d) paper recipe", "(a)'s best, whitespace + post-LN/ReLU", {**best, **PAPER_RECIPE})


# ---------------------------------------------------------------------------------------------------------
# (c) TF-IDF + logistic regression
# ---------------------------------------------------------------------------------------------------------

def tfidf_baseline(data: DataConfig) -> dict[str, Any]:
    """(c): TF-IDF of unigrams and bigrams (sublinear tf, min_df 2) + logistic regression, C chosen on the
    validation split from 0.3 to 30; read through pefusion's own reader, so labels and splits are the same."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from pefusion.data.readers import map_labels

    start = time.perf_counter()
    raw, class_names = data.source.read()
    labels, _ = map_labels(raw, data.label_column, class_names)
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    x_train = vectorizer.fit_transform(raw["train"].texts)  # fitted on the training split only
    x_val, x_test = (vectorizer.transform(raw[s].texts) for s in ("validation", "test"))
    fits = [(LogisticRegression(C=c, max_iter=2000).fit(x_train, labels["train"]), c) for c in (0.3, 1, 3, 10, 30)]
    model, c = max(fits, key=lambda fit: fit[0].score(x_val, labels["validation"]))
    return {"run": "(c) tfidf + logreg", "setting": f"C={c:g}", "test_acc": model.score(x_test, labels["test"]),
            "best_val_acc": model.score(x_val, labels["validation"]), "wall_s": time.perf_counter() - start,
            "epochs": None}


# ---------------------------------------------------------------------------------------------------------
# The ASHA check and the table
# ---------------------------------------------------------------------------------------------------------

def asha_check(curves: list[list[float]], grace: int = 1, eta: float = 3.0) -> list[dict[str, Any]]:
    """For each of ASHA's rungs (grace, grace·η, ...) within the curves: Spearman's ρ between the validation
    accuracy at the rung and the curve's best, and whether the curve with the best final score ranks in the top
    1/η at that rung (ASHA keeps those)."""
    from scipy.stats import spearmanr

    if len(curves) < 3:
        return []
    arr = np.array(curves)  # (curves, epochs)
    best = arr.max(axis=1)
    winner = int(best.argmax())
    out, rung = [], grace
    while rung < arr.shape[1]:
        at = arr[:, rung - 1]
        keep = max(1, int(len(at) / eta))
        out.append({"rung_epoch": rung, "curves": len(arr), "spearman": float(spearmanr(at, best).statistic),
                    "best_survives": bool(winner in np.argsort(-at, kind="stable")[:keep])})
        rung = int(rung * eta)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| run | setting | test acc | best val acc | wall | epochs |", "|---|---|---|---|---|---|"]
    for r in rows:
        epochs = "–" if r["epochs"] is None else str(r["epochs"])
        lines.append(f"| {r['run']} | {r['setting']} | {100 * r['test_acc']:.2f} % | {100 * r['best_val_acc']:.2f} % "
                     f"| {r['wall_s']:.0f} s | {epochs} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from pefusion.errors import ConfigError

    args = parse_args(argv)
    if args.data_dir is None:
        raise ConfigError("give --data-dir DIR: a folder with train/validation/test files with text and label columns")
    if not Path(args.data_dir).is_dir():
        raise ConfigError(f"--data-dir {args.data_dir} is not a directory with train/validation/test files")
    space = bench_space(args)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-real-text-") as tmp:
        workdir = Path(args.workdir or tmp).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        preset = bench_preset(args)
        preset = dataclasses.replace(preset, data=dataclasses.replace(preset.data, cache_dir=str(workdir / "cache")))
        tfidf = tfidf_baseline(preset.data)
        print(f"(c) done: {100 * tfidf['test_acc']:.2f} %", flush=True)
        search, curves = run_search(args, preset, space, workdir)
        print(f"(a) done: {100 * search['test_acc']:.2f} % ({search['setting']})", flush=True)
        constants = {k: v for k, v in space.items() if not isinstance(v, dict)}  # the model, not (a)'s choices
        jobs = notebook_jobs(constants) + [paper_job(search["config"])]
        with ProcessPoolExecutor(2) as pool:
            trained = list(pool.map(train_one, *zip(*jobs), [preset] * len(jobs)))
    notebook = trained[:-1]
    curves += [r["curve"] for r in notebook if len(r["curve"]) == preset.train.max_epochs]
    rows = [search, *notebook, tfidf, trained[-1]]
    check = asha_check(curves)
    print(f"\n{table(rows)}\n")
    best_b = max(notebook, key=lambda r: r["test_acc"])
    print(f"(a) - best of (b): {100 * (search['test_acc'] - best_b['test_acc']):+.2f} points; (a) - (d): "
          f"{100 * (search['test_acc'] - trained[-1]['test_acc']):+.2f} points; (c) - (a): "
          f"{100 * (tfidf['test_acc'] - search['test_acc']):+.2f} points")
    for c in check:
        print(f"ASHA check, rung at epoch {c['rung_epoch']} ({c['curves']} full curves): Spearman rho "
              f"{c['spearman']:+.2f} between accuracy there and the best epoch's; the eventual best "
              f"{'survives' if c['best_survives'] else 'is stopped'}")
    print(f"total wall time: {time.perf_counter() - started:.0f} s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "asha_check": check}, indent=1, default=_plain))
    return 0
