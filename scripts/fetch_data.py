"""The paper's datasets fetched from the Hugging Face hub into folders that --data-dir reads, for compute nodes
without internet, and a folder checked against its manifest. Installed as `pefusion-data`; the logic is in
pefusion/data/folder.py.

    python scripts/fetch_data.py fetch imdb --out data/imdb
    python scripts/fetch_data.py check data/imdb
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, home of pefusion/

from pefusion.cli.flags import run_main  # noqa: E402
from pefusion.cli.commands import data_main as main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
