"""Image statistics of packs, for the manifest and ``inspect`` (what issue 29 asks them to show).

``image_stats(records, ranks)`` reads ``records.pack_records`` rows (one per pack) with Arrow and NumPy
and returns: the images and image tokens in all, the image tokens' share of the packs' tokens, images per
pack (mean, max, and a histogram of counts), image tokens per image (min, mean, max), and the spread of
image tokens across consecutive packs (``balance.step_spread`` over steps of ``ranks`` packs: mean and max):
``packtool.stats.image_stats`` over the rows' columns (what ``pack`` and ``inspect`` compute from packs).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packtool.arrays import np_view
from packtool.stats import image_stats as packed_image_stats


def image_stats(records: pa.RecordBatch | pa.Table, ranks: int = 8) -> dict:
    """Image statistics of the packs in ``records`` (``SCHEMA`` rows); all values are plain ints and floats.

    Example: two packs of 8 tokens, one with images of 3 and 2 tokens, one without::

        >>> rows = pa.table({"input_ids": [[0] * 8, [0] * 8], "image_length": [[3, 2], []]})
        >>> s = image_stats(rows, ranks=2)
        >>> s["images"], s["image_tokens"], s["image_token_share"], s["images_per_pack_histogram"]
        (2, 5, 0.3125, {0: 1, 2: 1})
        >>> s["step_spread_max"]
        5
    """
    lengths = _column(records, "image_length")
    per_pack = np_view(pc.list_value_length(lengths).fill_null(0)).astype(np.int64)
    pack_tokens = np_view(pc.list_value_length(_column(records, "input_ids"))).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(per_pack)])
    return packed_image_stats(np_view(pc.list_flatten(lengths)), offsets, pack_tokens, ranks)


def _column(records: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    column = records.column(name)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
