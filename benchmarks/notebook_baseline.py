"""The paper notebook's training pipeline, the baseline of `benchmarks/train.py`, written from the paper's
description for timing only: its Dataset (tokenising every document in `__getitem__`, every epoch), its model
(nn.Embedding + the library's PE/fusion modules + nn.TransformerEncoder + masked mean pooling + Linear) and its
loop (DataLoader, forward, cross-entropy, zero_grad, backward, Adam step)."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.timing import Side, timed
from pefusion.data.readers import find_split_files
from pefusion.errors import ConfigError
from pefusion.fusion.config import ModelConfig
from pefusion.fusion.operators import build_fusion
from pefusion.fusion.positional import build_positional


class NotebookDataset(Dataset):
    """Tokenises in `__getitem__`, every time: lowercase whitespace words, vocabulary lookup of every word,
    truncate, pad to max_len."""

    def __init__(self, texts: list[str], labels: list[int], vocab: dict[str, int], max_len: int):
        self.texts, self.labels, self.vocab, self.max_len = texts, labels, vocab, max_len

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = [self.vocab.get(w, 1) for w in self.texts[i].lower().strip().split()][:self.max_len]
        ids += [0] * (self.max_len - len(ids))
        return torch.tensor(ids), torch.tensor(self.labels[i], dtype=torch.long)


class NotebookModel(nn.Module):
    """Embedding·√d, the same PE and fusion modules as ours, nn.TransformerEncoder, masked mean pooling, Linear."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, num_classes: int):
        super().__init__()
        d = cfg.d_model
        self.d = d
        self.embed = nn.Embedding(vocab_size, d, padding_idx=0)
        self.positional, self.fuse = build_positional(cfg), build_fusion(cfg)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, cfg.nhead, cfg.dim_ff, cfg.dropout, batch_first=True), cfg.num_layers)
        self.head = nn.Linear(d, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, max_len) -> logits (B, C)."""
        pad = x == 0
        h = self.fuse(self.embed(x) * math.sqrt(self.d), self.positional(x.shape[1]), pad)
        h = self.encoder(h, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))


def read_train_texts(data_dir: Path) -> list[str]:
    """The training texts as the notebook held them: the JSONL records' `text`, empty ones dropped."""
    texts = []
    for path in find_split_files(data_dir)["train"]:
        if path.suffix.lower() != ".jsonl":
            raise ConfigError(f"{path}: the notebook baseline reads JSONL training files only (the paper's layout); "
                              f"use --no-compare-notebook")
        with open(path, encoding="utf-8") as f:
            texts += [t for t in (json.loads(line)["text"] for line in f if line.strip()) if t and t.strip()]
    return texts


def notebook_data(args: argparse.Namespace, vocab: dict[str, int], labels: np.ndarray) -> tuple[DataLoader, dict]:
    """The notebook's Dataset and DataLoader; one timed tokenisation of every document, one timed epoch.
    `labels`: the library's class ids of the same documents (any label type maps to 0..C-1 the same way)."""
    texts = read_train_texts(Path(args.data_dir))
    if len(texts) != len(labels):
        raise AssertionError(f"the notebook reader kept {len(texts)} training documents, the library {len(labels)}")
    ds = NotebookDataset(texts, labels.tolist(), vocab, args.max_len)
    _, tok_s, tok_cpu = timed(lambda: [ds[i] for i in range(len(ds))], collect=True)
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(args.seed))
    sum(len(y) for _, y in loader)
    # a later epoch: the same work again
    n, data_s, data_cpu = timed(lambda: sum(len(y) for _, y in loader), collect=True)
    assert n == len(ds)
    real = sum(min(len(t.split()), args.max_len) for t in texts)
    return loader, {
        "tokenize_s": tok_s, "tokenize_samples_per_s": len(ds) / tok_s, "tokenize_samples_per_cpu_s": len(ds) / tok_cpu,
        "data_s": data_s, "data_samples_per_s": len(ds) / data_s, "data_samples_per_cpu_s": len(ds) / data_cpu,
        "padding_fraction": 1.0 - real / (len(ds) * args.max_len),
    }


def notebook_side(args: argparse.Namespace, model: NotebookModel, loader: DataLoader) -> Side:
    """The notebook's training loop: DataLoader, forward, cross-entropy, backward, Adam step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    x, y = next(iter(loader))
    F.cross_entropy(model(x), y).backward()  # warm-up; every notebook batch has this width
    optimizer.zero_grad(set_to_none=True)

    def steps(epoch: int) -> Iterator[int]:
        model.train()
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            yield len(y)

    return Side(steps)
