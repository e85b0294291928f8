"""Benchmark stacked seeds on this machine: the demo grid (or any preset's grid) run as separate trials and with
its seeds stacked (`--stack-seeds`: each cell's seeds trained together in one trial), in the same Ray cluster,
in turn, `--rounds` times (alternating which goes first, since this VM's speed drifts over minutes).

    python scripts/bench_stacked.py                     # the demo grid, 2 rounds
    python scripts/bench_stacked.py --fusions add,concat --rounds 1
    python scripts/bench_stacked.py --padding DIR       # the batch plan's padding on DIR's training split only

Prints one JSON line per sweep (wall seconds), one per round (stacked / separate wall time), and Table 1 of the
last round's two sweeps side by side, each cell with whether the stacked mean lies within the seeds' spread of
the separate one (|Δ mean| ≤ SD separate + SD stacked): stacked seeds draw other dropout masks than separate
trials, so the cells differ by seed noise, not more.

`--padding DIR` measures no time: from the batch plan of one training epoch of DIR's training split (whitespace
tokens, at most 512 a document, batches of 64, as the agnews_imdb preset trains), the token slots that 1, 3 and 5
stacked seeds compute per real token, with widths rounded to 64 (a card's batches; the seeds share the order of
widths) and unrounded (a CPU's), each against a separate trial's: one JSON line per (pad multiple, seeds).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

import numpy as np

from benchmarks.timing import emit
from pefusion import record as R
from pefusion.cli.flags import SEARCH_SPACES, add_grid_flags, add_preset_flag
from pefusion.fusion.config import PRESETS
from pefusion.fusion.config import RULES as PEFUSION_RULES
from pefusion.sweep.space import load_search_space

SPACE = SEARCH_SPACES / "arxiv_grid_demo.yaml"


def sweep(preset_name: str, space, corpus, stack: bool, folder: Path, concurrency: int) -> dict[str, Any]:
    """One grid through the sweep driver, as `sweeps/arxiv_grid.py` runs it: (wall seconds, its rows)."""
    from pefusion.fusion.study import pefusion_study
    from pefusion.sweep.driver import run_sweep
    from pefusion.sweep.options import SweepOptions

    opts = SweepOptions(sweep="arxiv_grid", experiment="bench-stacked", storage_path=str(folder / "ray"),
                        cpus_per_trial=1.0, gpus_per_trial=0.0, max_concurrent=concurrency, dashboard=False,
                        verbose=0, progress=False, stack=stack, tracking_uri=f"sqlite:///{folder}/mlflow.db")
    folder.mkdir(parents=True)
    study = pefusion_study("arxiv_grid", preset_name, PRESETS[preset_name], space, 1.0, corpus=corpus)
    start = time.perf_counter()
    rows = run_sweep(study, opts, folder / "results").rows
    return {"wall_s": time.perf_counter() - start, "rows": rows}


def side_by_side(separate: pd.DataFrame, stacked: pd.DataFrame) -> pd.DataFrame:
    """Table 1's cells (test accuracy %, mean and SD over seeds) of both sweeps, and whether they agree within
    the seeds' spread."""
    def cells(rows: pd.DataFrame) -> pd.DataFrame:
        ok = rows[rows[R.STATUS] == R.STATUS_OK]
        return ok.groupby([R.PE_TYPE, R.FUSION])[R.TEST_ACC].agg(["mean", "std"]) * 100

    table = cells(separate).join(cells(stacked), lsuffix="_separate", rsuffix="_stacked")
    table["within_spread"] = (table["mean_stacked"] - table["mean_separate"]).abs() <= \
        table["std_separate"] + table["std_stacked"]
    return table.round(2).reset_index()


PADDING_MAX_LEN, PADDING_BATCH, PADDING_SEEDS = 512, 64, (1, 3, 5)


def padding_lines(data_dir: Path) -> list[dict[str, Any]]:
    """The `--padding` lines: tokens computed per real token in one epoch of `data_dir`'s training split."""
    from pefusion.data.readers import find_split_files, read_data_file
    from pefusion.data.tokenizer import whitespace_words
    from pefusion.fusion.stacked import computed_per_real_token

    texts = [t for path in find_split_files(data_dir)["train"] for t in read_data_file(path, "text", "label")[0]]
    lengths = np.minimum([len(whitespace_words(t)) for t in texts], PADDING_MAX_LEN).astype(np.int64)
    lines = []
    for multiple in (64, 1):
        separate = computed_per_real_token(lengths, PADDING_BATCH, [0], multiple, PADDING_MAX_LEN)
        for seeds in PADDING_SEEDS:
            ratio = computed_per_real_token(lengths, PADDING_BATCH, list(range(seeds)), multiple, PADDING_MAX_LEN)
            lines.append({"bench": "stacked_padding", "documents": len(lengths), "batch_size": PADDING_BATCH,
                          "max_len": PADDING_MAX_LEN, "pad_multiple": multiple, "seeds": seeds,
                          "computed_per_real_token": ratio, "over_separate": ratio / separate})
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_flag(parser, default="demo", presets=PRESETS)
    add_grid_flags(parser)  # default: the demo grid's
    parser.add_argument("--rounds", type=int, default=2, help="separate and stacked sweeps per variant")
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once, one CPU each")
    parser.add_argument("--padding", type=Path, metavar="DIR",
                        help="only the batch plan's padding on DIR's training split (no sweep, no Ray)")
    args = parser.parse_args(argv)
    if args.padding is not None:
        for line in padding_lines(args.padding):
            emit(line)
        return 0

    from pefusion.data.corpus import load_corpus
    from pefusion.sweep.options import SweepOptions
    from pefusion.sweep.cluster import start_ray

    space = load_search_space(SPACE, PEFUSION_RULES)
    for key, values in ((R.PE_TYPE, args.pe_types), (R.FUSION, args.fusions), (R.SEED, args.seeds)):
        if values:
            space = space.override_values(key, values)
    corpus = load_corpus(PRESETS[args.preset].data)
    start_ray(SweepOptions(sweep="bench", num_cpus=args.concurrency, dashboard=False, verbose=0))
    last: dict[bool, pd.DataFrame] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            walls = {}
            for stack in ((False, True) if round_ % 2 == 0 else (True, False)):
                done = sweep(args.preset, space, corpus, stack, Path(tmp) / f"{round_}-{stack}", args.concurrency)
                walls[stack], last[stack] = done["wall_s"], done["rows"]
                emit({"bench": "sweep", "round": round_, "stacked": stack, "runs": len(done["rows"]),
                      "failed": int((done["rows"][R.STATUS] != R.STATUS_OK).sum()), "wall_s": done["wall_s"]})
            emit({"bench": "round", "round": round_, "separate_s": walls[False], "stacked_s": walls[True],
                  "stacked_over_separate": walls[True] / walls[False]})
    table = side_by_side(last[False], last[True])
    print(table.to_string(index=False))
    print(f"{int(table['within_spread'].sum())} of {len(table)} cells within the seeds' spread")
    return 0
