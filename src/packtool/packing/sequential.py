"""``sequential``: greedy packing in input order, the algorithm of NeMo AutoModel's ``PackedSequence``
(release 0.1.2; itself torchtune's ``PackedDataset``), computed over lengths only.

* Without ``split_across_pack``: next-fit. Samples go into the current pack while they fit; the first that
  does not starts a new pack.
* With ``split_across_pack``: the samples are laid end to end and cut every N tokens, so every pack but
  the last is exactly full and a sample may run over into the next pack(s).
* ``max_packs``: the first ``max_packs`` packs of the above (what PackedSequence keeps).
"""

from __future__ import annotations

import numpy as np

from packtool.packing.plan import PackPlan


def plan_sequential(
    lengths: np.ndarray, samples: np.ndarray, n: int, split_across_pack: bool, position_ids: str = "nemo"
) -> PackPlan:
    """Plan packs for ``samples`` (global indices) with token counts ``lengths`` (all >= 1).

    Args:
        lengths: ``(num_samples,)`` int64; without ``split_across_pack`` every length is <= n.
        samples: ``(num_samples,)`` int64 global sample indices, in input order.
        n: packed_sequence_size.

    >>> p = plan_sequential(np.array([3, 2, 4]), np.arange(3), 5, False)
    >>> p.pack_offsets.tolist(), p.length.tolist()
    ([0, 2, 3], [3, 2, 4])
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    samples = np.asarray(samples, dtype=np.int64)
    cs = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cs[1:])
    if split_across_pack:
        return _plan_split(cs, samples, n, position_ids)
    if len(lengths) == 0:
        return PackPlan(n, np.zeros(1, dtype=np.int64), samples, samples.copy(), lengths, position_ids)
    # next-fit over cumulative lengths: one searchsorted per pack, not a Python step per sample
    starts = []
    i, count = 0, len(lengths)
    while i < count:
        starts.append(i)
        i = int(np.searchsorted(cs, cs[i] + n, side="right")) - 1
    pack_offsets = np.asarray(starts + [count], dtype=np.int64)
    return PackPlan(n, pack_offsets, samples, np.zeros(count, dtype=np.int64), lengths, position_ids)


def _plan_split(cs: np.ndarray, samples: np.ndarray, n: int, position_ids: str) -> PackPlan:
    total = int(cs[-1])
    cuts = np.union1d(cs, np.arange(0, total, n, dtype=np.int64))
    cuts = cuts[cuts <= total]
    piece_begin, piece_end = cuts[:-1], cuts[1:]
    owner = np.searchsorted(cs, piece_begin, side="right") - 1
    start = piece_begin - cs[owner]
    num_packs = -(-total // n)
    pack_offsets = np.searchsorted(piece_begin, np.arange(num_packs + 1, dtype=np.int64) * n, side="left")
    pack_offsets[-1] = len(piece_begin)
    return PackPlan(
        n,
        pack_offsets.astype(np.int64),
        samples[owner],
        start.astype(np.int64),
        (piece_end - piece_begin).astype(np.int64),
        position_ids,
    )
