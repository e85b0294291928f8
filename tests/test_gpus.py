"""`--gpus-per-trial auto`: the packing decision (a pure function of peak, card, margin, context and cap), the flag,
which trials the PE-fusion probe measures, and a real sweep on a machine without a GPU (printed line, parent tags)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import REPO, subprocess_env
from pefusion import record as R
from pefusion.errors import ConfigError

GIB = 1024 ** 3


def _pack(peak_gib: float, card_gib: float, extra_bytes: int = 0, **kw):
    from pefusion.sweep.gpus import pack_trials

    return pack_trials(int(peak_gib * GIB) + extra_bytes, int(card_gib * GIB), **kw)


# --- the decision -------------------------------------------------------------------------------------------


def test_exactly_filling_the_budget_fits_and_one_byte_more_does_not():
    """(2.5 + 0.5 context) GiB per trial, 90 % of 10 GiB = 9 GiB: 3 trials fill it exactly; a byte more, 2."""
    exact = _pack(2.5, 10)
    assert (exact.per_card, exact.gpus_per_trial) == (3, 0.3333)
    assert exact.reason.startswith("0.3333 GPU per trial, 3 trials per card: ")
    over = _pack(2.5, 10, extra_bytes=1)
    assert (over.per_card, over.gpus_per_trial) == (2, 0.5)


def test_the_margin_is_left_free():
    """2.5 GiB per trial on 10 GiB: 4 fit with no margin (10 GiB), 3 with 10 % (9 GiB)."""
    assert _pack(2.0, 10, margin=0.0).per_card == 4
    assert _pack(2.0, 10, margin=0.1).per_card == 3
    assert _pack(2.0, 10, margin=0.25).per_card == 3  # 7.5 GiB
    assert _pack(2.0, 10, margin=0.5).per_card == 2  # 5 GiB


def test_each_trial_pays_its_cuda_context():
    """2.25 GiB peaks in 9 GiB: 4 without a context, 3 with 0.5 GiB each (4 x 2.75 = 11 GiB)."""
    assert _pack(2.25, 10, context_bytes=0).per_card == 4
    assert _pack(2.25, 10, context_bytes=GIB // 2).per_card == 3


def test_small_trials_are_capped_per_card():
    """1 GiB per trial in 72 GiB: 72 would fit, 8 (the default cap) or the cap given share the card."""
    capped = _pack(0.5, 80)
    assert (capped.per_card, capped.gpus_per_trial) == (8, 0.125)
    assert "72 would fit" in capped.reason
    assert _pack(0.5, 80, max_per_card=5).gpus_per_trial == 0.2


def test_a_trial_that_fits_alone_gets_a_whole_gpu():
    whole = _pack(8.5, 10)  # 9 GiB of 9
    assert (whole.per_card, whole.gpus_per_trial) == (1, 1.0)
    assert whole.reason.startswith("1 GPU per trial, 1 trial per card: ")


def test_a_trial_larger_than_the_card_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        _pack(8.5, 10, extra_bytes=1, trial="the rope/concat trial")
    message = str(err.value)
    assert "\n" not in message and "the rope/concat trial" in message and "--gpus-per-trial 1" in message


# 1/K rounded down to Ray's resource unit (0.0001), by hand; rounding to nearest would give 0.1667 for K = 6,
# and six trials of 0.1667 GPU would not fit on one card.
RAY_FRACTIONS = {1: 1.0, 2: 0.5, 3: 0.3333, 4: 0.25, 5: 0.2, 6: 0.1666, 7: 0.1428, 8: 0.125}


@pytest.mark.parametrize("k", sorted(RAY_FRACTIONS))
def test_the_fraction_lets_exactly_k_trials_on_a_card(k):
    packing = _pack(1.0, k, margin=0.0, context_bytes=0)
    assert (packing.per_card, packing.gpus_per_trial) == (k, RAY_FRACTIONS[k])
    assert k * packing.gpus_per_trial <= 1 < (k + 1) * packing.gpus_per_trial


# --- what auto means on this machine ------------------------------------------------------------------------

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the machine's own answer without a GPU")


def _must_not_run(points):
    pytest.fail("the probe ran")


@cpu_only
def test_auto_without_a_visible_gpu_means_no_gpu():
    from pefusion.sweep.gpus import auto_packing

    packing = auto_packing(_must_not_run, [{}], sweep="arxiv_grid", remote=False, declared_gpus=None)
    assert (packing.per_card, packing.gpus_per_trial) == (0, 0.0)
    assert packing.reason == "no GPU visible on this machine; trials run on CPU"


def _site(*readings):
    """A probe site that hands back `readings` (where a cluster's tasks would have measured), asked once."""
    calls = []

    def site(probe, card, points):
        calls.append(points)
        return list(readings)

    site.calls = calls
    return site


def test_auto_on_a_cluster_fits_the_smallest_kind_of_card_and_says_where_it_measured():
    """(2.5 + 0.5 context) GiB per trial: on an 80 GiB card 24 would fit (8, the cap), on a 24 GiB card 90 % is
    21.6 GiB, 7 trials: the fraction is 1/7 rounded down, for every card; the line names both nodes."""
    from pefusion.sweep.gpus import CONTEXT_BYTES, CardReading, auto_packing

    peak = int(2.5 * GIB)
    site = _site(CardReading(peak, "the big trial", 80 * GIB - CONTEXT_BYTES, 80 * GIB, "H100", "node-h"),
                 CardReading(peak, "the big trial", 24 * GIB - CONTEXT_BYTES, 24 * GIB, "A10G", "node-a"))
    packing = auto_packing(_must_not_run, [{}], sweep="arxiv_grid", remote=True, declared_gpus=None, site=site)
    assert (packing.per_card, packing.gpus_per_trial) == (7, 0.1428) and site.calls == [[{}]]
    assert "\n" not in packing.reason and "H100 on node node-h" in packing.reason and "A10G on node node-a" in packing.reason
    assert "H100: 8 per card, A10G: 7 per card" in packing.reason


def test_auto_on_a_cluster_without_a_gpu_runs_the_trials_on_cpu():
    from pefusion.sweep.gpus import auto_packing

    packing = auto_packing(_must_not_run, [{}], sweep="arxiv_grid", remote=True, declared_gpus=None, site=_site())
    assert (packing.per_card, packing.gpus_per_trial) == (0, 0.0)
    assert packing.reason == "the cluster has no GPU; trials run on CPU"


def test_the_kinds_of_card_are_a_label_and_a_total_memory():
    """Nodes with GPUs and alive, with Ray's accelerator label (GPUs without one: a kind of their own), grouped by
    the label AND the card's total memory: an A100 of 40 GB and one of 80 GB (both labelled `A100` by Ray) are two
    kinds, each probed, and two H100 nodes with equal cards one."""
    from pefusion.sweep.cluster import card_groups, gpu_nodes

    def node(i, alive=True, **resources):
        return {"NodeID": f"n{i}", "Alive": alive, "Resources": {"CPU": 4.0, **resources}}

    a100 = {"accelerator_type:A100": 1.0}
    nodes = [node(0), node(1, GPU=8.0, **{"accelerator_type:H100": 1.0}), node(2, GPU=8.0, **{"accelerator_type:H100": 1.0}),
             node(3, alive=False, GPU=4.0, **a100), node(4, GPU=1.0), node(5, GPU=4.0, **a100),
             node(6, GPU=4.0, **a100)]
    labels = gpu_nodes(nodes)
    assert labels == {"n1": "H100", "n2": "H100", "n4": "unlabelled GPU", "n5": "A100", "n6": "A100"}
    assert gpu_nodes([node(0)]) == {}
    gib = 1024 ** 3
    cards = {"n1": (0, 80 * gib, "H100"), "n2": (5, 80 * gib, "H100"), "n4": (0, 24 * gib, "L4"),
             "n5": (0, int(79.2 * gib), "A100-80GB"), "n6": (0, int(39.4 * gib), "A100-40GB")}
    assert card_groups(labels, cards) == {("H100", 80.0): ["n1", "n2"], ("unlabelled GPU", 24.0): ["n4"],
                                          ("A100", 79.2): ["n5"], ("A100", 39.4): ["n6"]}


def test_auto_for_a_study_that_never_uses_a_gpu_or_a_cluster_declared_without_one_means_no_gpu():
    from pefusion.sweep.gpus import auto_packing

    student = auto_packing(None, [{}], sweep="lambda_cv", remote=True, declared_gpus=None)
    assert (student.gpus_per_trial, student.reason) == (0.0, "the lambda_cv trials do not use a GPU; trials run on CPU")
    declared = auto_packing(_must_not_run, [{}], sweep="arxiv_grid", remote=False, declared_gpus=0)
    assert declared.gpus_per_trial == 0.0 and declared.reason.startswith("--num-gpus 0")


# --- the flag -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,value", [("auto", "auto"), ("AUTO", "auto"), ("0.25", 0.25), ("2", 2.0),
                                        ("0", 0.0)])
