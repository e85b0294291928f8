"""`pefusion-data` (`scripts/fetch_data.py`): a preset's dataset fetched from the Hugging Face hub into a folder
that `--data-dir` reads, for machines without internet (`fetch`), and a folder verified (`check`). The logic is
`pefusion.data.folder`; this file maps the paper's datasets to their presets' hub names and columns.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from pefusion.data.folder import HubSource, check, describe_rows, fetch
from pefusion.errors import ConfigError
from pefusion.fusion.config import PRESETS

# The dataset names `fetch` takes: the presets whose data it is, so the hub name, config and columns are the
# preset's own (one home for each).
DATASETS = {"imdb": "imdb", "agnews": "agnews", "arxiv": "arxiv"}

DESCRIPTION = """The paper's datasets as folders that --data-dir reads, for compute nodes without internet. Installed as
`pefusion-data`, the same command as `python scripts/fetch_data.py`.

    pefusion-data fetch imdb --out data/imdb        # on a machine with internet (a login node)
    pefusion-data check data/imdb                   # checksums and rows against its manifest
    pefusion-grid --preset imdb --data-dir data/imdb   # then, on the compute node

fetch writes the hub dataset's own splits as Parquet files (train, test, and validation where the hub has one)
with the preset's text and label columns, and manifest.json (source, revision, rows and SHA-256 per file).
IMDB and AG News have no validation split: the sweep holds out 10 % of train from the folder exactly as it
does from the hub.
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pefusion-data", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", help="download a preset's dataset into a folder --data-dir reads")
    get.add_argument("dataset", choices=sorted(DATASETS), help="whose preset's data: imdb, agnews or arxiv")
    get.add_argument("--out", required=True, type=Path, help="the folder to write (made if missing)")
    get.add_argument("--revision", help="a hub branch, tag or commit to pin (default: the newest)")
    get.add_argument("--source", help="read this hub name or local dataset directory instead of the preset's (a "
                                      "mirror, or a copy made elsewhere); the columns stay the preset's")
    ver = sub.add_parser("check", help="verify a folder: every file read as the sweep reads it, checksums and rows "
                                       "against manifest.json where present")
    ver.add_argument("dir", type=Path, help="the data folder")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        data = PRESETS[DATASETS[args.dataset]].data
        source = HubSource(args.source or data.dataset, None if args.source else data.dataset_config,
                           data.text_column, data.label_column, args.revision)
        manifest = fetch(source, args.out)
        rows = {split: entry["rows"] for split, entry in manifest["splits"].items()}
        print(f"{args.out}: {describe_rows(rows)}; use it with --preset {DATASETS[args.dataset]} --data-dir "
              f"{args.out}")
        return 0
    if not args.dir.is_dir():
        raise ConfigError(f"{args.dir} is not a directory")
    checked = check(args.dir)
    for problem in checked.problems:
        print(f"problem: {problem}")
    what = "checksums and rows match manifest.json" if checked.manifest else "no manifest.json: files read only"
    if checked.problems:
        print(f"{args.dir}: {len(checked.problems)} problem(s)")
        return 1
    print(f"{args.dir}: ok, {describe_rows(checked.rows)} ({what})")
    return 0
