"""`scripts/gpu_check.py`: which cases it runs (every PE × fusion pair the config allows, counted here from the
rules as the spec states them), that a failing case is one line with its error's last line and a non-zero exit, and
the command itself on a CPU, end to end with its sweep, so that it cannot rot on machines without a GPU."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import REPO, subprocess_env
from pefusion import record as R
from pefusion.cli import gpu_check
from pefusion.fusion import check

PAPER_PES, INPUT_FUSIONS = ("sinusoidal", "learned", "rope", "relative"), (
    "add", "mul", "concat", "gate_scalar", "gate_vector", "gate_cnn", "mlp", "mlp_gate")
# The spec's rules by hand: input PEs with every input fusion; no PE with every input fusion but mul (P = 0) and
# with none; rotary and alibi with none only.
ALLOWED = {(pe, f) for pe in PAPER_PES for f in INPUT_FUSIONS} | \
          {("none", f) for f in INPUT_FUSIONS if f != "mul"} | {("none", "none"), ("rotary", "none"), ("alibi", "none")}


def test_the_cases_are_every_allowed_pair_at_the_paper_sizes_and_every_pe_and_fusion_at_the_text_preset(monkeypatch):
    monkeypatch.setattr(check, "bf16_supported", lambda device: True)  # a bf16 card
    on_a_card = check.cases(torch.device("cuda"))
    for size in ("arxiv", "agnews_imdb", "text"):  # one wide stack and one case of ALiBi across long padding each
        extra = [(c.pe_type, c.fusion, c.precision, c.seeds, c.long_padding) for c in on_a_card
                 if c.size == size and (c.seeds == 5 or c.long_padding)]
        assert extra == [("sinusoidal", "add", "auto", 5, False), ("alibi", "none", "auto", 1, True)]
    for size in ("arxiv", "agnews_imdb"):
        mine = [(c.pe_type, c.fusion, c.precision, c.seeds) for c in on_a_card
                if c.size == size and c.seeds != 5 and not c.long_padding]
        assert sorted(mine) == sorted((pe, f, p, s) for pe, f in ALLOWED for p in ("auto", "fp32") for s in (1, 2))
    text = [c for c in on_a_card if c.size == "text"]
    assert {c.pe_type for c in text} == {pe for pe, _ in ALLOWED} and {c.fusion for c in text} == {f for _, f in ALLOWED}
    assert {(c.pe_type, c.fusion) for c in text} <= ALLOWED
    # on a CPU auto is fp32: the fp32 cases would run the same computation again
    assert {c.precision for c in check.cases(torch.device("cpu"))} == {"auto"}


def test_a_failing_case_is_its_errors_last_line_and_the_exit_code_is_1(monkeypatch, capsys):
    def run_case(case, preset, corpus, device, syncs):
        if case.stacked and case.pe_type == "alibi":
            raise RuntimeError("Traceback (most recent call last):\n  ...\nLSE is not correctly aligned (strideH)")

    monkeypatch.setattr(check, "run_case", run_case)
    monkeypatch.setattr(gpu_check, "sweep_check", lambda device: "ok")
    assert gpu_check.main(["--device", "cpu"]) == 1
    lines = capsys.readouterr().out.splitlines()
    bad = [line for line in lines if not line.endswith("  ok")]
    assert bad[0].startswith("gpu_check on ") and bad[-1].startswith("3 of 203 failed")
    assert bad[1].startswith("batch sizes: ") and bad[2] == "cuDNN attention self-test: none on a CPU"
    assert len(bad) == 7 and all("alibi+none" in line and "stacked" in line and line.endswith(
        "  RuntimeError: LSE is not correctly aligned (strideH)") for line in bad[3:6])


def test_a_case_fails_on_a_non_finite_weight_or_validation_loss(monkeypatch):
    """A case whose runs end ok but leave a NaN weight, or a NaN validation loss, fails naming it."""
    from pefusion.fusion import training

    preset = check.check_preset("text", tiny=True)
    corpus = check.check_corpus(preset, 2, check.TINY_VOCAB)
    case = check.Case("text", "sinusoidal", "add", "auto")
    syncs = check.SyncCount(torch.device("cpu"))
    check.run_case(case, preset, corpus, torch.device("cpu"), syncs)
    assert syncs.steps == check.STEPS and syncs.syncs == 0
    # spoilt after the trial's own checks, as its final record is made
    monkeypatch.setattr(training.Trainer, "final_record", lambda self, edges: (
        self.model.head.weight.data.fill_(float("nan")), {R.STATUS: R.STATUS_OK})[1])
    with pytest.raises(RuntimeError, match="^seed 0: non-finite weights in head.weight$"):
        check.run_case(case, preset, corpus, torch.device("cpu"), syncs)
    monkeypatch.setattr(training.Trainer, "final_record", lambda self, edges: (
        self.history[-1].update({R.VAL_LOSS: float("nan")}), {R.STATUS: R.STATUS_OK})[1])
    with pytest.raises(RuntimeError, match="^seed 0: validation loss nan$"):
        check.run_case(case, preset, corpus, torch.device("cpu"), syncs)


def test_a_case_fails_when_its_loss_does_not_fall(monkeypatch):
    """Its validation split is its training split: optimiser steps that change nothing leave the loss where it was,
    and the case says so."""
    preset = check.check_preset("text", tiny=True)
    corpus = check.check_corpus(preset, 2, check.TINY_VOCAB)
    case = check.Case("text", "sinusoidal", "add", "auto")
    check.run_case(case, preset, corpus, torch.device("cpu"), check.SyncCount(torch.device("cpu")))
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, closure=None: None)  # text's optimiser
    with pytest.raises(RuntimeError, match=r"^seed 0: the loss did not fall over 2 steps on the data it trained on"):
        check.run_case(case, preset, corpus, torch.device("cpu"), check.SyncCount(torch.device("cpu")))


def test_a_stacked_seed_is_checked_against_its_separate_trial_and_a_mixed_up_row_fails(monkeypatch):
    """The wide stack's last seed against the separate trial of the same seed, fp32 without dropout: on a CPU
    within 1e-7 (tolerance 1e-4); a stack that hands each seed another seed's row differs by far more."""
    from pefusion.fusion.stacked import StackedTrainer

    preset = check.check_preset("text", tiny=True)
    corpus = check.check_corpus(preset, 2, check.TINY_VOCAB)
    case = check.Case("text", "sinusoidal", "concat", "auto", seeds=check.WIDE_STACK)
    cpu = torch.device("cpu")
    seeds = list(range(check.WIDE_STACK))
    gap = check.relative_gap(check._short_run(case, preset, corpus, cpu, seeds),
                             check._short_run(case, preset, corpus, cpu, seeds[-1:]))
    assert gap <= 1e-6
    check.reference_checks(case, preset, corpus, cpu)

    @torch.no_grad()
    def mixed_up(self):  # row r into seed active[-1 - r]
        stacked = dict(self.model.named_parameters())
        for row, seed in enumerate(reversed(self.active)):
            for name, tensor in self.trainers[seed].model.named_parameters():
                tensor.copy_(stacked[name][row])

    monkeypatch.setattr(StackedTrainer, "sync_models", mixed_up)
    with pytest.raises(RuntimeError, match=r"^stacked seed 4 differs from its separate trial by .* more than 0.0001"):
        check.reference_checks(case, preset, corpus, cpu)


@pytest.mark.subprocess_ray
def test_gpu_check_on_a_cpu_runs_every_case_and_a_sweep_through_ray_and_mlflow(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--device", "cpu"],
                          capture_output=True, text=True, cwd=tmp_path, env=subprocess_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    n = len(check.cases(torch.device("cpu")))
    assert len(lines) == n + 5 and all(line.endswith("  ok") for line in lines[3:-1])
    assert lines[-2].startswith("sweep ") and lines[-1].startswith(f"0 of {n + 1} failed")
    assert "syncs per training step 0.00" in lines[-1]
    wide = [line for line in lines if " 5 stacked " in line]  # its attention calls read from a profile
    assert len(wide) == 3 and all("[attention: " in line for line in wide)
    assert sum("long padding" in line for line in lines) == 3
    assert list(tmp_path.iterdir()) == []  # the sweep ran in a folder of its own, removed after
