"""Training-throughput benchmark (issue #2, item 5): the library's pipeline vs the paper notebook's, side by side.

    # a document set whose lengths vary between 50 and 1 500 words (train/validation/test_clean.jsonl)
    python scripts/bench_train.py --make-data /tmp/bench_loguniform --n-docs 1000 --length-dist loguniform
    # the issue's settings; --compare-notebook (the default) also runs the notebook baseline in the same process
    python scripts/bench_train.py --data-dir /tmp/bench_loguniform --max-len 512 --batch-size 32 --d-model 128 \\
        --nhead 8 --num-layers 2 --dim-ff 256 --pe-type sinusoidal --fusion gate_scalar --threads 1 --epochs 1 --json

What is measured, for "ours" and, with --compare-notebook, for the notebook baseline:

- tokenize: ours = `load_corpus` into a fresh temporary cache (read the files, train-split vocabulary, token ids
  of every split, cache write), in documents of all splits per second; notebook = one `__getitem__` per training
  document (what its loader does to every document every epoch: lowercase split, vocab lookup of every word,
  truncate, pad to max_len, torch.tensor).
- data: one full epoch of batches, nothing else. Ours = `iter_batches` over the cached split (a later epoch);
  notebook = its DataLoader(batch_size, shuffle=True), which re-tokenises every document.
- train: `--epochs` epochs after one warm-up batch each. Ours = `pefusion.fusion.training.Trainer.train_steps`, the step
  loop of `Trainer.train_epoch` (iter_batches, forward, cross-entropy, finiteness check, backward, step) on the
  model and optimiser a `Trainer` builds; its per-epoch validation pass is not training and not timed.
  Notebook = its loop (DataLoader, forward, cross-entropy, zero_grad, backward, Adam step). The two run one
  step each in turn, every step (batch loading included) clocked to its side, so whatever else the machine runs
  slows both alike: "side by side in one run".

Both train the same model: same vocabulary (the training split's), same PE and fusion modules, parameter counts
asserted equal, dropout `--dropout` everywhere including the attention probabilities. The notebook model is
nn.Embedding + PE/fusion + nn.TransformerEncoder(nn.TransformerEncoderLayer(batch_first=True)) + masked mean
pooling + Linear, written here from the paper's description, for timing only.

Times are wall clock and CPU (process) time; both are printed, with the ratios ours/notebook (`speedup_*`);
`targets_met` checks issue #2's targets (train >= 2x, data >= 20x, tokenize >= 1x) on the CPU-time ratios.
`train_gflops_per_s` counts useful forward+backward matmul FLOPs (3 × forward) per real token: per layer
2·4d² (q, k, v, out projections) + 2·2·d·dim_ff (feed-forward) + 2·2·L·d (scores and weighted sum over the L
real tokens of its document); embeddings, fusion, norms and head are not counted, and padding counts as no
useful work, so both implementations are credited the same FLOPs.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pefusion  # noqa: F401  (first: it sets PyTorch's huge-page switch, read when torch loads)
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from pefusion.cli.flags import print_result, run_main
from pefusion.fusion.config import ATTENTION_PE_TYPES, FUSIONS, PE_TYPES, ModelConfig, TrainConfig
from pefusion.errors import ConfigError
from pefusion.data.config import DataConfig
from pefusion.fusion.operators import build_fusion
from pefusion.fusion.positional import build_positional
from pefusion.data.batching import batch_order, iter_batches, pad_batch
from pefusion.data.cache import load_vocab
from pefusion.data.corpus import load_corpus
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.data.readers import find_split_files
from pefusion.fusion.training import Trainer

# Issue #2's targets for ours/notebook, checked on the CPU-time rates (the wall-clock ones agree when interleaved).
TARGETS = {"train": 2.0, "data": 20.0, "tokenize": 1.0}


def timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    """(result, wall seconds, CPU seconds), starting from a collected heap: otherwise the first measurement after
    the imports pays for a full garbage collection over torch's ~10^6 objects (0.1 s here), whatever it times."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


# --------------------------------------------------------------------------------------------------------------
# Benchmark documents
# --------------------------------------------------------------------------------------------------------------


