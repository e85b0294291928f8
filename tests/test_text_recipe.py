"""Real-text recipe (docs/model.md, "Your own corpus"): the tokenisers against hand-written expectations, vocabularies
from the training split only, the learning-rate schedule against its closed form, resume in the middle of a schedule,
and the tokeniser keys of a search space (one corpus per distinct setting)."""
from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from pefusion.data import cache
from pefusion.data.batching import iter_batches
from pefusion.data.config import DataConfig
from pefusion.data.corpus import load_corpus
from pefusion.data.tokenizer import UNK_ID, alphabetic_words, whitespace_words
from pefusion.errors import ConfigError
from pefusion.fusion.config import ModelConfig, TrainConfig
from pefusion.fusion.training import Trainer
from study_names import TIMING_METRICS
from test_text_data import make_dir

SUBWORD = ("wordpiece", "bpe")


# ---------------------------------------------------------------------------------------------------------
# Tokenisers
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("The cat, sat.", ["the", "cat,", "sat."]),  # punctuation stays attached
    ("GUNS guns\tGuns\n", ["guns", "guns", "guns"]),  # case folded, any whitespace
    ("one<br />two", ["one<br", "/>two"]),  # markup becomes words
    ("", []),
])
def test_whitespace_is_the_papers_lower_split(text, expected):
    assert whitespace_words(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("The cat, sat.", ["the", "cat", "sat"]),
    ("guns, guns. GUNS!", ["guns", "guns", "guns"]),  # one word however it is punctuated or cased
    ("great film<br /><br />Bad ending", ["great", "film", "bad", "ending"]),  # tags dropped, words either side
    ("<a href='x'>link</a>", ["link"]),
    ("don't stop 42 times_2", ["don't", "stop", "times"]),  # inner apostrophe kept; digits and _ are not letters
    ("Café NAÏVE", ["café", "naïve"]),  # letters of any script
    ("<br /> 123 ...", []),  # nothing but markup, digits and punctuation
])
def test_words_are_lowercase_alphabetic_without_markup(text, expected):
    assert alphabetic_words(text) == expected


TRAIN = [("The cat sat on the mat", "pos"), ("the CAT ran<br />far", "neg"), ("cats and the mat", "pos"),
         ("the mat, the cat.", "neg")]
VALIDATION = [("the cat", "neg"), ("<br /><br />", "pos")]
TEST = [("zebra the cat", "pos"), ("The cats!", "neg")]


def _corpus(tmp_path, tokenizer: str, splits=None, **kw):
    data = make_dir(tmp_path / "data", splits=splits or {"train": TRAIN, "validation": VALIDATION, "test": TEST})
    cfg = DataConfig(data_dir=str(data), cache_dir=str(tmp_path / "cache"), tokenizer=tokenizer, **kw)
    corpus = load_corpus(cfg)
    return corpus, cache.load_vocab(corpus, cfg)


def _docs(split, vocab):
    return [[vocab[i] for i in split.doc(i).tolist()] for i in range(len(split))]


def test_words_corpus_merges_punctuated_and_cased_forms_and_keeps_unknowns_unknown(tmp_path):
    corpus, vocab = _corpus(tmp_path, "words", min_freq=2)
    # train counts: the 6, cat 3, mat 3; sat, on, ran, far, cats, and once (below min_freq)
    assert vocab == ["<pad>", "<unk>", "the", "cat", "mat"]
    assert _docs(corpus.train, vocab)[1] == ["the", "cat", "<unk>", "<unk>"]  # ran<br />far: two words, no tag
    assert _docs(corpus.test, vocab) == [["<unk>", "the", "cat"], ["the", "<unk>"]]
    # A document with no word keeps one UNK to attend to; its length before truncation is 0.
    assert _docs(corpus.validation, vocab)[1] == ["<unk>"] and corpus.validation.raw_lengths.tolist() == [2, 0]


@pytest.mark.parametrize("tokenizer", SUBWORD)
def test_subword_pieces_spell_the_text_without_markup_case_or_spaces(tmp_path, tokenizer):
    corpus, vocab = _corpus(tmp_path, tokenizer, min_freq=1, max_vocab=60)
    assert vocab[:2] == ["<pad>", "<unk>"] and len(vocab) <= 60
    assert not any("<" in t or ">" in t or t.strip("#") == "br" for t in vocab[2:])  # <br /> made no piece
    spelled_docs = 0
    for split, texts in (("train", TRAIN), ("test", TEST)):
        for pieces, (text, _) in zip(_docs(getattr(corpus, split), vocab), texts):
            if "<unk>" in pieces:
                continue
            # the pieces, wordpiece's continuation marks removed, spell the text lowercased, tags and spaces removed
            assert "".join(p.removeprefix("##") for p in pieces) == re.sub(r"\s+|<[^<>]*>", "", text).lower()
            spelled_docs += 1
    assert spelled_docs >= 4
    # 'z' never occurs in training text, so no piece spells it: 'zebra' reads as UNK
    assert _docs(corpus.test, vocab)[0][0] == "<unk>"


@pytest.mark.parametrize("tokenizer", ("whitespace", "words") + SUBWORD)
def test_vocabulary_comes_from_the_training_split_only(tmp_path, tokenizer):
    """Validation and test are full of a word (and letters) the training split never has: built from the
    training split, the vocabulary has none of it, and those documents read as UNK."""
    heldout = [("qqq xyzzy qqq", "pos")] * 20 + [("the cat", "neg")]
    corpus, vocab = _corpus(tmp_path, tokenizer, splits={"train": TRAIN, "validation": heldout, "test": heldout},
                            min_freq=1, max_vocab=200)
    assert not any(c in token for token in vocab for c in "qxyz"), vocab
    assert set(corpus.test.doc(0).tolist()) == {UNK_ID}
    assert set(corpus.validation.doc(0).tolist()) == {UNK_ID}


