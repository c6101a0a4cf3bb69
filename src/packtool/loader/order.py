"""The epoch's order from pack indices alone: the packs of each rank's batches, before any data is read.

Three steps, each a function of integers:

1. **The epoch's sequence** of packs: one output's read units in an order drawn from ``(seed, epoch)``
   (``output_sequence``), or a mixture's sources drawn at their weights or repeats, each source cycling
   through its own epochs, interleaved (``mixture_sequence``).
2. **The rank's batches** (``rank_positions``): the sequence cut into ranks, lanes and batches, mixed by a
   shuffle buffer (``Layout``: world size, batch size, lanes, ``drop_last``, the shuffle).
3. **After a resume at another world size** (``recut``): the run's order, as the world size that started
   it consumes it (``flat_order``: global batch after global batch), cut into the new global batches.

Positions are places in the epoch's sequence; ``-1`` marks a place a short last batch does not fill.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.arrays import ranges
from packtool.formats.registry import get_format
from packtool.manifest import Manifest

# the streams of random numbers drawn from (seed, epoch, ...): a mixture's per-epoch counts, its interleave,
# and each source's own unit order in its own epochs
_MIX_COUNTS, _MIX_ORDER, _SOURCE_ORDER = 2, 3, 4


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


@dataclass(frozen=True)
class Layout:
    """How an epoch's sequence becomes each rank's batches.

    Rank ``r`` of ``world_size`` takes the slice ``[S + r * M, S + (r + 1) * M)`` of the sequence's ``P``
    packs, ``M = (P // (world_size * batch_size)) * batch_size``: every rank the same number of full
    batches; the ``P - world_size * M`` packs left over sit out the epoch (the first ``S``, drawn from
    ``(seed, epoch)`` when shuffling, and the last). ``drop_last=False`` uses every pack instead, repeating
    the first ones until every rank has as many (torch's ``DistributedSampler``); the last batch of a rank
    may be short. A rank's slice is cut into ``lanes`` contiguous segments; lane ``l`` gives the rank's
    batches ``l, l + lanes, ...``, each pack moved by less than ``shuffle_buffer`` places (drawn from
    ``(seed, epoch, rank, lane)``).
    """

    world_size: int
    batch_size: int
    lanes: int = 1
    drop_last: bool = True
    seed: int = 0
    shuffle: bool = True
    shuffle_buffer: int = 0

    def epoch_size(self, total: int) -> tuple[int, int]:
        """``(batches, packs)`` of each rank in an epoch of ``total`` packs."""
        return epoch_size(total, self.world_size, self.batch_size, self.drop_last)

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size


def draw_skip(rng: np.random.Generator | None, total: int, layout: Layout) -> int:
    """How many of the packs left over come off the head of the epoch's sequence (the rest: its tail)."""
    if rng is None or not layout.drop_last:
        return 0
    m = layout.epoch_size(total)[1]
    return int(rng.integers(0, total - layout.world_size * m + 1))


def rank_positions(
    total: int, skip: int, layout: Layout, *, epoch: int, rank: int, units: Units | None = None
) -> np.ndarray:
    """The places in the epoch's sequence (of ``total`` packs) of each batch of ``rank``: int64
    ``(batches_per_epoch, batch_size)``, ``-1`` where a short last batch has no pack (``drop_last=False``).
    ``units``: a mixture's (``lanes_by_unit``); None: each lane a contiguous segment of the rank's slice.

    >>> rank_positions(8, 0, Layout(1, 2, shuffle=False), epoch=0, rank=0).tolist()
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    nb, m = layout.epoch_size(total)
    b, lanes = layout.batch_size, layout.lanes
    every = np.arange(total, dtype=np.int64)
    if not layout.drop_last and layout.world_size * m > total:  # as many for every rank: repeat the first
        every = np.concatenate([every, every[: layout.world_size * m - total]])
    mine = every[skip + rank * m : skip + (rank + 1) * m]
    out = np.empty((nb, b), dtype=np.int64)
    # batches of each lane; lanes past the nb-th have none, so only the first nb are built (a state's
    # lanes is untrusted: memory and time follow the batches, not it)
    counts = np.maximum(0, -(-(nb - np.arange(min(lanes, nb))) // lanes))
    seg = np.minimum(np.concatenate([[0], np.cumsum(counts)]) * b, m)
    parts = [mine[seg[lane] : seg[lane + 1]] for lane in range(len(counts))]
    if units is not None and len(counts) > 1:
        parts = [mine[k] for k in lanes_by_unit(units.source[mine], units.unit[mine], seg)]
    for lane, packs in enumerate(parts):
        if layout.shuffle and layout.shuffle_buffer > 1 and len(packs):
            rng = np.random.default_rng([layout.seed, epoch, rank, lane, 1])
            keys = np.arange(len(packs)) + rng.uniform(0, layout.shuffle_buffer, len(packs))
            packs = packs[np.argsort(keys, kind="stable")]
        short = counts[lane] * b - len(packs)  # the short last batch (drop_last=False)
        out[lane::lanes] = np.concatenate([packs, np.full(short, -1)]).reshape(-1, b)
    partial = np.flatnonzero((out < 0).any(axis=1))
    if len(partial):  # the short batch comes last
        out[[partial[0], nb - 1]] = out[[nb - 1, partial[0]]]
    return out


@dataclass(frozen=True)
class Units:
    """A mixture's epoch sequence as its lanes see it: each place's source and read unit (int64)."""

    source: np.ndarray
    unit: np.ndarray


def lanes_by_unit(source: np.ndarray, unit: np.ndarray, seg: np.ndarray) -> list[np.ndarray]:
    """The places of a rank's slice (each one's ``source`` and ``unit``, in order) of each lane, as many as
    the contiguous segments ``seg`` hold, each in order.

    Cut into contiguous segments, a mixture's slice would split a unit of every source at each lane
    boundary (each decoded by two workers). So each source's packs (in order, its units contiguous) are cut
    at the unit boundary nearest to where the segments cut them, and the source with the most packs takes
    the difference: one unit split at a boundary, as for one output. Where that source cannot, the cut
    stays the segments'.

    >>> [p.tolist() for p in lanes_by_unit(np.array([0, 1, 0, 1, 0, 1]), np.array([0, 5, 0, 6, 1, 6]),
    ...                                    np.array([0, 3, 6]))]
    [[0, 1, 2], [3, 4, 5]]
    """
    lanes = len(seg) - 1
    sizes = np.bincount(source) if len(source) else np.zeros(0, dtype=np.int64)
    where = [np.flatnonzero(source == s) for s in range(len(sizes))]  # each source's places, in order
    cuts = np.array([np.searchsorted(w, seg) for w in where])  # (sources, lanes + 1): the segments' cuts
    rounded = cuts.copy()
    big = int(np.argmax(sizes)) if len(sizes) else 0
    for s, w in enumerate(where):
        if s == big or len(w) == 0:
            continue
        starts = np.concatenate([[0], 1 + np.flatnonzero(unit[w][1:] != unit[w][:-1]), [len(w)]])
        nearest = np.clip(np.searchsorted(starts, cuts[s, 1:-1]), 1, len(starts) - 1)
        below, above = starts[nearest - 1], starts[nearest]
        rounded[s, 1:-1] = np.where(cuts[s, 1:-1] - below <= above - cuts[s, 1:-1], below, above)
    rounded[big] = seg - (rounded.sum(axis=0) - rounded[big])
    if (rounded[big] < 0).any() or (rounded[big] > sizes[big]).any() or (np.diff(rounded[big]) < 0).any():
        rounded = cuts
    return [
        np.sort(np.concatenate([w[rounded[s, lane] : rounded[s, lane + 1]] for s, w in enumerate(where)]))
        for lane in range(lanes)
    ]


def take(sequence: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``sequence[positions]``, ``-1`` where a position is ``-1``."""
    return np.where(positions >= 0, sequence[np.maximum(positions, 0)], -1)


# --- one output ----------------------------------------------------------------------------------------
def output_sequence(
    unit_sizes: np.ndarray, *, epoch: int, seed: int, shuffle: bool
) -> tuple[np.ndarray, np.random.Generator | None]:
    """One output's epoch: its packs, the read units in an order drawn from ``(seed, epoch)`` (file order
    without ``shuffle``), and the generator that draws the packs left over next (``draw_skip``).

    >>> output_sequence(np.array([2, 3]), epoch=0, seed=0, shuffle=False)[0].tolist()
    [0, 1, 2, 3, 4]
    """
    sizes = np.asarray(unit_sizes, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(sizes)])
    rng, order = None, np.arange(len(sizes))
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(len(sizes))
    return ranges(first[:-1][order], sizes[order]), rng


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
    """The packs of each batch of ``rank`` in ``epoch`` of one output: int64 ``(batches_per_epoch,
    batch_size)``, ``-1`` where a short last batch has none (``drop_last=False``; see ``Layout``).

    Pack ``p`` is the ``p``-th pack of the output directory (shards in manifest order, units in order).
    Depends only on the arguments.

    Example::

        >>> epoch_plan(np.array([4, 4]), epoch=0, seed=0, shuffle=False, shuffle_buffer=0, rank=0,
        ...            world_size=1, batch_size=2, lanes=1).tolist()
        [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    layout = Layout(world_size, batch_size, lanes, drop_last, seed, shuffle, shuffle_buffer)
    every, rng = output_sequence(unit_sizes, epoch=epoch, seed=seed, shuffle=shuffle)
    skip = draw_skip(rng, len(every), layout)
    return take(every, rank_positions(len(every), skip, layout, epoch=epoch, rank=rank))


# --- a mixture -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shares:
    """How a mixture takes its sources in each epoch: by ``weights`` (each pack drawn from source ``i``
    with probability ``w_i / sum(w)``, as many packs as the sources hold together) or by ``repeats``
    (exactly ``floor(r_i * packs_i)`` packs of source ``i``). One of the two is set."""

    weights: tuple[float, ...] | None = None
    repeats: tuple[float, ...] | None = None


def mixture_counts(sizes: np.ndarray, shares: Shares, *, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """``(S,)`` int64: the packs of each source in ``epoch``.

    >>> mixture_counts(np.array([10, 4]), Shares(repeats=(1.0, 2.5)), epoch=0, seed=0, shuffle=True).tolist()
    [10, 10]
    >>> mixture_counts(np.array([10, 6]), Shares(weights=(3, 1)), epoch=0, seed=0, shuffle=False).tolist()
    [12, 4]
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if shares.repeats is not None:
        return np.floor(np.asarray(shares.repeats) * sizes + 1e-9).astype(np.int64)
    p = np.asarray(shares.weights, dtype=np.float64)
    p = p / p.sum()
    total = int(sizes.sum())
    if shuffle:
        return np.random.default_rng([seed, epoch, _MIX_COUNTS]).multinomial(total, p).astype(np.int64)
    counts = np.floor(p * total).astype(np.int64)  # the largest remainders get the packs left
    counts[np.argsort(-(p * total - counts), kind="stable")[: total - int(counts.sum())]] += 1
    return counts