def make_documents(directory: Path, n_docs: int, n_eval: int, min_words: int, max_words: int, length_dist: str,
                   num_classes: int, seed: int) -> dict[str, float]:
    """Write train/validation/test_clean.jsonl (the paper's layout) of Zipf-distributed words with lengths drawn
    uniformly or log-uniformly from [min_words, max_words]; labels are random (only speed is measured here)."""
    rng = np.random.default_rng(seed)
    vocab_size = 50_000
    weights = 1.0 / (np.arange(vocab_size) + 2.7) ** 1.1  # Zipf-Mandelbrot, roughly like English word counts
    words = np.array([f"w{i}" for i in range(vocab_size)], dtype=object)
    directory.mkdir(parents=True, exist_ok=True)
    stats = {}
    for split, n in (("train", n_docs), ("validation", n_eval), ("test", n_eval)):
        if length_dist == "uniform":
            lengths = rng.integers(min_words, max_words + 1, size=n)
        else:
            lengths = np.rint(np.exp(rng.uniform(math.log(min_words), math.log(max_words), size=n))).astype(int)
        tokens = rng.choice(vocab_size, size=int(lengths.sum()), p=weights / weights.sum())
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        labels = rng.integers(num_classes, size=n)
        with open(directory / f"{split}_clean.jsonl", "w", encoding="utf-8") as f:
            for i in range(n):
                text = " ".join(words[tokens[offsets[i]:offsets[i + 1]]])
                f.write(json.dumps({"text": text, "label": int(labels[i])}) + "\n")
        stats[f"{split}_docs"] = n
        if split == "train":
            stats["train_mean_words"] = float(lengths.mean())
    return stats


# --------------------------------------------------------------------------------------------------------------
# The paper notebook's pipeline (baseline)
# --------------------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------------------


def useful_train_flops(lengths: np.ndarray, cfg: ModelConfig) -> float:
    """Forward+backward matmul FLOPs of one epoch over documents of `lengths` real tokens (see the docstring)."""
    L = lengths.astype(np.float64)
    d, ff = cfg.d_model, cfg.dim_ff
    per_layer = (L * (8 * d * d + 4 * d * ff) + 4 * d * L * L).sum()
    return 3.0 * cfg.num_layers * per_layer


def padding_fraction(split: EncodedSplit, batch_size: int, seed: int, epoch: int) -> float:
    """Share of the (B, T) slots of an epoch's bucketed batches that are padding."""
    lengths = split.lengths
    slots = sum(len(b) * int(lengths[b].max()) for b in batch_order(lengths, batch_size, shuffle=True, seed=seed,
                                                                       epoch=epoch))
    return 1.0 - lengths.sum() / slots


class Side:
    """One implementation under test: its training steps and the wall/CPU clocks spent in them."""

    def __init__(self, steps: Callable[[int], Iterator[int]]):
        self.steps = steps  # steps(epoch) runs one training step per next() and yields the batch size
        self.wall = self.cpu = 0.0
        self.samples = 0


def train_interleaved(sides: list[Side], epochs: int) -> None:
    """Run the sides' epochs one training step of each in turn, clocking each step (its batch loading included)
    to its side: whatever else the machine runs slows both sides alike."""
    for epoch in range(epochs):
        running = {id(side): (side, side.steps(epoch)) for side in sides}
        while running:
            for key, (side, steps) in list(running.items()):
                wall, cpu = time.perf_counter(), time.process_time()
                n = next(steps, None)
                side.wall += time.perf_counter() - wall
                side.cpu += time.process_time() - cpu
                if n is None:
                    del running[key]
                else:
                    side.samples += n


def ours_data(args: argparse.Namespace) -> tuple[EncodedCorpus, dict[str, int], dict]:
    """The corpus tokenised into a fresh cache (timed: cold), one timed warm epoch of batches."""
    with tempfile.TemporaryDirectory(prefix="bench_train_cache_") as cache:
        data_cfg = DataConfig(data_dir=args.data_dir, max_len=args.max_len, cache_dir=cache)
        corpus, tok_s, tok_cpu = timed(lambda: load_corpus(data_cfg))
        _, load_s, _ = timed(lambda: load_corpus(data_cfg))  # cache hit
        vocab = {w: i for i, w in enumerate(load_vocab(corpus, data_cfg))}
    train = corpus.train
    n_docs = sum(len(corpus.split(s)) for s in ("train", "validation", "test"))

    def data_pass(epoch: int) -> int:
        return sum(len(b.labels) for b in iter_batches(train, args.batch_size, shuffle=True, seed=args.seed,
                                                       epoch=epoch))

    data_pass(0)
    n, data_s, data_cpu = timed(lambda: data_pass(1))  # an epoch after the first
    assert n == len(train)
    return corpus, vocab, {
        "n_train": len(train), "vocab_size": corpus.vocab_size, "num_classes": corpus.num_classes,
        "mean_words": float(train.raw_lengths.mean()),
        "truncated_fraction": float((train.raw_lengths > args.max_len).mean()),
        "tokenize_s": tok_s, "tokenize_samples_per_s": n_docs / tok_s, "tokenize_samples_per_cpu_s": n_docs / tok_cpu,
        "cache_load_s": load_s,
        "data_s": data_s, "data_samples_per_s": len(train) / data_s, "data_samples_per_cpu_s": len(train) / data_cpu,
        "padding_fraction": padding_fraction(train, args.batch_size, args.seed, 0),
    }