def test_tokenizer_settings_are_part_of_the_cache_key(tmp_path):
    data = make_dir(tmp_path / "data", splits={"train": TRAIN, "validation": VALIDATION, "test": TEST})
    base = DataConfig(data_dir=str(data), cache_dir=str(tmp_path / "cache"))
    keys = {cache.cache_key(dataclasses.replace(base, **kw)) for kw in
            ({}, {"tokenizer": "words"}, {"tokenizer": "bpe"}, {"tokenizer": "bpe", "max_vocab": 100},
             {"tokenizer": "bpe", "min_freq": 3})}
    assert len(keys) == 5


def test_unknown_tokenizer_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="tokenizer='spaces'.*whitespace, words, wordpiece, bpe"):
        DataConfig(tokenizer="spaces")


# ---------------------------------------------------------------------------------------------------------
# Learning-rate schedule and resume
# ---------------------------------------------------------------------------------------------------------

def _closed_form(schedule: str, lr: float, step: int, total: int, warmup: int) -> float:
    """The schedule written out: linear warm-up to lr over `warmup` steps, then cosine or linear decay towards 0
    over the rest, or constant."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / (total - warmup)
    return {"cosine": lr * (1 + math.cos(math.pi * t)) / 2, "linear": lr * (1 - t), "constant": lr}[schedule]


@pytest.mark.parametrize("schedule,warmup", [("cosine", 0.25), ("linear", 0.1), ("constant", 0.3),
                                             ("cosine", 0.0)])
def test_learning_rate_of_every_step_is_the_closed_form(smoke_preset, smoke_corpus, schedule, warmup):
    train = dataclasses.replace(smoke_preset.train, lr=2e-3, batch_size=64, max_epochs=3, lr_schedule=schedule,
                                warmup=warmup, early_stopping=False)
    trainer = Trainer(smoke_preset.model, train, smoke_corpus)
    lrs = []
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"]))
    for _ in range(3):
        trainer.train_epoch()
    per_epoch = -(-len(smoke_corpus.train) // 64)
    total = 3 * per_epoch
    assert len(lrs) == total
    expected = [_closed_form(schedule, 2e-3, s, total, round(warmup * total)) for s in range(total)]
    assert lrs == pytest.approx(expected, rel=1e-12, abs=0)


def test_resume_in_the_middle_of_a_schedule_equals_an_uninterrupted_run(smoke_preset, smoke_corpus):
    """Cosine with warm-up, label smoothing, embedding dropout and AdamW: stopped after epoch 1 of 3 (past the
    warm-up), saved, restored into a new Trainer, trained on: every metric and weight equals the run that never
    stopped."""
    model = dataclasses.replace(smoke_preset.model, norm_first=True, final_norm=True, embed_dropout=0.2)
    train = dataclasses.replace(smoke_preset.train, max_epochs=3, early_stopping=False, lr_schedule="cosine",
                                warmup=0.2, label_smoothing=0.1, optimizer="adamw", weight_decay=0.01)
    straight = Trainer(model, train, smoke_corpus)
    for _ in range(3):
        straight.train_epoch()

    first = Trainer(model, train, smoke_corpus)
    first.train_epoch()
    state = first.state_dict()
    torch.manual_seed(999)  # whatever ran in between
    resumed = Trainer(model, train, smoke_corpus)
    resumed.load_state_dict(state)
    resumed.train_epoch()
    resumed.train_epoch()
    untimed = lambda history: [{k: v for k, v in m.items() if k not in TIMING_METRICS} for m in history]  # noqa: E731
    assert untimed(resumed.history) == untimed(straight.history)
    for name, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    assert resumed.optimizer.param_groups[0]["lr"] == straight.optimizer.param_groups[0]["lr"]


def test_label_smoothing_is_in_the_training_loss(smoke_preset, smoke_corpus):
    """The first step's loss is (1 − ε)·CE + ε·(mean over classes of −log p), computed here from the same model
    (no dropout, so the forward passes agree)."""
    model = dataclasses.replace(smoke_preset.model, dropout=0.0)
    train = dataclasses.replace(smoke_preset.train, max_epochs=1, label_smoothing=0.3)
    trainer = Trainer(model, train, smoke_corpus)
    batch = next(iter_batches(smoke_corpus.train, train.batch_size, shuffle=True, seed=train.seed, epoch=0))
    with torch.no_grad():
        logp = torch.log_softmax(trainer.model(batch.tokens), -1)  # (B, C)
    expected = (0.7 * -logp.gather(1, batch.labels[:, None]).squeeze(1) + 0.3 * -logp.mean(-1)).mean()
    assert next(trainer.train_steps())[0].item() == pytest.approx(expected.item(), rel=1e-5)


def test_final_norm_needs_a_pre_ln_stack():
    with pytest.raises(ConfigError, match="set norm_first=True"):
        ModelConfig(final_norm=True)
    assert ModelConfig(final_norm=True, norm_first=True).final_norm


def test_schedule_and_fractions_are_validated():
    with pytest.raises(ConfigError, match="lr_schedule='step'.*constant, cosine, linear"):
        TrainConfig(lr_schedule="step")
    for key in ("warmup", "label_smoothing"):
        with pytest.raises(ConfigError, match=f"{key}=1.0 is out of range"):
            TrainConfig(**{key: 1.0})
