"""NeMo AutoModel 0.7's packed layout, from packtool packs: ``seq_lens`` and ``seq_lens_padded``.

packtool stores NeMo AutoModel 0.1.2's layout: ``seq_lens`` lists the pieces, then the pack's padding as
one more entry. NeMo AutoModel 0.7 (``pack_dataset``, ``packed_sequence_thd_collater``,
``process_input_for_thd``) lists the real documents only in ``seq_lens``, and adds the pack's padding to
the last document in ``seq_lens_padded``; its THD collater fails without that field. ``nemo_thd_sample``
turns a pack into that layout at read time (the shards stay as they are)::

    import datasets
    from packtool.nemo import nemo_thd_sample

    ds = datasets.load_dataset("out/", split="train").map(nemo_thd_sample)  # or read_packs(DIR, True)
    batch = packed_sequence_thd_collater([ds[0], ds[1]])                    # NeMo 0.7's own collater

The pieces are known from ``sample_index`` (one entry per piece), which every pack carries. An output
packed with ``--cp-size`` (NeMo's ``pack_dataset(cp_size=...)``: every sample padded to a multiple of
``2 x cp_size``) has each piece's padding inside its ``seq_lens`` entry and in ``cp_padding``: ``seq_lens``
then gives the real lengths and ``seq_lens_padded`` the padded ones, as NeMo 0.7 records them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from packtool.schema import one_pack_offsets, padding_lengths, piece_lengths, piece_spans

THD_FIELDS = ("input_ids", "labels", "position_ids")


def nemo_thd_sample(pack: Mapping[str, Any]) -> dict[str, list[int]]:
    """One pack in NeMo AutoModel 0.7's layout: ``input_ids``, ``labels``, ``position_ids`` (``N`` each,
    as stored), ``seq_lens`` (the real pieces' tokens) and ``seq_lens_padded`` (each piece with its
    context-parallel padding, and the pack's padding added to the last one), as lists, which
    ``packed_sequence_thd_collater`` takes.

    ``pack`` is a pack dict with ``sample_index`` (``read_packs(DIR, with_sample_index=True)``, a
    ``datasets`` row, ...).

    Example::

        >>> p = {"input_ids": [5, 6, 7, 0], "labels": [6, -100, -100, -100], "position_ids": [0, 1, 0, 0],
        ...      "seq_lens": [2, 1, 1], "sample_index": [3, 4]}
        >>> s = nemo_thd_sample(p); s["seq_lens"], s["seq_lens_padded"]
        ([2, 1], [2, 2])
    """
    if "sample_index" not in pack:
        raise ValueError("nemo_thd_sample: the pack has no sample_index (read_packs: with_sample_index=True)")
    seq_lens = np.asarray(pack["seq_lens"]).astype(np.int64)
    pieces = len(pack["sample_index"])
    if not 0 < pieces <= len(seq_lens) <= pieces + 1:
        raise ValueError(f"nemo_thd_sample: {len(seq_lens)} seq_lens for {pieces} pieces")
    offsets = one_pack_offsets(seq_lens, pieces)
    padded = piece_spans(seq_lens, *offsets)  # each piece with its context-parallel padding, if any
    cp_padding = np.asarray(pack.get("cp_padding", np.zeros(pieces)), dtype=np.int64)
    if len(cp_padding) != pieces:
        raise ValueError(f"nemo_thd_sample: {len(cp_padding)} cp_padding entries for {pieces} pieces")
    real = piece_lengths(seq_lens, *offsets, cp_padding)
    padded[-1] += padding_lengths(seq_lens, *offsets)[0]  # the pack's padding, if any
    out = {k: np.asarray(pack[k]).astype(np.int64).tolist() for k in THD_FIELDS}
    out["seq_lens"], out["seq_lens_padded"] = real.tolist(), padded.tolist()
    return out
