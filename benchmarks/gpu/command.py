"""GPU training benchmark: throughput, memory, precision, attention kernel, latency and
packing of the paper's models on token ids of realistic lengths. It imports torch, numpy and this package only
(no Ray, MLflow or `datasets`), so it runs on a bare GPU machine.

    python scripts/bench_gpu.py --json-out gpu.jsonl               # both models, every fusion, auto and fp32
    python scripts/bench_gpu.py --models arxiv --fusions add,gate_scalar --precisions auto,tf32 --packing 1,4
    python scripts/bench_gpu.py --device cpu --tiny                # a smoke run of seconds, not a measurement

What runs is the library's own training step (`pefusion.fusion.training.Trainer.step`: forward under the
precision's autocast, fp32 cross-entropy, backward, clipping where the preset clips, optimiser step) on the
preset's model, optimiser and batch size, with the preset's PE (sinusoidal) and each fusion, placed as a trial is
(`pefusion.fusion.device`: the precision resolved on the device, batch widths rounded up to the pad multiple, the
attention policy). The documents are
random token ids (speed does not depend on which ids) whose lengths follow the dataset's (`LENGTHS`), truncated
to the model's max_len as training truncates them; one epoch = `--steps` batches, so every timed epoch holds the
same documents. One JSON line per configuration, on stdout and in --json-out:

- `corpus`, one per model: the length distribution (`length_dist`), every document's length in words before
  truncation (`doc_words`), `max_len`, `mean_tokens` (tokens kept per document) and `truncated_fraction`.
- `train`, per model × fusion × precision × batching × `--attention` (`attention`: `policy`, a trial's kernels,
  or `efficient`, cuDNN's attention off): `bucketed` batches are those training runs
  (`iter_batches`: documents of similar length together, padded to the longest of the batch); `padded` batches
  are random documents padded to max_len (the paper notebook's batches). The first epoch, timed as a trial's first
  epoch runs (every shape new: kernels planned per shape, the CUDA context and handles): `first_epoch_s`,
  `first_epoch_samples_per_s`; then `--warmup` untimed steps and the steady state, a second timed epoch (the first
  one's shapes, in another order): `train_samples_per_s`, `train_tokens_per_s` (tokens kept, padding not
  counted; = samples/s × mean_tokens), `train_ms_per_step`, `first_over_steady` (first_epoch_s / train_s), `padding_fraction` (padded share of the batches' cells),
  `unpadded_batch_fraction` (batches without padding); `peak_mem_alloc_mib` (what tensors held at most,
  torch.cuda.max_memory_allocated) and `peak_mem_reserved_mib` (what the allocator took from the card, which
  packing must fit), null on a CPU; `attention_kernels`: which attention kernel ran, counted over the warm-up
  steps' attention calls (from the profiler: `flash`, `efficient`, `cudnn`, `math` are PyTorch's
  scaled_dot_product_attention kernels, `chunked` is pefusion's CPU kernel for dropout on attention weights);
  `sdpa_backends_ok` / `sdpa_backends_refused`: each SDPA kernel forced in turn on one eval-mode forward of the
  first batch, with PyTorch's reason for a refusal (the model passes its key-padding mask on every batch, padded
  or not, and on a GPU PyTorch's flash kernel takes no mask);
  `latency_ms_per_sample` (eval-mode forward passes over the same batching, the GPU synchronised around each
  timed pass: `Trainer.forward_latency`, the study's latency) and `latency_attention_kernels`. A configuration
  that runs out of GPU memory is a line with `oom: true`.
- `packing`, per model × packing fusion × precision × K: K processes (spawned) train the same configuration at
  once on one device, each its own model, warm-up steps then one timed epoch of bucketed batches, started
  together: `samples_per_s` (all processes' samples over the span from the first start to the last end),
  `tokens_per_s`, `process_samples_per_s` and `process_peak_mem_alloc_mib` / `process_peak_mem_reserved_mib`
  (per process; null on a CPU), `oom` and `oom_processes` (out of memory is recorded, not raised) and `errors`.
- `shapes`, per model × precision × variant: `--shapes` training steps whose batches have as many distinct
  lengths, then the same steps again: `new_ms_per_step`, `seen_ms_per_step` and `new_over_seen` (what a kernel
  planned per shape costs the first time), `lengths` and `widths` (distinct batch widths after rounding).
  `variant` `pefusion` is a trial's way (widths rounded up to the pad multiple, the attention policy); `pytorch`
  is the naive way in the same run (every width as it comes, PyTorch's own kernel order: cuDNN's attention first on
  Hopper since torch 2.11).

- `stacked`, per model × precision × `--stacked` S: one trial (fusion add), then S seeds of it trained together
  as one stacked model (`pefusion.fusion.stacked`), each for one timed epoch after the warm-up steps:
  `trial_samples_per_s`, `samples_per_s` (all S seeds' samples), `speedup` (their ratio: what stacking gains over
  one trial on the card), and the peak memory of each (`trial_peak_mem_*_mib`, `peak_mem_*_mib`); where either
  fails, `error` (the exception's type and first line) and no rates, and the benchmark goes on.

Every `train`, `packing`, `shapes` and `stacked` line also carries the device (`device`, `device_name`, `torch`), the model
(`model`, `pe_type`, `fusion`, `d_model`, `num_layers`, `max_len`, `batch_size`, `params`), the precision asked
for (`precision`, e.g. auto) and run (`precision_resolved`), `pad_multiple`, `attention_policy`, `steps`, `warmup`
and `fp32_matmul_precision` (`torch.backends.cuda.matmul.fp32_precision`: `ieee`, fp32 products without TF32,
unless the precision is tf32).
"""
from __future__ import annotations

