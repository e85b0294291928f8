"""scripts/bench_gpu.py runs for real on a CPU (`--tiny`: a smoke run; no speed is asserted) and writes one JSON line
per configuration with sane values, importing nothing a bare GPU machine lacks (it has torch, numpy, pandas and
pyyaml): the script cannot rot on machines without a GPU."""
from __future__ import annotations

import importlib.metadata as metadata
import itertools
import json
import re
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from conftest import REPO, subprocess_env

GPU_MACHINE_PACKAGES = ("torch", "numpy", "pandas", "pyyaml")
KERNELS = {"flash", "efficient", "cudnn", "math", "chunked"}
TINY = {"models": ("arxiv", "agnews_imdb"), "fusions": ("add",), "precisions": ("auto", "bf16"),
        "batchings": ("bucketed", "padded"), "packing": (1, 2), "steps": 2, "warmup": 1, "batch_size": 4,
        "max_len": 128, "shapes": 4, "stacked": (2,)}
RESOLVED_ON_A_CPU = {"auto": "fp32", "bf16": "bf16"}

# Installed in every process of the run (sitecustomize runs at interpreter start, spawned workers included): the
# finder of installed modules hides every top-level module outside the allowed set, so that importing it fails
# and probing it (importlib.util.find_spec) finds nothing, as on a machine without it; what it hid is logged.
BLOCKER = """
import importlib.machinery, json, os, sys
ALLOWED = set(json.loads(os.environ["BENCH_ALLOWED_MODULES"]))
PathFinder = importlib.machinery.PathFinder

class Hiding:
    invalidate_caches = staticmethod(PathFinder.invalidate_caches)
    find_distributions = staticmethod(PathFinder.find_distributions)

    @staticmethod
    def find_spec(name, path=None, target=None):
        spec = PathFinder.find_spec(name, path, target)
        top = name.partition(".")[0]
        if spec is None or top in ALLOWED or top in sys.stdlib_module_names or top.startswith("_sysconfigdata"):
            return spec
        with open(os.environ["BENCH_BLOCKED_LOG"], "a") as log:
            log.write(top + "\\n")
        return None

sys.meta_path[:] = [Hiding if finder is PathFinder else finder for finder in sys.meta_path]
"""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _gpu_machine_modules() -> set[str]:
    """Top-level modules of the GPU machine's packages and of everything they require (extras left out), plus this
    repository's: the only imports the benchmark may make."""
    dists, todo = set(), list(GPU_MACHINE_PACKAGES)
    while todo:
        name = _normal(todo.pop())
        if name in dists:
            continue
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        dists.add(name)
        todo += [re.match(r"[A-Za-z0-9._-]+", r).group(0) for r in requires if "extra ==" not in r]
    return {module for module, owners in metadata.packages_distributions().items()
            if any(_normal(d) in dists for d in owners)} | {"pefusion", "benchmarks"}


def _other_dependencies() -> set[str]:
    """The project's dependencies that a bare GPU machine lacks (ray, mlflow, datasets, ...), as module names."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {_normal(re.match(r"[A-Za-z0-9._-]+", d).group(0)) for d in deps}
    return {n.replace("-", "_") for n in names - {_normal(p) for p in GPU_MACHINE_PACKAGES}}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One `--device cpu --tiny` run with the import blocker: (stdout lines, --json-out lines, blocked imports)."""
    tmp = tmp_path_factory.mktemp("bench_gpu")
    site = tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    log, out = tmp / "blocked.txt", tmp / "gpu.jsonl"
    env = subprocess_env(PYTHONPATH=f"{site}:{REPO}", BENCH_BLOCKED_LOG=str(log),
                         BENCH_ALLOWED_MODULES=json.dumps(sorted(_gpu_machine_modules())))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_gpu.py"), "--device", "cpu", "--tiny",
                           "--json-out", str(out)], capture_output=True, text=True, cwd=tmp, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    blocked = set(log.read_text().split()) if log.exists() else set()
    return [json.loads(line) for line in proc.stdout.splitlines()], out.read_text().splitlines(), blocked


def _by_bench(lines: list[dict], bench: str) -> list[dict]:
    return [line for line in lines if line["bench"] == bench]


def _mean_tokens(corpus: dict) -> float:
    return float(np.minimum(np.array(corpus["doc_words"]), corpus["max_len"]).mean())


def test_it_imports_nothing_a_bare_gpu_machine_lacks(tiny_run):
    """The run succeeded with every import outside torch, numpy, pandas, pyyaml (and what they require) blocked,
    and never even tried the project's other dependencies."""
    _, _, blocked = tiny_run
    heavy = _other_dependencies()
    assert {"ray", "mlflow", "datasets"} <= heavy
    assert not blocked & heavy, blocked