def test_the_flag_takes_a_number_or_auto(text, value):
    from pefusion.cli.flags import gpus_per_trial

    assert gpus_per_trial(text) == value


@pytest.mark.parametrize("text", ["lots", "", "nan", "inf", "0.25,0.5", "autoo"])
def test_the_flag_refuses_anything_else_in_one_line(text):
    from pefusion.cli.flags import gpus_per_trial

    with pytest.raises(ConfigError) as err:
        gpus_per_trial(text)
    assert "\n" not in str(err.value) and "'auto'" in str(err.value)


# --- the PE-fusion probe: which trials, which batches ------------------------------------------------------


def test_the_probe_measures_the_largest_sizes_of_each_kind_of_trial():
    """pe_type x fusion x precision change what is computed: 8 kinds, each measured at its largest batch, width and
    depth (a range's upper end); seeds and learning rates multiply the points, never the measurements."""
    from pefusion.fusion.config import PRESETS, RULES
    from pefusion.fusion.probe import largest_trials
    from pefusion.sweep.space import parse_search_space

    space = parse_search_space({
        "pe_type": {"grid": ["sinusoidal", "learned"]}, "fusion": {"grid": ["add", "concat"]},
        "precision": {"grid": ["fp32", "bf16"]}, "batch_size": {"choice": [16, 64, 32]},
        "d_model": {"grid": [64, 32]}, "num_layers": {"randint": [1, 3]}, "seed": {"grid": [0, 1, 2]},
        "lr": {"loguniform": [1e-4, 1e-2]}}, RULES)
    assert len(space.points()) == 2 * 2 * 2 * 3 * 2 * 2 * 3 * 2
    trials = largest_trials(space.trial_points(), PRESETS["demo"])
    got = sorted((m.pe_type, m.fusion, t.precision, t.batch_size, m.d_model, m.num_layers, stacked)
                 for m, t, stacked in trials)
    assert got == sorted((pe, fu, pr, 64, 64, 2, 1) for pe in ("sinusoidal", "learned") for fu in ("add", "concat")
                         for pr in ("fp32", "bf16"))
    assert all(t.lr in (1e-4, 1e-2) and t.seed in (0, 1, 2) for _, t, _ in trials)  # values of real points
    # the seeds stacked in one trial: the same kinds, each measured with its 3 models together
    stacked = largest_trials(space.stacked("seed").trial_points(), PRESETS["demo"])
    assert sorted(k[:-1] for k in got) == sorted((m.pe_type, m.fusion, t.precision, t.batch_size, m.d_model,
                                                  m.num_layers) for m, t, _ in stacked)
    assert {n for _, _, n in stacked} == {3}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_probe_trains_on_full_width_padded_batches_of_the_trials_size(seed):
    """With a GPU's pad multiple every probe batch is (batch_size, max_len) and has padding (ALiBi's padded path
    builds a (B, H, T, T) bias), whatever order the seed shuffles the batches into."""
    from pefusion.data.batching import iter_batches
    from pefusion.fusion.probe import probe_corpus

    corpus = probe_corpus(batch_size=5, tokens=8, vocab_size=11)
    batches = [b.tokens for b in iter_batches(corpus.train, 5, shuffle=True, seed=seed, pad_multiple=4, max_width=8)]
    batches += [b.tokens for b in iter_batches(corpus.validation, 5, shuffle=False, pad_multiple=4, max_width=8)]
    assert [tuple(t.shape) for t in batches] == [(5, 8)] * 3
    assert all(bool((t == 0).any()) for t in batches)  # every batch has padding
    real = torch.cat([t[t != 0] for t in batches])
    assert real.min() >= 2 and real.max() <= 10 and len(real) == 3 * 5 * 8 - (3 * 5 - 2)  # one short token per doc
    assert corpus.vocab_size == 11 and corpus.max_len == 8