def ours_side(args: argparse.Namespace, trainer: Trainer) -> Side:
    """`Trainer.train_steps`, the training loop of `Trainer.train_epoch` (its validation pass is not training)."""
    train, model, optimizer = trainer.corpus.train, trainer.model, trainer.optimizer
    longest = np.argsort(train.lengths, kind="stable")[-args.batch_size:]  # warm up on the widest batch
    F.cross_entropy(model(torch.from_numpy(pad_batch(train, longest))), torch.from_numpy(train.labels[longest])
                    ).backward()
    optimizer.zero_grad(set_to_none=True)  # no parameter update

    def steps(epoch: int) -> Iterator[int]:
        trainer.epoch = epoch
        for _, n in trainer.train_steps():
            yield n

    return Side(steps)


def notebook_data(args: argparse.Namespace, vocab: dict[str, int], labels: np.ndarray) -> tuple[DataLoader, dict]:
    """The notebook's Dataset and DataLoader; one timed tokenisation of every document, one timed epoch.
    `labels`: the library's class ids of the same documents (any label type maps to 0..C-1 the same way)."""
    texts = read_train_texts(Path(args.data_dir))
    if len(texts) != len(labels):
        raise AssertionError(f"the notebook reader kept {len(texts)} training documents, the library {len(labels)}")
    ds = NotebookDataset(texts, labels.tolist(), vocab, args.max_len)
    _, tok_s, tok_cpu = timed(lambda: [ds[i] for i in range(len(ds))])
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(args.seed))
    sum(len(y) for _, y in loader)
    n, data_s, data_cpu = timed(lambda: sum(len(y) for _, y in loader))  # a later epoch: the same work again
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


def train_rates(side: Side, flops_per_epoch: float, epochs: int) -> dict:
    flops = epochs * flops_per_epoch
    return {"train_s": side.wall, "train_cpu_s": side.cpu, "train_samples_per_s": side.samples / side.wall,
            "train_samples_per_cpu_s": side.samples / side.cpu, "train_gflops_per_s": flops / side.wall / 1e9,
            "train_gflops_per_cpu_s": flops / side.cpu / 1e9}


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--data-dir", help="folder with train/validation/test files (text, label)")
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--nhead", type=int, default=8)
    ap.add_argument("--num-layers", type=int, default=2)
    ap.add_argument("--dim-ff", type=int, default=256)
    ap.add_argument("--dropout", type=float, default=0.1, help="dropout everywhere, attention probabilities too")
    ap.add_argument("--pe-type", default="sinusoidal", choices=PE_TYPES)
    ap.add_argument("--fusion", default="gate_scalar", choices=FUSIONS)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--epochs", type=int, default=1, help="timed epochs")
    ap.add_argument("--compare-notebook", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the paper notebook's pipeline in this process and print the ratios "
                         "(default: on; the notebook side takes most of the time)")
    ap.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    g = ap.add_argument_group("making a benchmark document set (writes it and exits)")
    g.add_argument("--make-data", metavar="DIR", help="write train/validation/test_clean.jsonl into DIR")
    g.add_argument("--n-docs", type=int, default=1000, help="training documents (default 1000)")
    g.add_argument("--n-eval", type=int, default=64, help="validation and test documents each (default 64)")
    g.add_argument("--min-words", type=int, default=50)
    g.add_argument("--max-words", type=int, default=1500)
    g.add_argument("--length-dist", choices=("uniform", "loguniform"), default="loguniform")
    g.add_argument("--num-classes", type=int, default=11)
    return ap.parse_args(argv)