def test_one_line_per_configuration_on_stdout_and_in_the_file(tiny_run):
    lines, file_lines, _ = tiny_run
    assert [json.loads(line) for line in file_lines] == lines
    assert [c["model"] for c in _by_bench(lines, "corpus")] == list(TINY["models"])
    assert {t["attention"] for t in _by_bench(lines, "train")} == {"policy"}  # the default
    train = {(t["model"], t["fusion"], t["precision"], t["batching"]) for t in _by_bench(lines, "train")}
    assert train == set(itertools.product(TINY["models"], TINY["fusions"], TINY["precisions"], TINY["batchings"]))
    assert len(_by_bench(lines, "train")) == len(train)
    packing = [(p["model"], p["fusion"], p["precision"], p["k"]) for p in _by_bench(lines, "packing")]
    assert sorted(packing) == sorted(itertools.product(TINY["models"], ["add"], TINY["precisions"], TINY["packing"]))
    shapes = [(p["model"], p["precision"], p["variant"]) for p in _by_bench(lines, "shapes")]
    assert sorted(shapes) == sorted(itertools.product(TINY["models"], TINY["precisions"], ("pefusion", "pytorch")))
    stacked = [(p["model"], p["precision"], p["seeds"]) for p in _by_bench(lines, "stacked")]
    assert sorted(stacked) == sorted(itertools.product(TINY["models"], TINY["precisions"], TINY["stacked"]))
    for line in _by_bench(lines, "train") + _by_bench(lines, "packing") + _by_bench(lines, "shapes") + \
            _by_bench(lines, "stacked"):
        # what each precision ran at on this CPU, with a trial's pad multiple (1 on a CPU) and attention policy
        assert line["precision_resolved"] == RESOLVED_ON_A_CPU[line["precision"]]
        assert line["pad_multiple"] == 1 and "chunked" in line["attention_policy"]


def test_corpus_lines_state_the_lengths_that_were_trained_on(tiny_run):
    lines, _, _ = tiny_run
    for corpus in _by_bench(lines, "corpus"):
        words = np.array(corpus["doc_words"])
        assert len(words) == corpus["n_docs"] == TINY["steps"] * TINY["batch_size"]
        assert corpus["max_len"] == TINY["max_len"] and "lognormal" in corpus["length_dist"]
        assert corpus["mean_tokens"] == pytest.approx(_mean_tokens(corpus), rel=1e-3)
        assert corpus["truncated_fraction"] == pytest.approx(float((words > corpus["max_len"]).mean()), abs=1e-3)


def test_train_lines_have_sane_rates_memory_kernels_and_latency(tiny_run):
    lines, _, _ = tiny_run
    corpora = {c["model"]: c for c in _by_bench(lines, "corpus")}
    for t in _by_bench(lines, "train"):
        corpus, where = corpora[t["model"]], (t["model"], t["fusion"], t["precision"], t["batching"])
        assert t["device"] == "cpu" and t["oom"] is False and t["precision"] in TINY["precisions"], where
        assert (t["steps"], t["warmup"], t["batch_size"]) == (TINY["steps"], TINY["warmup"], TINY["batch_size"])
        assert t["samples"] == corpus["n_docs"] and t["train_samples_per_s"] > 0, where
        # tokens/s counts the tokens kept per document (truncated to max_len), not the padding
        assert t["train_tokens_per_s"] == pytest.approx(t["train_samples_per_s"] * _mean_tokens(corpus), rel=2e-3)
        assert t["train_samples_per_s"] == pytest.approx(t["samples"] / t["train_s"], rel=2e-3)
        assert t["train_ms_per_step"] == pytest.approx(1000 * t["train_s"] / t["steps"], rel=2e-3)
        # the first epoch (every shape new) apart from the steady one: the same documents over its own seconds
        assert t["first_epoch_samples_per_s"] == pytest.approx(t["samples"] / t["first_epoch_s"], rel=2e-3)
        assert t["first_over_steady"] == pytest.approx(t["first_epoch_s"] / t["train_s"], rel=2e-3)
        assert t["peak_mem_alloc_mib"] is None and t["peak_mem_reserved_mib"] is None  # no GPU memory on a CPU
        assert t["latency_ms_per_sample"] > 0 and t["latency_ms_std"] >= 0
        # every attention call of the warm-up steps (one per layer per step) is attributed to one known kernel
        assert set(t["attention_kernels"]) <= KERNELS
        assert sum(t["attention_kernels"].values()) == t["warmup"] * t["num_layers"], where
        if t["precision_resolved"] == "fp32":  # training with dropout on a CPU runs pefusion's own attention kernel
            assert t["attention_kernels"] == {"chunked": t["warmup"] * t["num_layers"]}
        assert set(t["latency_attention_kernels"]) <= KERNELS - {"chunked"}
        assert sum(t["latency_attention_kernels"].values()) == t["num_layers"]
        ok, refused = set(t["sdpa_backends_ok"]), set(t["sdpa_backends_refused"])
        assert ok | refused == KERNELS - {"chunked"} and not ok & refused and "math" in ok, where
        assert set(t["latency_attention_kernels"]) <= ok
        assert all(reason for reason in t["sdpa_backends_refused"].values())
        if t["batching"] == "padded":  # every batch padded to max_len
            assert t["padding_fraction"] == pytest.approx(1 - _mean_tokens(corpus) / t["max_len"], abs=1e-3)
        assert 0 <= t["padding_fraction"] < 1 and 0 <= t["unpadded_batch_fraction"] <= 1


