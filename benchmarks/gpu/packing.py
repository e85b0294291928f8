"""The GPU benchmark's `packing` lines: K processes (spawned: CUDA cannot be shared across fork) training the same
configuration at once on one device, started together behind a barrier, each its own model; what they train
together per second, and each one's rate and peak memory. Out of memory and a worker's failure are recorded in the
line, not raised.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import threading
import time
from typing import Any

import torch

from benchmarks.gpu.trial import build, freeze_heap, peak_memory_mib, release, reset_peak_memory, run_steps, warm_up
from benchmarks.gpu.workload import Plan, epoch_batches, make_corpus
from pefusion.data.encoded import EncodedCorpus

BARRIER_TIMEOUT_S = 900.0  # a packing worker waits this long for the others before giving up


def pack_worker(rank: int, k: int, plan: Plan, configs: list[tuple[str, str, str]], barrier: Any,
                results: Any) -> None:
    """One of K processes: for each configuration, build and warm up, wait for the others, train one timed epoch,
    wait again (so that no configuration's timing overlaps another's set-up), put a result on `results`."""
    torch.set_num_threads(1 if plan.tiny else max(1, (os.cpu_count() or 1) // k))  # K processes share the cores
    device = torch.device(plan.device)
    freeze_heap()
    corpora: dict[str, EncodedCorpus] = {}
    for i, (model, fusion, precision) in enumerate(configs):
        corpus = corpora.setdefault(model, make_corpus(plan, model))
        out: dict[str, Any] = {"config": i, "rank": rank, "oom": False, "error": ""}
        trainer = None
        try:
            reset_peak_memory(device)
            trainer = build(plan, model, fusion, precision, corpus)
            warm_up(plan, trainer, "bucketed")
        except torch.OutOfMemoryError:
            out["oom"] = True
        except Exception as exc:  # recorded in the line: one broken configuration must not stop the others
            out["error"] = f"{type(exc).__name__}: {exc}"
        try:
            barrier.wait(BARRIER_TIMEOUT_S)
            if trainer is not None and not out["oom"] and not out["error"]:
                cfg = trainer.train_cfg
                start = time.monotonic()
                out["samples"] = run_steps(trainer, epoch_batches(
                    corpus.train, cfg.batch_size, "bucketed", train=True, seed=plan.seed, epoch=1,
                    max_len=trainer.model_cfg.max_len, device=device, pad_multiple=trainer.placement.pad_multiple))
                out.update(start=start, end=time.monotonic())
                out["peak_alloc"], out["peak_reserved"] = peak_memory_mib(device)
        except torch.OutOfMemoryError:
            out["oom"] = True
        except threading.BrokenBarrierError:
            out["error"] = "another process of this packing failed; stopped"
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            trainer = None
            release(device)
        try:
            barrier.wait(BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            out["error"] = out["error"] or "another process of this packing failed; stopped"
        results.put(out)
        if out["error"].startswith("another process"):
            return


def run_packing(plan: Plan, k: int, configs: list[tuple[str, str, str]]) -> list[list[dict[str, Any]]]:
    """Spawn K workers over `configs`; per configuration, the K workers' results (a worker that died is an
    error result)."""
    ctx = mp.get_context("spawn")  # a fresh interpreter per process: CUDA cannot be shared across fork
    barrier, results = ctx.Barrier(k), ctx.Queue()
    procs = [ctx.Process(target=pack_worker, args=(rank, k, plan, configs, barrier, results), daemon=True)
             for rank in range(k)]
    for proc in procs:
        proc.start()
    got: list[list[dict[str, Any]]] = [[] for _ in configs]
    expected = k * len(configs)
    received = 0
    while received < expected:
        try:
            out = results.get(timeout=1.0)
        except queue_module.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) or all(p.exitcode is not None for p in procs):
                barrier.abort()  # a worker died: the others stop instead of waiting for it
                if all(p.exitcode is not None for p in procs) and results.empty():
                    break
            continue
        got[out["config"]].append(out)
        received += 1
    for proc in procs:
        proc.join(timeout=30)
    codes = [p.exitcode for p in procs]
    for outs in got:
        missing = k - len(outs)
        outs += [{"oom": False, "error": f"process exited with code {codes}"}] * missing
    return got


def packing_line(k: int, outs: list[dict[str, Any]], corpus: EncodedCorpus,
                 trainer_fields: dict[str, Any]) -> dict[str, Any]:
    """The `packing` line of one configuration from its K workers' results."""
    outs = sorted(outs, key=lambda o: o.get("rank", len(outs)))
    done = [o for o in outs if "samples" in o]
    span = (max(o["end"] for o in done) - min(o["start"] for o in done)) if done else 0.0
    samples = sum(o["samples"] for o in done)
    mean_tokens = float(corpus.train.lengths.mean())
    rate = samples / span if span > 0 else None
    return {"bench": "packing", **trainer_fields, "k": k, "samples_per_s": rate,
            "tokens_per_s": None if rate is None else rate * mean_tokens, "wall_s": span,
            "process_samples_per_s": [o["samples"] / (o["end"] - o["start"]) if "samples" in o else None
                                      for o in outs],
            "process_peak_mem_alloc_mib": [o.get("peak_alloc") for o in outs],
            "process_peak_mem_reserved_mib": [o.get("peak_reserved") for o in outs],
            "oom": any(o["oom"] for o in outs), "oom_processes": sum(o["oom"] for o in outs),
            "errors": sorted({o["error"] for o in outs if o["error"]})}