import argparse
import itertools
from typing import Sequence

import torch

from benchmarks.gpu.packing import packing_line, run_packing
from benchmarks.gpu.shapes import SHAPE_VARIANTS, measure_shapes
from benchmarks.gpu.stacked import measure_stacked
from benchmarks.gpu.train import ATTENTIONS, measure_train
from benchmarks.gpu.trial import build, describe, freeze_heap, release
from benchmarks.gpu.workload import BATCHINGS, LENGTHS, Plan, corpus_line, make_corpus
from benchmarks.timing import emit
from pefusion.cli.flags import csv_list
from pefusion.errors import ConfigError
from pefusion.fusion.config import FUSIONS, PRECISIONS

INPUT_FUSIONS = tuple(f for f in FUSIONS if f != "none")  # the preset's PE is fused at the input


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: the GPU if one is visible, else the CPU")
    ap.add_argument("--tiny", action="store_true",
                    help="seconds on a CPU: the presets shrunk as --smoke shrinks them, batches of 4, 2 timed steps "
                         "after 1 warm-up step, 1 latency pass, fusion add, K in (1, 2), one CPU "
                         "thread per process; a check that the benchmark runs, not a measurement")
    ap.add_argument("--models", type=csv_list(), default=list(LENGTHS), help=f"from {', '.join(LENGTHS)}")
    ap.add_argument("--fusions", type=csv_list(), help=f"default: all input fusions ({', '.join(INPUT_FUSIONS)})")
    ap.add_argument("--precisions", type=csv_list(),
                    help="from auto (a trial's default: bf16 on a GPU that has it, else fp32), fp32, tf32, bf16 "
                         "(default: auto,fp32; with --tiny auto,bf16)")
    ap.add_argument("--batchings", type=csv_list(), default=list(BATCHINGS), help="bucketed (training's), padded")
    ap.add_argument("--attention", type=csv_list(), default=["policy"],
                    help="train lines' attention kernels: policy (a trial's), efficient (cuDNN's attention off: "
                         "the memory-efficient kernel), e.g. policy,efficient to compare them in one run")
    ap.add_argument("--packing", type=csv_list(int), help="processes at once, K (default 1,2,4,8)")
    ap.add_argument("--packing-fusions", type=csv_list(),
                    help="fusions measured packed (default: add; the fusion is a small part of a step)")
    ap.add_argument("--shapes", type=int,
                    help="distinct lengths of the `shapes` lines (new lengths, then seen ones; default 60, with --tiny "
                         "4; 0: no shapes lines)")
    ap.add_argument("--stacked", type=csv_list(int),
                    help="seeds trained together in the `stacked` lines, each value a line per model and precision "
                         "(default 3,5; with --tiny 2; 0: no stacked lines)")
    ap.add_argument("--steps", type=int, help="timed training steps = batches of the corpus (default 20)")
    ap.add_argument("--warmup", type=int, help="untimed steps before them, profiled for the kernel (default 3)")
    ap.add_argument("--latency-repeats", type=int, help="timed eval passes over the corpus (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", metavar="FILE", help="also write the lines to FILE")
    args = ap.parse_args(argv)
    tiny = args.tiny
    for key, full, small in (("fusions", list(INPUT_FUSIONS), ["add"]), ("packing", [1, 2, 4, 8], [1, 2]),
                             ("precisions", ["auto", "fp32"], ["auto", "bf16"]), ("shapes", 60, 4),
                             ("stacked", [3, 5], [2]),
                             ("packing_fusions", ["add"], ["add"]), ("steps", 20, 2), ("warmup", 3, 1),
                             ("latency_repeats", 3, 1)):
        if getattr(args, key) is None:
            setattr(args, key, small if tiny else full)
    return args


