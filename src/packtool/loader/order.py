"""The epoch's order from pack indices alone: the packs of each rank's batches, before any data is read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.arrays import ranges
from packtool.formats.registry import get_format
from packtool.manifest import Manifest


def epoch_size(num_packs: int, world_size: int, batch_size: int, drop_last: bool) -> tuple[int, int]:
    """``(batches, packs)`` of each rank in an epoch (see ``epoch_plan`` for ``drop_last``).

    >>> epoch_size(11, 2, 4, True), epoch_size(11, 2, 4, False)
    ((1, 4), (2, 6))
    """
    if drop_last:
        batches = num_packs // (world_size * batch_size)
        return batches, batches * batch_size
    packs = -(-num_packs // world_size)
    return -(-packs // batch_size), packs


def epoch_plan(
    unit_sizes: np.ndarray,
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
    shuffle_buffer: int,
    rank: int,
    world_size: int,
    batch_size: int,
    lanes: int,
    drop_last: bool = True,
) -> np.ndarray:
    """The packs of each batch of ``rank`` in ``epoch``: int64 ``(batches_per_epoch, batch_size)``.

    Pack ``p`` is the ``p``-th pack of the output directory (shards in manifest order, units in order).
    Depends only on the arguments (see the module docstring for the construction).

    ``drop_last=True``: every batch is full; the packs left over (fewer than ``world_size * batch_size``)
    sit out this epoch (which ones changes with the epoch when shuffled). ``drop_last=False``: every pack
    is used, as torch's ``DistributedSampler`` + ``DataLoader(drop_last=False)`` do: packs are repeated
    from the start of the epoch's order until the ranks have as many each, and the last batch of a rank
    may be short; its missing places are ``-1``.

    Example::

        >>> epoch_plan(np.array([4, 4]), epoch=0, seed=0, shuffle=False, shuffle_buffer=0, rank=0,
        ...            world_size=1, batch_size=2, lanes=1).tolist()
        [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    sizes = np.asarray(unit_sizes, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(sizes)])
    total = int(first[-1])
    nb, m = epoch_size(total, world_size, batch_size, drop_last)
    order, skip = np.arange(len(sizes)), 0
    if shuffle:  # the unit order, and how many of the packs left over come off its head (the rest: its tail)
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(len(sizes))
        skip = int(rng.integers(0, total - world_size * m + 1)) if drop_last else 0
    every = ranges(first[:-1][order], sizes[order])
    if not drop_last and world_size * m > total:  # as many for every rank: repeat from the start
        every = np.concatenate([every, every[: world_size * m - total]])
    mine = every[skip + rank * m : skip + (rank + 1) * m]
    out = np.empty((nb, batch_size), dtype=np.int64)
    # batches of each lane; lanes past the nb-th have none, so only the first nb are built (a state's
    # lanes is untrusted: memory and time follow the batches, not it)
    counts = np.maximum(0, -(-(nb - np.arange(min(lanes, nb))) // lanes))
    seg = np.minimum(np.concatenate([[0], np.cumsum(counts)]) * batch_size, m)
    for lane in range(len(counts)):
        packs = mine[seg[lane] : seg[lane + 1]]
        if shuffle and shuffle_buffer > 1 and len(packs):
            rng = np.random.default_rng([seed, epoch, rank, lane, 1])
            keys = np.arange(len(packs)) + rng.uniform(0, shuffle_buffer, len(packs))
            packs = packs[np.argsort(keys, kind="stable")]
        short = counts[lane] * batch_size - len(packs)  # the short last batch (drop_last=False)
        out[lane::lanes] = np.concatenate([packs, np.full(short, -1)]).reshape(-1, batch_size)
    partial = np.flatnonzero((out < 0).any(axis=1))
    if len(partial):  # the short batch comes last
        out[[partial[0], nb - 1]] = out[[nb - 1, partial[0]]]
    return out


# --- reading units -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unit:
    """What one reader call decodes: part ``part`` (a row group) of shard ``shard`` with ``num_packs``."""

    shard: int
    part: int
    num_packs: int


def units_of(manifest: Manifest, split: str | None = "train") -> list[Unit]:
    """The read units of the output's ``split`` in order (each shard's, as its format reads it: Parquet
    row groups, whole tar shards); ``split`` ``None``: all shards."""
    shard_reader = get_format(manifest.shard_format).reader
    out = []
    for s, entry in manifest.split_shards(split):
        out.extend(Unit(s, p, int(k)) for p, k in enumerate(shard_reader.units(entry)) if k > 0)
    return out
