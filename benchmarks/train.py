"""Training-throughput benchmark: the library's pipeline vs the paper notebook's, side by side.

    # a document set whose lengths vary between 50 and 1 500 words (train/validation/test_clean.jsonl)
    python scripts/bench_train.py --make-data /tmp/bench_loguniform --n-docs 1000 --length-dist loguniform
    # the ArXiv model's sizes at 512 tokens; --compare-notebook (the default) runs the notebook's way alongside
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
`targets_met` checks the project's targets (train >= 2x, data >= 20x, tokenize >= 1x) on the CPU-time ratios.
`train_gflops_per_s` counts useful forward+backward matmul FLOPs (3 × forward) per real token: per layer
2·4d² (q, k, v, out projections) + 2·2·d·dim_ff (feed-forward) + 2·2·L·d (scores and weighted sum over the L
real tokens of its document); embeddings, fusion, norms and head are not counted, and padding counts as no
useful work, so both implementations are credited the same FLOPs.
"""
from __future__ import annotations

import argparse
import gc
import json
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.corpus import make_documents
from benchmarks.notebook_baseline import NotebookModel, notebook_data, notebook_side
from benchmarks.timing import Side, emit, rounded, timed, train_interleaved
from pefusion.data.config import DataConfig
from pefusion.data.encoded import EncodedCorpus, EncodedSplit
from pefusion.data.batching import batch_order, iter_batches, pad_batch
from pefusion.data.corpus import load_corpus
from pefusion.data.cache import load_vocab
from pefusion.errors import ConfigError
from pefusion.fusion.config import ATTENTION_PE_TYPES, FUSIONS, PE_TYPES, ModelConfig, TrainConfig
from pefusion.fusion.training import Trainer

# The targets for ours/notebook (a speed-up worth the pipeline's complexity), checked on the CPU-time rates (the
# wall-clock ones agree when interleaved).
TARGETS = {"train": 2.0, "data": 20.0, "tokenize": 1.0}


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


def ours_data(args: argparse.Namespace) -> tuple[EncodedCorpus, dict[str, int], dict]:
    """The corpus tokenised into a fresh cache (timed: cold), one timed warm epoch of batches."""
    with tempfile.TemporaryDirectory(prefix="bench_train_cache_") as cache:
        data_cfg = DataConfig(data_dir=args.data_dir, max_len=args.max_len, cache_dir=cache)
        corpus, tok_s, tok_cpu = timed(lambda: load_corpus(data_cfg), collect=True)
        _, load_s, _ = timed(lambda: load_corpus(data_cfg), collect=True)  # cache hit
        vocab = {w: i for i, w in enumerate(load_vocab(corpus, data_cfg))}
    train = corpus.train
    n_docs = sum(len(corpus.split(s)) for s in ("train", "validation", "test"))

    def data_pass(epoch: int) -> int:
        return sum(len(b.labels) for b in iter_batches(train, args.batch_size, shuffle=True, seed=args.seed,
                                                       epoch=epoch))

    data_pass(0)
    n, data_s, data_cpu = timed(lambda: data_pass(1), collect=True)  # an epoch after the first
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


def print_table(record: dict) -> None:
    """The ours / notebook / ratio table."""
    shown = rounded(record)
    rows = [("train samples/s", "train_samples_per_s"), ("train samples/CPU-s", "train_samples_per_cpu_s"),
            ("train GFLOP/s", "train_gflops_per_s"), ("data samples/s (warm)", "data_samples_per_s"),
            ("data samples/CPU-s", "data_samples_per_cpu_s"), ("tokenize samples/s (cold)", "tokenize_samples_per_s"),
            ("tokenize samples/CPU-s", "tokenize_samples_per_cpu_s"), ("padding fraction", "padding_fraction")]
    print(f"{record['n_train']} training documents, mean {record['mean_words']:.0f} words, "
          f"{100 * record['truncated_fraction']:.0f}% longer than max_len={record['max_len']}; "
          f"{record['params']} parameters; {record['threads']} thread(s)")
    print(f"{'':28s}{'ours':>12s}{'notebook':>12s}{'ours/nb':>10s}")
    for label, key in rows:
        nb = shown.get(f"notebook_{key}")
        ratio = shown.get(f"speedup_{key}")
        print(f"{label:28s}{shown[key]:>12}{'' if nb is None else nb:>12}{'' if ratio is None else ratio:>10}")
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
    if args.json:
        emit(record)
    else:
        print_table(record)
    return 0
