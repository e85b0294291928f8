"""User errors on the sweep command lines: one line, a ConfigError (exit code 2 via run_main), before Ray starts."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, load_script, write_synthetic_corpus
from pefusion.errors import ConfigError


BAD_INPUTS = [
    # the flag the user typed, not the search-space file it narrows
    (["--pe-types", "sinusoidal,fourier"], "--pe-types sinusoidal,fourier: pe_type: 'fourier' is not allowed"),
    (["--fusions", "gated"], "--fusions gated: fusion: 'gated' is not allowed"),
    (["--pe-types", "rotary", "--fusions", "add"], "fusion='none'"),
    (["--data-dir", "/nonexistent/data"], "--data-dir /nonexistent/data is not a directory"),
    (["--tracking-uri", "http://127.0.0.1:9"], "unreachable"),
    (["--cpus-per-trial", "0"], "--cpus-per-trial"),
    (["--gpus-per-trial", "lots"], "--gpus-per-trial 'lots': give a number of GPUs per trial"),
    # where --resume looked, and how to point it elsewhere
    (["--resume"], "(--storage-path's default: ./ray_results of the folder the command runs in); pass the "
                   "--storage-path and --name the sweep ran with"),
    (["--resume", "--storage-path", "/nonexistent/rr", "--name", "x"],
     "--resume: no experiment x in /nonexistent/rr; pass the --storage-path and --name"),
]


@pytest.mark.parametrize("argv,message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_command_lines_are_rejected_before_ray(in_tmp, cache_dir, argv, message):
    import ray

    grid = load_script("sweeps/arxiv_grid.py")
    with pytest.raises(ConfigError) as err:
        grid.main(["--preset", "arxiv", "--synthetic", "--smoke", "--cache-dir", str(cache_dir), "--seeds", "0",
                   "--no-dashboard", *argv])
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not ray.is_initialized()


@pytest.mark.parametrize("yaml_text,message", [
    ("learning_rate: 0.1\n", "unknown key 'learning_rate'"),
    ("lr: {loguniform: [0.01, 0.001]}\n", "lr"),
    ("pe_type: {grid: [sinusoidal, fourier]}\n", "fourier"),
    ("batch_size: {choice: [0, 32]}\n", "batch_size"),
])
def test_bad_search_space_files_are_rejected(in_tmp, cache_dir, yaml_text, message):
    space = in_tmp / "space.yaml"
    space.write_text(yaml_text)
    grid = load_script("sweeps/arxiv_grid.py")
    with pytest.raises(ConfigError) as err:
        grid.main(["--preset", "arxiv", "--synthetic", "--smoke", "--cache-dir", str(cache_dir),
                   "--search-space", str(space)])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_exit_code_2_and_one_line_from_the_command_line(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), "--preset", "arxiv",
                           "--synthetic", "--fusions", "gated"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error: ")
    assert "Ray dashboard" not in proc.stdout


def test_data_file_not_utf8_is_one_line_with_its_byte_offset(tmp_path):
    """A data file that is not UTF-8, through the real command: a Latin-1 byte in a --data-dir JSONL file."""
    train = write_synthetic_corpus(tmp_path / "data", n_train=20, n_val=5, n_test=5)["train"]
    good = train.read_bytes()
    first = good.index(b"\n") + 1
    data = good[:first] + b'{"text": "caf\xe9 au lait", "label": 0}\n' + good[first:]
    train.write_bytes(data)
    offset = data.index(b"\xe9")  # 1 line of good JSON, then `{"text": "caf` and the bad byte
    proc = subprocess.run([sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), "--data-dir", str(tmp_path / "data"),
                           "--cache-dir", str(tmp_path / "cache"), "--no-dashboard",
                           "--tracking-uri", f"sqlite:///{tmp_path}/m.db"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("\n"), proc.stderr  # exactly one line
    assert proc.stderr.startswith(f"error: {train}: not valid UTF-8: byte 0xe9 at byte offset {offset} (line 2); "
                                  f"re-save the file as UTF-8"), proc.stderr
    assert "Ray dashboard" not in proc.stdout


def test_unreachable_hub_names_the_three_ways_to_supply_data(tmp_path, cache_dir):
    """Offline, on the session's empty Hugging Face cache (conftest): a user's warm cache is never read."""
    grid = load_script("sweeps/arxiv_grid.py")
    with pytest.raises(ConfigError) as err:
        grid.main(["--preset", "arxiv", "--cache-dir", str(cache_dir), "--tracking-uri",
                   f"sqlite:///{tmp_path}/mlflow.db"])
    msg = str(err.value)
    assert "--data-dir" in msg and "--preset demo" in msg and "\n" not in msg


@pytest.mark.parametrize("preset", ["agnews", "agnews_imdb"])
def test_stacking_seeds_that_share_no_data_is_refused_before_ray(in_tmp, cache_dir, preset):
    """agnews draws each seed's own split and vocabulary (its former name `agnews_imdb` is the same preset)."""
    import ray

    (in_tmp / "agnews").mkdir()
    for split in ("train", "test"):
        (in_tmp / "agnews" / f"{split}.jsonl").write_text('{"text": "a b", "label": 0}\n')
    grid = load_script("sweeps/arxiv_grid.py")
    with pytest.raises(ConfigError) as err:
        grid.main(["--preset", preset, "--data-dir", str(in_tmp / "agnews"), "--cache-dir", str(cache_dir),
                   "--stack-seeds", "--no-dashboard"])
    assert "--preset agnews draws each seed's own train/validation split" in str(err.value)
    assert "drop --stack-seeds" in str(err.value) and "\n" not in str(err.value)
    assert not ray.is_initialized() and not (in_tmp / "mlflow.db").exists()
