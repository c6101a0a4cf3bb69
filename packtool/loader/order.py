"""The epoch's order from pack indices alone: the packs of each rank's batches, before any data is read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.arrays import ranges
from packtool.formats import get_format
from packtool.manifest import Manifest


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
) -> np.ndarray:
    """The packs of each batch of ``rank`` in ``epoch``: int64 ``(batches_per_epoch, batch_size)``.

    Pack ``p`` is the ``p``-th pack of the output directory (shards in manifest order, units in order).
    Depends only on the arguments (see the module docstring for the construction).

    Example::

        >>> epoch_plan(np.array([4, 4]), epoch=0, seed=0, shuffle=False, shuffle_buffer=0, rank=0,
        ...            world_size=1, batch_size=2, lanes=1).tolist()
        [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    sizes = np.asarray(unit_sizes, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(sizes)])
    nb = int(first[-1]) // (world_size * batch_size)
    m = nb * batch_size
    order, skip = np.arange(len(sizes)), 0
    if shuffle:  # the unit order, and how many of the packs left over come off its head (the rest: its tail)
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(len(sizes))
        skip = int(rng.integers(0, int(first[-1]) - world_size * m + 1))
    mine = ranges(first[:-1][order], sizes[order])[skip + rank * m : skip + (rank + 1) * m]
    out = np.empty((nb, batch_size), dtype=np.int64)
    counts = np.maximum(0, -(-(nb - np.arange(lanes)) // lanes))  # batches of each lane
    seg = np.concatenate([[0], np.cumsum(counts)]) * batch_size
    for lane in range(lanes):
        packs = mine[seg[lane] : seg[lane + 1]]
        if shuffle and shuffle_buffer > 1 and len(packs):
            rng = np.random.default_rng([seed, epoch, rank, lane, 1])
            keys = np.arange(len(packs)) + rng.uniform(0, shuffle_buffer, len(packs))
            packs = packs[np.argsort(keys, kind="stable")]
        out[lane::lanes] = packs.reshape(-1, batch_size)
    return out


# --- reading units -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unit:
    """What one reader call decodes: part ``part`` (a row group) of shard ``shard`` with ``num_packs``."""

    shard: int
    part: int
    num_packs: int


def units_of(manifest: Manifest) -> list[Unit]:
    """The output's read units in order (each shard's, as its format reads it: Parquet row groups, whole
    tar shards)."""
    fmt = get_format(manifest.shard_format)
    out = []
    for s, entry in enumerate(manifest.shards):
        out.extend(Unit(s, p, int(k)) for p, k in enumerate(fmt.units(entry)) if k > 0)
    return out