def test_packing_lines_have_one_entry_per_process_and_an_aggregate_rate(tiny_run):
    lines, _, _ = tiny_run
    corpora = {c["model"]: c for c in _by_bench(lines, "corpus")}
    for p in _by_bench(lines, "packing"):
        k, where = p["k"], (p["model"], p["precision"], p["k"])
        assert k in TINY["packing"] and p["oom"] is False and p["oom_processes"] == 0 and p["errors"] == [], where
        assert len(p["process_samples_per_s"]) == k and all(r > 0 for r in p["process_samples_per_s"]), where
        assert p["process_peak_mem_alloc_mib"] == [None] * k and p["process_peak_mem_reserved_mib"] == [None] * k
        # all processes' samples over the span from the first start to the last end: at most the sum of the
        # processes' own rates (each over its own, shorter, window)
        assert 0 < p["samples_per_s"] <= sum(p["process_samples_per_s"]) * (1 + 2e-3), where
        assert p["samples_per_s"] == pytest.approx(k * corpora[p["model"]]["n_docs"] / p["wall_s"], rel=2e-3)
        assert p["tokens_per_s"] == pytest.approx(p["samples_per_s"] * _mean_tokens(corpora[p["model"]]), rel=2e-3)


def test_shapes_lines_time_new_lengths_then_the_same_lengths_seen(tiny_run):
    """One line per model, precision and variant: the same distinct lengths twice, ms per step of each pass; with
    a CPU's pad multiple of 1 every length is its own width."""
    lines, _, _ = tiny_run
    for line in _by_bench(lines, "shapes"):
        where = (line["model"], line["precision"], line["variant"])
        assert line["oom"] is False and line["lengths"] == TINY["shapes"] == line["widths"], where
        assert line["new_ms_per_step"] > 0 and line["seen_ms_per_step"] > 0, where
        assert line["new_over_seen"] == pytest.approx(line["new_ms_per_step"] / line["seen_ms_per_step"], rel=2e-3)


def test_stacked_lines_compare_the_seeds_together_with_one_trial(tiny_run):
    lines, _, _ = tiny_run
    for line in _by_bench(lines, "stacked"):
        where = (line["model"], line["precision"], line["seeds"])
        assert line["oom"] is False and line["trial_samples_per_s"] > 0 and line["samples_per_s"] > 0, where
        assert line["speedup"] == pytest.approx(line["samples_per_s"] / line["trial_samples_per_s"], rel=2e-3)
        assert line["peak_mem_alloc_mib"] is None and line["trial_peak_mem_reserved_mib"] is None  # a CPU


def test_shape_lengths_are_distinct_and_a_gpus_pad_multiple_leaves_few_widths():
    from benchmarks.gpu.shapes import shape_lengths
    from pefusion.data.batching import batch_width

    lengths = shape_lengths(512, 60)
    assert len(lengths) == 60 and lengths[0] == 102 and lengths[-1] < 410
    assert sorted({batch_width(t, 64, 512) for t in lengths}) == [128, 192, 256, 320, 384, 448]


def test_a_bad_flag_is_one_line_and_exit_code_2(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_gpu.py"), "--device", "cpu", "--tiny",
                           "--precisions", "fp16"], capture_output=True, text=True, cwd=tmp_path,
                          env=subprocess_env(), timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "error: --precisions fp16 is not allowed; choose from auto, fp32, tf32, bf16"


def test_a_stacked_line_that_fails_records_the_error_and_returns(monkeypatch):
    """A stacked model that raises in training (as the fused attention backward once did on a card) gives a
    `stacked` line with the error's type and first line, no rates, and no exception to stop the benchmark."""
    from benchmarks.gpu import stacked
    from benchmarks.gpu.workload import Plan, make_corpus

    class Crashing(stacked.StackedTrainer):
        def train_steps(self):
            raise RuntimeError("LSE is not correctly aligned (strideH)\nmore")

    monkeypatch.setattr(stacked, "StackedTrainer", Crashing)
    plan = Plan(tiny=True, steps=2, warmup=1, latency_repeats=1, seed=0, device="cpu")
    line = stacked.measure_stacked(plan, "agnews_imdb", "fp32", 2, make_corpus(plan, "agnews_imdb"))
    assert line["bench"] == "stacked" and line["oom"] is False
    assert line["error"] == "RuntimeError: LSE is not correctly aligned (strideH)" and "speedup" not in line
