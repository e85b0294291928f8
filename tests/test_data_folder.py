"""`pefusion-data`: a preset's dataset fetched into a folder that --data-dir reads, with a manifest, and checked.

No network: each dataset's stand-in is a local dataset directory that `datasets` loads with its real loading code
(HF_HUB_OFFLINE=1 from conftest), in the hub dataset's own shape (IMDB and AG News: train and test; ArXiv: train,
validation and test; integer labels, an empty text among the training rows, an extra column the folder leaves out).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import REPO, load_script
from pefusion.cli import commands
from pefusion.data.config import DataConfig
from pefusion.data.sources import HubDataset, LocalFolder
from pefusion.fusion.config import PRESETS

SPLITS_OF = {"imdb": ("train", "test"), "agnews": ("train", "test"), "arxiv": ("train", "validation", "test")}


def stand_in(root: Path, dataset: str, n_train: int = 40) -> dict[str, list[dict]]:
    """A local dataset directory shaped like the hub's `dataset`: its rows per split, as written."""
    root.mkdir(parents=True)
    rows = {}
    for split in SPLITS_OF[dataset]:
        n = n_train if split == "train" else 10
        rows[split] = [{"text": "" if (split == "train" and i == 3) else f"{split} doc {i} " + "word " * (i % 7),
                        "label": i % 4, "extra": i} for i in range(n)]
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[split]))
    return rows


def _fetch(dataset: str, source: Path, out: Path, capsys) -> str:
    assert commands.data_main(["fetch", dataset, "--out", str(out), "--source", str(source)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("dataset", sorted(SPLITS_OF))
def test_fetch_writes_each_split_with_a_manifest_that_check_verifies(tmp_path, capsys, dataset):
    rows = stand_in(tmp_path / "hub", dataset)
    out = tmp_path / "data"
    said = _fetch(dataset, tmp_path / "hub", out, capsys)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["splits"]) == sorted(SPLITS_OF[dataset])
    for split, written in rows.items():
        entry = manifest["splits"][split]
        table = pq.read_table(out / entry["file"])
        assert table.column_names == ["text", "label"]  # the preset's columns only
        assert table.column("text").to_pylist() == [r["text"] for r in written]  # every row, in the hub's order
        assert table.column("label").to_pylist() == [r["label"] for r in written]
        assert entry["rows"] == len(written)
        assert entry["sha256"] == hashlib.sha256((out / entry["file"]).read_bytes()).hexdigest()
    assert manifest["source"]["dataset"] == str(tmp_path / "hub") and manifest["source"]["revision"]
    held = "validation" not in SPLITS_OF[dataset]
    assert ("10 % of train held out" in said) == held
    assert f"--preset {dataset} --data-dir {out}" in said

    assert commands.data_main(["check", str(out)]) == 0
    assert "ok" in capsys.readouterr().out
    # A rerun (a retried Kubernetes Job) finds the folder intact and downloads nothing.
    assert "nothing to do" in _fetch(dataset, tmp_path / "hub", out, capsys)


def test_check_names_a_changed_file_and_a_missing_one(tmp_path, capsys):
    stand_in(tmp_path / "hub", "imdb")
    out = tmp_path / "data"
    _fetch("imdb", tmp_path / "hub", out, capsys)
    table = pq.read_table(out / "test.parquet")
    pq.write_table(table.slice(0, 9), out / "test.parquet")  # one row lost
    assert commands.data_main(["check", str(out)]) == 1
    said = capsys.readouterr().out
    assert "test.parquet: SHA-256 differs" in said and "9 rows, manifest.json says 10" in said
    (out / "test.parquet").unlink()
    assert commands.data_main(["check", str(out)]) == 1
    assert "no test file" in capsys.readouterr().out


def test_a_fetched_folder_reads_as_the_hub_path_reads_the_same_dataset(tmp_path, capsys):
    """IMDB's folder has no validation file: --data-dir holds out the very documents the hub path holds out."""
    stand_in(tmp_path / "hub", "imdb", n_train=57)
    out = tmp_path / "data"
    _fetch("imdb", tmp_path / "hub", out, capsys)
    hub, _ = HubDataset(str(tmp_path / "hub"), None, "text", "label").read()
    folder, _ = LocalFolder(str(out), "text", "label").read()
    for split in ("train", "validation", "test"):
        assert folder[split].texts == hub[split].texts and folder[split].labels == hub[split].labels, split
    assert len(hub["validation"].texts) == 6  # ceil(0.1 × 57): datasets' rounding
    # AG News draws per seed: the same per-seed split from the folder as from the hub.
    for seed in (0, 2):
        hub, _ = HubDataset(str(tmp_path / "hub"), None, "text", "label", split_seed=seed).read()
        folder, _ = LocalFolder(str(out), "text", "label", split_seed=seed).read()
        assert folder["validation"].texts == hub["validation"].texts


def test_the_imdb_preset_plans_on_a_folder_without_validation_file_and_says_so(tmp_path, capsys):
    import datasets

    rows = stand_in(tmp_path / "hub", "imdb")
    _fetch("imdb", tmp_path / "hub", tmp_path / "data", capsys)
    want = datasets.Dataset.from_list(rows["train"]).train_test_split(test_size=0.1, seed=0)
    n_train, n_val = (sum(bool(t) for t in want[s]["text"]) for s in ("train", "test"))  # empty texts dropped
    # --smoke: the data line is the preset's whatever the model's size (timing the paper-size model takes seconds)
    assert commands.grid_main(["--preset", "imdb", "--data-dir", str(tmp_path / "data"), "--plan", "--seeds", "0",
                               "--smoke", "--cache-dir", str(tmp_path / "cache")]) == 0
    said = capsys.readouterr().out
    assert (f"{n_train} train / {n_val} validation / 10 test documents (validation: 10 % of train held out, with seed 0, as the "
            "hub path does: the folder has no validation file)") in said, said


def test_the_script_and_the_installed_command_run_the_same_main():
    assert load_script("scripts/fetch_data.py").main is commands.data_main
    assert (REPO / "scripts" / "fetch_data.py").exists()


def test_an_unreachable_hub_ends_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        from pefusion.cli.flags import run_main
        run_main(commands.data_main, ["fetch", "imdb", "--out", str(tmp_path / "d")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot load dataset 'stanfordnlp/imdb'" in err[0] and "offline" in err[0]


def test_fetch_takes_each_presets_own_hub_name_and_columns():
    from pefusion.cli.data import DATASETS

    assert {name: PRESETS[p].data.dataset for name, p in DATASETS.items()} == {
        "imdb": "stanfordnlp/imdb", "agnews": "ag_news", "arxiv": "ccdv/arxiv-classification"}
    assert DataConfig().dataset_config == "no_ref" == PRESETS["arxiv"].data.dataset_config
