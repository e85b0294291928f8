"""`--plan` before the download: for the paper's datasets, the published split sizes and a length profile stand in
for the data (`pefusion.data.profile`), and the plan says it assumed them; with the data there it reads the data.
The suite runs offline (conftest), so the hub is out of reach here as on a login node without internet."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO
from pefusion.cli import commands
from pefusion.data.profile import IMDB_WORD_QUANTILES, PUBLISHED, assumed_profile
from pefusion.errors import ConfigError


def test_plan_of_agnews_with_no_data_yet_says_what_it_assumed(capsys, tmp_path):
    # 2 trials, 2 at once: the cluster size whose engine costs an earlier plan of the session measured (one
    # measurement per size: a tiny Ray sweep)
    assert commands.grid_main(["--preset", "agnews", "--plan", "--smoke", "--seeds", "0", "--fusions", "add,concat",
                               "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if " on ag_news" in x)
    assert "ASSUMED: no data here yet" in line and "offline" in line
    # The card's 120 000 training documents, 10 % held out by datasets' rounding (ceil), and its 7 600 test ones
    assert "108000 train / 12000 validation / 7600 test documents" in line
    assert "about 44 words" in line and "pefusion-data fetch" in line
    assert any(x.startswith("plan: 2 trials of arxiv_grid --preset agnews") for x in out.splitlines())
    assert any(x.startswith("plan: timed on cpu") for x in out.splitlines())


def test_the_plans_epochs_count_the_published_sizes_not_the_stand_ins():
    from pefusion.fusion.config import PRESETS, RULES
    from pefusion.fusion.study import pefusion_study
    from pefusion.sweep.space import load_search_space

    space = load_search_space(REPO / "search_spaces" / "arxiv_grid_imdb.yaml", RULES).override_values("seed", [0])
    study = pefusion_study("arxiv_grid", "imdb", PRESETS["imdb"], space, 1.0, describe=True)
    shipped = study.plan_ship()
    timer = study.timer(space.trial_points(), shipped)
    assert {tuple(len(x) for x in split) for split in timer.keywords["lengths"].values()} == {(22_500, 2_500, 25_000)}
    # the documents' lengths follow the profile, truncated at the preset's max_len: IMDB's median review, 174 words
    train = next(iter(timer.keywords["lengths"].values()))[0]
    assert train.max() == 512 and 160 < np.median(train) < 190
    stand_in = next(iter(shipped["corpora"].values()))
    assert len(stand_in.train) < 1000 and stand_in.max_len == 512


def test_a_dataset_without_a_published_profile_still_ends_in_the_missing_data_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot load dataset 'someone/else'"):
        commands.grid_main(["--preset", "imdb", "--dataset", "someone/else", "--plan", "--smoke", "--seeds", "0",
                            "--cache-dir", str(tmp_path)])


def test_profile_lengths_follow_its_quantiles():
    """Drawn lengths reproduce the stated quantiles (an independent np.quantile of the draws)."""
    profile = assumed_profile("stanfordnlp/imdb")
    drawn = profile.lengths(200_000, np.random.default_rng(1))
    got = np.quantile(drawn, np.linspace(0, 1, len(IMDB_WORD_QUANTILES))[1:-1])
    want = np.asarray(IMDB_WORD_QUANTILES[1:-1], dtype=float)
    assert np.allclose(got, want, rtol=0.02, atol=1.5), (got, want)
    assert drawn.min() >= IMDB_WORD_QUANTILES[0] and drawn.max() <= IMDB_WORD_QUANTILES[-1]
    # AG News: IMDB's shape at the card's mean; ArXiv: every document past the preset's 4 096 tokens.
    agnews = PUBLISHED["ag_news"].lengths(100_000, np.random.default_rng(2))
    assert 40 < agnews.mean() < 48
    assert PUBLISHED["ccdv/arxiv-classification"].stand_in(4096, 100).train.lengths.min() == 4096