# --- a real sweep ------------------------------------------------------------------------------------------


@pytest.mark.subprocess_ray
def test_auto_on_a_machine_without_a_gpu_prints_its_choice_and_tags_the_parent_run(tmp_path, cache_dir):
    """CUDA_VISIBLE_DEVICES='' hides any GPU, so this is the CPU-only machine wherever it runs: one trial on CPU,
    the choice printed before Ray starts and recorded on the sweep's parent run."""
    from mlflow.tracking import MlflowClient

    db = tmp_path / "m.db"
    cmd = [sys.executable, str(REPO / "sweeps" / "arxiv_grid.py"), "--preset", "demo", "--smoke", "--pe-types",
           "sinusoidal", "--fusions", "add", "--seeds", "0", "--gpus-per-trial", "auto", "--num-cpus", "1",
           "--no-dashboard", "-q", "--tracking-uri", f"sqlite:///{db}", "--cache-dir", str(cache_dir)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(CUDA_VISIBLE_DEVICES=""), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    line = "--gpus-per-trial auto: no GPU visible on this machine; trials run on CPU"
    assert line in lines
    started = next(i for i, ln in enumerate(lines) if ln.startswith("MLflow:"))  # printed once Ray has started
    assert lines.index(line) < started
    assert "1 trial, 1 ok, 0 failed" in proc.stdout

    client = MlflowClient(f"sqlite:///{db}")
    (parent,) = client.search_runs([client.get_experiment_by_name("pe-fusion").experiment_id],
                                   f"tags.`{R.TAG_ROLE}` = 'sweep'")
    assert parent.data.tags[R.TAG_GPUS_PER_TRIAL] == "0"
    assert parent.data.tags[R.TAG_GPUS_AUTO] == "no GPU visible on this machine; trials run on CPU"
