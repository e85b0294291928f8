"""Subword vocabularies (`wordpiece`, `bpe`) learned on the TRAINING split with Hugging Face `tokenizers`.

A word-level vocabulary maps every word it did not keep to UNK; a subword vocabulary of the same size spells rare
and unseen words out of pieces (`unfathomable` -> `un`, `##fat`, `##hom`, `##able`), which matters on small
corpora whose test split is full of words the training split never saw. Same conventions as the word-level
tokenisers: PAD=0, UNK=1, lowercase, markup tags removed, and only the training split's text shapes the vocabulary.
`max_vocab` is the vocabulary size the trainer aims for (specials included) and `min_freq` the fewest occurrences
of a merged pair it accepts.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from pefusion.data.tokenizer import SPECIAL_TOKENS, UNK_ID, pack

SUBWORD_TOKENIZERS = ("wordpiece", "bpe")


def train_subword(texts: Sequence[str], kind: str, max_vocab: int, min_freq: int):
    """A `tokenizers.Tokenizer` of kind 'wordpiece' or 'bpe' trained on `texts` (the training split)."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    unk = SPECIAL_TOKENS[UNK_ID]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk))
        trainer = trainers.WordPieceTrainer(vocab_size=max_vocab, min_frequency=min_freq,
                                            special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=unk))
        trainer = trainers.BpeTrainer(vocab_size=max_vocab, min_frequency=min_freq,
                                      special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    else:
        raise ValueError(f"unknown subword tokenizer {kind!r}; choose from {', '.join(SUBWORD_TOKENIZERS)}")
    # Tags go first, so that `<br />` never becomes pieces; then Unicode compatibility forms and lowercase.
    tok.normalizer = normalizers.Sequence([normalizers.Replace(Regex(r"<[^<>]*>"), " "), normalizers.NFKC(),
                                           normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # words and runs of punctuation: \w+|[^\w\s]+
    tok.train_from_iterator(texts, trainer)
    return tok


def subword_vocabulary(tok) -> dict[str, int]:
    """token -> id of a trained tokenizer, in id order (PAD=0 and UNK=1 first, as the trainer's specials)."""
    vocab = tok.get_vocab()
    if [vocab.get(t) for t in SPECIAL_TOKENS] != [0, 1]:
        raise ValueError(f"the subword vocabulary must start with {SPECIAL_TOKENS}")
    return dict(sorted(vocab.items(), key=lambda item: item[1]))


def encode_subword(tok, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids of `texts` with a trained tokenizer, each truncated to max_len -> (ids int32 (total,),
    offsets int64 (N+1,), raw_lengths int64 (N,) in subword tokens before truncation)."""
    encodings = tok.encode_batch(list(texts), add_special_tokens=False)  # Rust, all cores
    docs = [np.asarray(e.ids[:max_len], dtype=np.int64) for e in encodings]
    return pack(docs, np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings)))