def check_args(args: argparse.Namespace) -> None:
    """A ConfigError naming the flag and the allowed values for anything out of range."""
    for flag, values, allowed in (("--models", args.models, tuple(LENGTHS)), ("--fusions", args.fusions, INPUT_FUSIONS),
                                  ("--packing-fusions", args.packing_fusions, INPUT_FUSIONS),
                                  ("--precisions", args.precisions, PRECISIONS),
                                  ("--batchings", args.batchings, BATCHINGS),
                                  ("--attention", args.attention, ATTENTIONS)):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ConfigError(f"{flag} {','.join(bad) or '(empty)'} is not allowed; choose from {', '.join(allowed)}")
    if args.shapes < 0:
        raise ConfigError(f"--shapes {args.shapes} must be >= 0 (0: no shapes lines)")
    if any(s < 0 for s in args.stacked):
        raise ConfigError(f"--stacked {','.join(map(str, args.stacked))}: seeds must be >= 0 (0: no stacked lines)")
    for flag, value, why in (("--steps", args.steps, ""), ("--latency-repeats", args.latency_repeats, ""),
                             ("--warmup", args.warmup, " (the warm-up steps show which attention kernel runs)")):
        if value < 1:
            raise ConfigError(f"{flag} {value} must be >= 1{why}")
    if any(k < 1 for k in args.packing):
        raise ConfigError(f"--packing {','.join(map(str, args.packing))}: every K must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu (or auto)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    plan = Plan(tiny=args.tiny, steps=args.steps, warmup=args.warmup, latency_repeats=args.latency_repeats,
                seed=args.seed, device=device)
    if args.tiny:
        torch.set_num_threads(1)
    freeze_heap()
    out = open(args.json_out, "w", encoding="utf-8") if args.json_out else None
    try:
        corpora = {model: make_corpus(plan, model) for model in args.models}
        for model, corpus in corpora.items():
            emit(corpus_line(plan, model, corpus), out)
            for fusion in args.fusions:
                for precision in args.precisions:
                    for batching, attention in itertools.product(args.batchings, args.attention):
                        emit(measure_train(plan, model, fusion, precision, batching, attention, corpus), out)
            for precision in args.precisions:
                for variant in SHAPE_VARIANTS if args.shapes else ():
                    emit(measure_shapes(plan, model, precision, variant, args.shapes, corpus), out)
                for seeds in (s for s in args.stacked if s):
                    emit(measure_stacked(plan, model, precision, seeds, corpus), out)
        configs = [(m, f, p) for m in args.models for f in args.packing_fusions for p in args.precisions]
        fields = {}
        for config in configs:  # what each line says about its configuration, from a trainer built here
            trainer = build(plan, *config, corpora[config[0]])
            fields[config] = describe(plan, config[0], trainer)
            del trainer
        release(torch.device(device))
        for k in args.packing:
            for config, outs in zip(configs, run_packing(plan, k, configs)):
                emit(packing_line(k, outs, corpora[config[0]], fields[config]), out)
    finally:
        if out is not None:
            out.close()
    return 0