def emit(record: dict, as_json: bool) -> None:
    """One JSON line, or the ours / notebook / ratio table."""
    rounded = {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in record.items()}
    if as_json:
        print_result(rounded, as_json=True)
        return
    rows = [("train samples/s", "train_samples_per_s"), ("train samples/CPU-s", "train_samples_per_cpu_s"),
            ("train GFLOP/s", "train_gflops_per_s"), ("data samples/s (warm)", "data_samples_per_s"),
            ("data samples/CPU-s", "data_samples_per_cpu_s"), ("tokenize samples/s (cold)", "tokenize_samples_per_s"),
            ("tokenize samples/CPU-s", "tokenize_samples_per_cpu_s"), ("padding fraction", "padding_fraction")]
    print(f"{record['n_train']} training documents, mean {record['mean_words']:.0f} words, "
          f"{100 * record['truncated_fraction']:.0f}% longer than max_len={record['max_len']}; "
          f"{record['params']} parameters; {record['threads']} thread(s)")
    print(f"{'':28s}{'ours':>12s}{'notebook':>12s}{'ours/nb':>10s}")
    for label, key in rows:
        nb = rounded.get(f"notebook_{key}")
        ratio = rounded.get(f"speedup_{key}")
        print(f"{label:28s}{rounded[key]:>12}{'' if nb is None else nb:>12}{'' if ratio is None else ratio:>10}")
    if "targets_met" in record:
        print("targets (CPU-time ratios):", ", ".join(f"{k} >= {TARGETS[k]}x: {'yes' if v else 'NO'}"
                                                       for k, v in record["targets_met"].items()))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.make_data:
        if not 0 < args.min_words <= args.max_words:
            raise ConfigError(f"--min-words {args.min_words} and --max-words {args.max_words} must satisfy "
                              f"0 < min <= max")
        stats = make_documents(Path(args.make_data), args.n_docs, args.n_eval, args.min_words, args.max_words,
                               args.length_dist, args.num_classes, args.seed)
        print(json.dumps({"made": args.make_data, "length_dist": args.length_dist, **stats}), flush=True)
        return 0
    if not args.data_dir:
        raise ConfigError("--data-dir is required (make a document set first with --make-data DIR)")
    if args.threads <= 0 or args.epochs <= 0:
        raise ConfigError(f"--threads {args.threads} and --epochs {args.epochs} must be > 0")
    if args.compare_notebook and args.pe_type in ATTENTION_PE_TYPES:
        raise ConfigError(f"--pe-type {args.pe_type} acts inside attention, which the notebook's "
                          f"nn.TransformerEncoder cannot do; use an input PE or --no-compare-notebook")
    torch.set_num_threads(args.threads)
    gc.collect()
    gc.freeze()  # the imported modules' objects are never garbage: later collections skip them, for both sides
    model_cfg = ModelConfig(d_model=args.d_model, nhead=args.nhead, num_layers=args.num_layers, dim_ff=args.dim_ff,
                            dropout=args.dropout, pe_type=args.pe_type, fusion=args.fusion, max_len=args.max_len)
    train_cfg = TrainConfig(lr=args.lr, batch_size=args.batch_size, max_epochs=args.epochs, early_stopping=False,
                            seed=args.seed, device="cpu")
    corpus, vocab, ours = ours_data(args)
    trainer = Trainer(model_cfg, train_cfg, corpus, device=torch.device("cpu"))  # seeds, builds model and Adam
    params = sum(p.numel() for p in trainer.model.parameters())
    sides = [ours_side(args, trainer)]
    if args.compare_notebook:
        loader, nb = notebook_data(args, vocab, corpus.train.labels)
        torch.manual_seed(args.seed)
        nb_model = NotebookModel(model_cfg, len(vocab), corpus.num_classes)
        nb_params = sum(p.numel() for p in nb_model.parameters())
        if nb_params != params:
            raise AssertionError(f"the notebook model has {nb_params} parameters, ours {params}")
        sides.append(notebook_side(args, nb_model, loader))
    train_interleaved(sides, args.epochs)
    flops_per_epoch = useful_train_flops(corpus.train.lengths, model_cfg)
    record = {"data_dir": args.data_dir, "max_len": args.max_len, "batch_size": args.batch_size,
              "d_model": args.d_model, "nhead": args.nhead, "num_layers": args.num_layers, "dim_ff": args.dim_ff,
              "dropout": args.dropout, "pe_type": args.pe_type, "fusion": args.fusion, "threads": args.threads,
              "epochs": args.epochs, "torch": torch.__version__, "params": params,
              **ours, **train_rates(sides[0], flops_per_epoch, args.epochs)}
    if args.compare_notebook:
        nb.update(train_rates(sides[1], flops_per_epoch, args.epochs))
        record.update({f"notebook_{k}": v for k, v in nb.items()})
        for key in ("train_samples_per_s", "train_samples_per_cpu_s", "train_gflops_per_s", "data_samples_per_s",
                    "data_samples_per_cpu_s", "tokenize_samples_per_s", "tokenize_samples_per_cpu_s"):
            record[f"speedup_{key}"] = record[key] / nb[key]
        record["targets_met"] = {k: record[f"speedup_{k}_samples_per_cpu_s"] >= target
                                 for k, target in TARGETS.items()}
    emit(record, args.json)
    return 0


if __name__ == "__main__":
    run_main(main)
