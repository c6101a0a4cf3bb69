"""``bfd``: best-fit decreasing over sample lengths, then packs in a shuffled order.

Algorithm (exact BFD, computed over *groups of equal lengths* rather than one sample at a time):

* Samples are taken longest first (ties in input order). Each goes into the open pack with the *least*
  room that still holds it, or into a new pack when none does.
* All samples of one length ``s`` are placed together. Open packs are kept in classes by remaining room
  ``c`` (a sorted list of the rooms in use, and a list of pack ids per room). The best fit for ``s`` is the
  smallest room ``c >= s`` (one ``bisect``). Once a pack of room ``c`` takes a sample of length ``s`` its
  room ``c - s`` is smaller than every other candidate, so BFD keeps filling that same pack until its room
  drops below ``s``: each pack of the class takes exactly ``c // s`` samples. A whole class is therefore
  handled by one NumPy ``repeat``, and the Python loop runs once per (length, room class) visited, not
  once per sample. With lengths in ``1..N`` there are at most ``N`` distinct lengths and ``N`` room classes.
  Cost: ``O(n log n)`` for the sort plus ``O(steps * log N)``, with ``steps`` a few per distinct length on
  real data (docs/performance.md).
* ``packing_buffer_size``: the input (after the long-sample policy) is cut into consecutive windows of that
  many samples and each window is packed on its own (for inputs too large to plan at once, and the
  semantics of TRL / Energon buffers). ``None`` plans the whole input at once.

With ``split_across_pack`` samples longer than N are first cut into pieces of at most N tokens (each piece
its own ``seq_lens`` entry; positions restart at 0 under ``position_ids: restart``, the default for bfd),
then packed by BFD. BFD alone is usually a few packs over the lower bound ``ceil(tokens / N)``; to reach it
exactly, the ``packs - lower_bound`` least-filled packs are dissolved and their pieces laid end to end into
the free room of the other packs, largest free room first, cutting a piece where a pack's room ends. Only
the pieces that cross such a cut are split (at most one per receiving pack), so packs come out at
*exactly* the lower bound (per window, when ``packing_buffer_size`` is set) with few extra splits.

Packs are then shuffled with ``numpy.random.default_rng(seed)`` so that pack order does not follow length
(BFD opens long-sample packs first); the same seed gives the same plan, hence the same bytes.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from packtool.packing.plan import PackPlan


def bfd_assign(lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Best-fit decreasing assignment of items of ``lengths`` (all in ``1..n``) to bins of size ``n``.

    Returns:
        order: ``(num_items,)`` int64, item indices in placement order (longest first, stable).
        item_bin: ``(num_items,)`` int64, the bin of each item (``item_bin[i]`` is item ``i``'s bin);
            bins are numbered in the order they were opened.
        num_bins: bins used.

    >>> order, item_bin, k = bfd_assign(np.array([3, 5, 2, 4, 1]), 6)
    >>> k, item_bin.tolist()
    (3, [2, 0, 1, 1, 0])
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    count = len(lengths)
    order = np.argsort(-lengths, kind="stable")
    item_bin = np.empty(count, dtype=np.int64)
    if count == 0:
        return order, item_bin, 0
    sorted_len = lengths[order]
    bounds = np.flatnonzero(np.diff(sorted_len)) + 1
    group_start = np.concatenate([[0], bounds]).tolist()
    group_end = np.concatenate([bounds, [count]]).tolist()
    group_size = sorted_len[np.asarray(group_start)].tolist()
    smallest = int(sorted_len[-1])

    active: list[int] = []  # sorted rooms that have open bins
    bins_at: dict[int, list[int]] = {}  # room -> open bin ids with that room
    num_bins = 0

    def put(room: int, bins: list[int]) -> None:
        if room < smallest:  # no item left can use this room: the bin is closed
            return
        if room in bins_at:
            bins_at[room].extend(bins)
        else:
            insort(active, room)
            bins_at[room] = list(bins)

    for s, pos, end in zip(group_size, group_start, group_end, strict=True):
        left = end - pos
        while left:
            i = bisect_left(active, s)
            if i < len(active):
                room = active[i]
                bins = bins_at[room]
                per_bin = room // s
                if left >= len(bins) * per_bin:  # every bin of this room class takes per_bin items
                    del bins_at[room]
                    active.pop(i)
                    full, rest = bins, 0
                else:
                    full_count, rest = divmod(left, per_bin)
                    used = full_count + (rest > 0)
                    full = bins[len(bins) - used : len(bins) - used + full_count]
                    partial = bins[-1] if rest else None
                    del bins[len(bins) - used :]
                    if not bins:
                        del bins_at[room]
                        active.pop(i)
            else:  # no open bin holds s: open new ones, each taking n // s items
                room = n
                per_bin = n // s
                full_count, rest = divmod(left, per_bin)
                full = list(range(num_bins, num_bins + full_count))
                num_bins += full_count
                partial = num_bins if rest else None
                num_bins += rest > 0
            taken = len(full) * per_bin
            item_bin[order[pos : pos + taken]] = np.repeat(np.asarray(full, dtype=np.int64), per_bin)
            pos += taken
            put(room - per_bin * s, full)
            if rest:
                item_bin[order[pos : pos + rest]] = partial
                pos += rest
                put(room - rest * s, [partial])
            left = end - pos
    return order, item_bin, num_bins


def cut_long(lengths: np.ndarray, samples: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut every sample into pieces of at most ``n`` tokens: ``(sample, start, length)`` per piece.

    >>> [a.tolist() for a in cut_long(np.array([5, 2]), np.array([7, 9]), 2)]
    [[7, 7, 7, 9], [0, 2, 4, 0], [2, 2, 1, 2]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = -(-lengths // n)
    first = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    piece_sample_local = np.repeat(np.arange(len(lengths)), counts)
    start = (np.arange(int(counts.sum()), dtype=np.int64) - first[piece_sample_local]) * n
    length = np.minimum(n, lengths[piece_sample_local] - start)
    return np.asarray(samples, dtype=np.int64)[piece_sample_local], start, length


def _fill_to_lower_bound(
    sample: np.ndarray, start: np.ndarray, length: np.ndarray, bin_of: np.ndarray, num_bins: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Dissolve the least-filled bins into the free room of the others, splitting pieces at room ends.

    Pieces are ``(sample, start, length)`` in bin ``bin_of``; returns the same for the new pieces, with
    exactly ``ceil(total / n)`` bins numbered ``0..`` (kept bins in their old order).
    """
    fill = np.bincount(bin_of, weights=length, minlength=num_bins).astype(np.int64)
    lower = -(-int(fill.sum()) // n)
    extra = num_bins - lower
    if extra <= 0:
        return sample, start, length, bin_of, num_bins
    by_fill = np.argsort(fill, kind="stable")
    gone = np.zeros(num_bins, dtype=bool)
    gone[by_fill[:extra]] = True
    new_id = np.cumsum(~gone) - 1  # kept bins keep their relative order
    moved = gone[bin_of]
    # pieces to move, longest first, laid end to end
    mv = np.flatnonzero(moved)
    mv = mv[np.argsort(-length[mv], kind="stable")]
    m_len = length[mv]
    cs_p = np.concatenate([[0], np.cumsum(m_len)])
    # receiving bins, largest free room first
    kept = np.flatnonzero(~gone)
    room = n - fill[kept]
    recv = kept[np.argsort(-room, kind="stable")]
    cs_g = np.concatenate([[0], np.cumsum(n - fill[recv])])
    total = int(cs_p[-1])
    cuts = np.union1d(cs_p, cs_g[cs_g <= total])
    seg_begin, seg_end = cuts[:-1], cuts[1:]
    owner = np.searchsorted(cs_p, seg_begin, side="right") - 1
    gap = np.searchsorted(cs_g, seg_begin, side="right") - 1
    new_sample = sample[mv][owner]
    new_start = start[mv][owner] + (seg_begin - cs_p[owner])
    new_length = seg_end - seg_begin
    keep = ~moved
    return (
        np.concatenate([sample[keep], new_sample]),
        np.concatenate([start[keep], new_start]),
        np.concatenate([length[keep], new_length]),
        np.concatenate([new_id[bin_of[keep]], new_id[recv[gap]]]),
        lower,
    )


def _plan_window(
    lengths: np.ndarray, samples: np.ndarray, n: int, split_across_pack: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pieces of one window, grouped by pack: ``(pack_offsets, sample, start, length)``."""
    if split_across_pack:
        sample, start, length = cut_long(lengths, samples, n)
    else:
        sample, start, length = samples, np.zeros(len(samples), dtype=np.int64), lengths
    order, item_bin, num_bins = bfd_assign(length, n)
    # pieces in placement order; within a pack they are laid out in that order
    sample, start, length, item_bin = sample[order], start[order], length[order], item_bin[order]
    if split_across_pack:  # gap fillers come after the pieces already in their pack
        sample, start, length, item_bin, num_bins = _fill_to_lower_bound(
            sample, start, length, item_bin, num_bins, n
        )
    by_bin = np.argsort(item_bin, kind="stable")
    offsets = np.zeros(num_bins + 1, dtype=np.int64)
    np.cumsum(np.bincount(item_bin, minlength=num_bins), out=offsets[1:])
    return offsets, sample[by_bin], start[by_bin], length[by_bin]


def plan_bfd(
    lengths: np.ndarray,
    samples: np.ndarray,
    n: int,
    split_across_pack: bool,
    position_ids: str = "restart",
    packing_buffer_size: int | None = None,
    seed: int | None = 0,
) -> PackPlan:
    """Plan packs for ``samples`` (global indices) of token counts ``lengths`` (all >= 1) by BFD.

    Args:
        lengths: ``(num_samples,)`` int64; without ``split_across_pack`` every length is <= n.
        samples: ``(num_samples,)`` int64 global sample indices, in input order.
        n: packed_sequence_size.
        packing_buffer_size: samples per planning window; ``None``: the whole input.
        seed: seed of the pack shuffle; ``None`` keeps the packs in the order they were opened (per
            window, windows in input order).

    >>> p = plan_bfd(np.array([3, 5, 2, 4, 1]), np.arange(5), 6, False, seed=0)
    >>> sorted(p.pack_tokens().tolist()), p.num_packs
    ([3, 6, 6], 3)
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    samples = np.asarray(samples, dtype=np.int64)
    window = packing_buffer_size or max(len(lengths), 1)
    parts = [
        _plan_window(lengths[a : a + window], samples[a : a + window], n, split_across_pack)
        for a in range(0, len(lengths), window)
    ]
    offsets = [np.zeros(1, dtype=np.int64)]
    base = 0
    for p in parts:
        offsets.append(p[0][1:] + base)
        base += int(p[0][-1])
    cat = [np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64) for i in (1, 2, 3)]
    plan = PackPlan(n, np.concatenate(offsets), cat[0], cat[1], cat[2], position_ids)
    if seed is None:
        return plan
    rng = np.random.default_rng(seed)
    return plan.permute(rng.permutation(plan.num_packs))