def mixture_starts(sizes: np.ndarray, shares: Shares, *, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """``(S,)`` int64: how many packs each source gave before ``epoch`` (its place in its own cycle)."""
    if shares.repeats is not None or not shuffle:  # the same counts every epoch
        return epoch * mixture_counts(sizes, shares, epoch=0, seed=seed, shuffle=shuffle)
    starts = np.zeros(len(sizes), dtype=np.int64)
    for e in range(epoch):
        starts += mixture_counts(sizes, shares, epoch=e, seed=seed, shuffle=shuffle)
    return starts


def source_cycle(
    unit_sizes: np.ndarray, first: int, count: int, *, source: int, seed: int, shuffle: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Packs ``first .. first + count - 1`` of one source's endless cycle: its own epochs one after the
    other, each its units in an order drawn from ``(seed, lap, source)`` (every pack once per lap).
    Returns the packs (the source's own indices) and each one's lap, both int64 ``(count,)``.

    >>> packs, laps = source_cycle(np.array([2, 1]), 2, 3, source=0, seed=0, shuffle=False)
    >>> packs.tolist(), laps.tolist()
    ([2, 0, 1], [0, 1, 1])
    """
    sizes = np.asarray(unit_sizes, dtype=np.int64)
    unit_first = np.concatenate([[0], np.cumsum(sizes)])
    n = int(unit_first[-1])
    packs = np.empty(count, dtype=np.int64)
    laps = (first + np.arange(count, dtype=np.int64)) // n
    for lap in range(first // n, (first + count - 1) // n + 1 if count else 0):
        order = np.arange(len(sizes))
        if shuffle:
            order = np.random.default_rng([seed, lap, _SOURCE_ORDER, source]).permutation(len(sizes))
        sequence = ranges(unit_first[:-1][order], sizes[order])
        lo, hi = max(first, lap * n), min(first + count, (lap + 1) * n)
        packs[lo - first : hi - first] = sequence[lo - lap * n : hi - lap * n]
    return packs, laps


def mixture_sequence(
    unit_sizes: list[np.ndarray], shares: Shares, *, epoch: int, seed: int, shuffle: bool
) -> tuple[np.ndarray, np.ndarray, np.random.Generator | None]:
    """A mixture's epoch: its packs (source ``i``'s pack ``p`` is ``base_i + p``, ``base`` the sources'
    sizes summed before it), each pack's lap in its source's cycle, and the generator that draws the packs
    left over next (``draw_skip``).

    Each source gives the next ``mixture_counts`` packs of its cycle (``source_cycle``), in order, so its
    units stay contiguous; the sources are interleaved in an order drawn from ``(seed, epoch)`` (evenly
    spread without ``shuffle``).

    >>> ids, laps, _ = mixture_sequence([np.array([4]), np.array([2])], Shares(repeats=(1, 1)), epoch=0,
    ...                                 seed=0, shuffle=False)
    >>> ids.tolist()
    [0, 4, 1, 2, 5, 3]
    """
    sizes = np.array([int(np.sum(u)) for u in unit_sizes], dtype=np.int64)
    counts = mixture_counts(sizes, shares, epoch=epoch, seed=seed, shuffle=shuffle)
    starts = mixture_starts(sizes, shares, epoch=epoch, seed=seed, shuffle=shuffle)
    labels = np.repeat(np.arange(len(sizes)), counts)
    rng = None
    if shuffle:
        rng = np.random.default_rng([seed, epoch, _MIX_ORDER])
        labels = rng.permutation(labels)
    else:  # the j-th pack of source i at (j + 0.5) / count_i of the epoch
        within = np.arange(len(labels)) - np.repeat(np.cumsum(counts) - counts, counts)
        labels = labels[np.argsort((within + 0.5) / np.repeat(np.maximum(counts, 1), counts), kind="stable")]
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ids, laps = [], []
    for i, units in enumerate(unit_sizes):
        packs, lap = source_cycle(units, int(starts[i]), int(counts[i]), source=i, seed=seed, shuffle=shuffle)
        ids.append(packs + base[i])
        laps.append(lap)
    where = np.argsort(labels, kind="stable")  # the places of source 0's packs, then source 1's, ...
    out_ids, out_laps = np.empty(len(labels), dtype=np.int64), np.empty(len(labels), dtype=np.int64)
    out_ids[where] = np.concatenate(ids) if ids else []
    out_laps[where] = np.concatenate(laps) if laps else []
    return out_ids, out_laps, rng


# --- another world size ----------------------------------------------------------------------------------
def flat_order(
    total: int, skip: int, layout: Layout, *, epoch: int, units: Units | None = None
) -> np.ndarray:
    """The places of an epoch's sequence as ``layout``'s ranks consume them together: global batch after
    global batch (rank 0's batch, rank 1's, ...), then the packs left over (``drop_last``); int64. After
    ``k`` steps the run has read exactly the first ``k * world_size * batch_size`` (``drop_last=False``:
    the short last batches' holes left out, the packs repeated to even out the ranks kept).

    >>> flat_order(10, 0, Layout(2, 2, shuffle=False), epoch=0).tolist()
    [0, 1, 4, 5, 2, 3, 6, 7, 8, 9]
    """
    ranks = [
        rank_positions(total, skip, layout, epoch=epoch, rank=r, units=units)
        for r in range(layout.world_size)
    ]
    steps = np.stack(ranks, axis=1).reshape(-1)  # (batches, ranks, batch_size), step-major
    steps = steps[steps >= 0]
    if not layout.drop_last:
        return steps
    m = layout.epoch_size(total)[1]
    left = np.concatenate([np.arange(skip), np.arange(skip + layout.world_size * m, total)]).astype(np.int64)
    return np.concatenate([steps, left])


def recut_size(length: int, layout: Layout) -> int:
    """Batches of each rank when ``length`` places of a flat order are cut into ``layout``'s batches."""
    g = layout.global_batch
    return length // g if layout.drop_last else -(-length // g)


def flat_size(total: int, layout: Layout) -> int:
    """The places of ``flat_order`` for an epoch of ``total`` packs."""
    return total if layout.drop_last else layout.world_size * layout.epoch_size(total)[1]


def resumed_size(total: int, origin: Layout, layout: Layout, start: int | None) -> int:
    """Batches of each rank in an epoch of ``total`` packs cut by ``layout``: its own order
    (``start`` None), or ``origin``'s flat order from place ``start`` (``recut``)."""
    if start is None:
        return layout.epoch_size(total)[0]
    return recut_size(max(flat_size(total, origin) - start, 0), layout)


def recut(length: int, start: int, layout: Layout, *, rank: int) -> np.ndarray:
    """Rank ``rank``'s batches when places ``start .. length - 1`` of a flat order (``flat_order``) are cut
    into ``layout``'s global batches: global batch ``j`` is the next ``world_size * batch_size`` places,
    rank ``r`` taking its ``r``-th ``batch_size``. Indices into the flat order, int64 ``(batches,
    batch_size)``. ``drop_last``: the places left over (fewer than a global batch) sit out; else the last
    global batch is shared evenly (``ceil(rest / world_size)`` each, repeating its first places to even
    out), ``-1`` filling the short batches.

    >>> recut(10, 2, Layout(2, 2), rank=1).tolist()
    [[4, 5], [8, 9]]
    """
    w, b, g = layout.world_size, layout.batch_size, layout.global_batch
    rest = np.arange(start, length, dtype=np.int64)
    nb = recut_size(len(rest), layout)
    full = len(rest) // g
    out = np.full((nb, b), -1, dtype=np.int64)
    out[:full] = rest[: full * g].reshape(full, w, b)[:, rank]
    if nb > full:  # the last global batch, short: ceil(left / w) places for every rank
        left = rest[full * g :]
        q = -(-len(left) // w)
        padded = np.concatenate([left, rest[np.arange(w * q - len(left)) % len(rest)]])
        out[full, :q] = padded[rank * q : (rank + 1) * q]
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
