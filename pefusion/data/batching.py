"""Length-bucketed batches of an encoded split, and the length bucket of each document.

An epoch gathers token ids into batches of documents of similar length, padded to the longest document of the
batch (the paper's notebook padded every document to 4096). This is all the data work done per epoch of every
trial, on an already encoded split, so it needs nothing of sources, vocabulary or cache.
"""
from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

import numpy as np
import torch

from pefusion.errors import ConfigError
from pefusion.data.encoded import EncodedSplit

BATCHES_PER_SORT_CHUNK = 50  # "sort within mega-batches": docs are length-sorted inside chunks of 50 batches


class Batch(NamedTuple):
    tokens: torch.Tensor  # (B, T) int64, 0-padded; T = longest document of this batch
    labels: torch.Tensor  # (B,) int64
    index: torch.Tensor  # (B,) int64 positions of these documents in the split


def batch_order(lengths: np.ndarray, batch_size: int, *, shuffle: bool, seed: int = 0, epoch: int = 0,
                pad_multiple: int = 1, max_width: int | None = None) -> list[np.ndarray]:
    """Document indices of each batch. shuffle=False: all documents sorted by length (the least padding;
    deterministic). shuffle=True, unrounded widths (pad_multiple 1): a random permutation cut into chunks of
    BATCHES_PER_SORT_CHUNK batches, each chunk sorted by length and cut into batches, then the batch order
    shuffled. shuffle=True, widths rounded up to pad_multiple > 1: every document sorted by its rounded width
    (`batch_widths`), in a random order among documents of one width, cut into batches, the batch order shuffled:
    batch k holds the documents of ranks k·B to (k+1)·B − 1 in width order, so its size and width are the same in
    every epoch, and an epoch brings no (batch, width) shape the first one did not (kernels planned per shape are
    planned in the first epoch only). The order of those batches is drawn from the epoch alone (`shared_order`),
    the documents within a width from (seed, epoch): every seed of one split and batch size meets the same
    (size, width) at step k, so seeds trained together pad nothing for one another (`pefusion.fusion.stacked`).
    Deterministic for (seed, epoch)."""
    n = len(lengths)
    if not shuffle:
        order = np.argsort(lengths, kind="stable")
        return [order[i:i + batch_size] for i in range(0, n, batch_size)]
    rng = np.random.default_rng([seed, epoch])
    if pad_multiple > 1:
        order = np.lexsort((rng.random(n), batch_widths(lengths, pad_multiple, max_width)))
        batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
        return [batches[i] for i in shared_order(epoch).permutation(len(batches))]
    perm = rng.permutation(n)
    chunk = batch_size * BATCHES_PER_SORT_CHUNK
    batches = []
    for start in range(0, n, chunk):
        part = perm[start:start + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def shared_order(epoch: int) -> np.random.Generator:
    """The generator of epoch `epoch`'s order of widths, the same for every seed: a stream of its own (a spawn key),
    never one of the seeds' (seed, epoch) streams."""
    return np.random.default_rng(np.random.SeedSequence(epoch, spawn_key=(0,)))


def batch_widths(lengths: np.ndarray, multiple: int, limit: int | None = None) -> np.ndarray:
    """`batch_width` of each length: (N,) int64."""
    widths = -(-lengths // multiple) * multiple
    return widths if limit is None else np.minimum(widths, np.maximum(limit, lengths))


def batch_width(longest: int, multiple: int = 1, limit: int | None = None) -> int:
    """The width of a batch whose longest document has `longest` tokens: rounded up to a multiple of `multiple`,
    but never past `limit` (the model's max_len, which it refuses to exceed)."""
    return int(batch_widths(np.asarray(longest), multiple, limit))


def pad_batch(split: EncodedSplit, index: np.ndarray, multiple: int = 1, limit: int | None = None) -> np.ndarray:
    """Documents `index` of `split` as a 0-padded (B, T) int64 array, T = the longest of them rounded up to
    `multiple` (at most `limit`, see `batch_width`): one gather."""
    starts = split.offsets[index]  # (B,)
    lens = split.offsets[index + 1] - starts  # (B,)
    width = batch_width(int(lens.max()), multiple, limit) if len(lens) else 0
    cols = np.arange(width)
    mask = cols < lens[:, None]  # (B, T)
    out = np.zeros((len(index), width), dtype=np.int64)
    out[mask] = split.ids[(starts[:, None] + cols)[mask]]
    return out


def iter_batches(split: EncodedSplit, batch_size: int, *, shuffle: bool, seed: int = 0, epoch: int = 0,
                 device: torch.device | None = None, pad_multiple: int = 1,
                 max_width: int | None = None) -> Iterator[Batch]:
    """Length-bucketed batches covering every document of `split` exactly once (see `batch_order`: with rounded
    widths, training batches keep their shapes from epoch to epoch), each padded to its longest document rounded up
    to `pad_multiple` (at most `max_width`). Padding changes nothing the model
    computes for a document, given the key-padding mask and pooling over non-pad positions: bucketing removes
    work, and rounding the widths up leaves a GPU few distinct shapes to plan kernels for."""
    if batch_size <= 0:
        raise ConfigError(f"batch_size={batch_size} is out of range; it must be > 0")
    for index in batch_order(split.lengths, batch_size, shuffle=shuffle, seed=seed, epoch=epoch,
                             pad_multiple=pad_multiple, max_width=max_width):
        tokens = torch.from_numpy(pad_batch(split, index, pad_multiple, max_width))
        labels = torch.from_numpy(split.labels[index])
        idx = torch.from_numpy(index.astype(np.int64, copy=False))
        yield Batch(to_device(tokens, device), to_device(labels, device), to_device(idx, device))


def to_device(t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    """A host tensor on `device` (None = stay on the host). To a GPU it goes through page-locked memory with an
    asynchronous copy, so that preparing the next batch on the host overlaps the GPU's work on this one (a copy
    from pageable memory makes the host wait for it)."""
    if device is None or device.type == "cpu":
        return t
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def length_bucket_of(raw_lengths: np.ndarray, edges: Sequence[int]) -> np.ndarray:
    """Bucket id of each document by its length before truncation: bucket i holds edges[i-1] < n <= edges[i],
    the last one n > edges[-1], matching `record.length_bucket_labels(edges)`. (N,) int64"""
    return np.searchsorted(np.asarray(edges), np.asarray(raw_lengths), side="left").astype(np.int64)
