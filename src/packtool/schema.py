"""The pack schema: the columns a pack holds and the layout's derived views, defined once here.

Every writer, reader, verifier, loader and converter asks this module what a pack's layout means
instead of working it out again.

A run of ``k`` packs of ``N`` tokens keeps its ragged columns as CSR (flat values and ``(k + 1,)`` int64
offsets starting at 0, as ``PackArrays`` holds them):

* ``seq_lens`` (split by ``seq_lens_offsets``): each pack's pieces' lengths, then one entry for its
  padding when the pack is not full, so ``sum(seq_lens) == N`` per pack;
* the per-piece columns (``sample_index``, ``sample_offset``, ``cp_padding``, ``next_label``; split by
  ``piece_offsets``, which ``PackArrays`` calls ``sample_index_offsets``): one value per piece, the pieces
  being the first entries of the pack's ``seq_lens``;
* ``cp_padding`` (``--cp-size``): the context-parallel padding at the end of each piece's ``seq_lens``
  entry: a piece's *span* (its ``seq_lens`` entry) is its *length* (its own tokens) plus its ``cp_padding``.

The views below take those arrays and give, for all packs at once (vectorized, no per-pack Python): the
pieces per pack and each piece's pack, whether a pack has padding and how long it is, the pieces' spans,
lengths and starts in their pack, the real tokens per pack (neither padding nor cp padding),
``cu_seqlens``; and ``pack_seq_lens`` builds ``seq_lens`` from the pieces' spans (the writer). They
assume a sound layout (what ``verify`` checks): every pack has at least one piece and at most one more
``seq_lens`` entry than pieces.

Example (two packs of 4 tokens: pieces 2 + 1 then padding 1; one piece of 4)::

    >>> sl, slo, po = np.array([2, 1, 1, 4], np.int32), np.array([0, 3, 4]), np.array([0, 2, 3])
    >>> pieces_per_pack(po).tolist(), has_padding(slo, po).tolist(), padding_lengths(sl, slo, po).tolist()
    ([2, 1], [True, False], [1, 0])
    >>> piece_spans(sl, slo, po).tolist(), real_tokens(sl, slo, po).tolist(), cu_seqlens(sl).tolist()
    ([2, 1, 4], [3, 4], [0, 2, 3, 4, 8])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.arrays import ranges


# --- the pack columns ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One column of a pack.

    Attributes:
        name: the column's name everywhere (Parquet column, tar member ``KEY.NAME.npy``, loader field).
        dtype: NumPy dtype of its values, as stored.
        per: ``token`` (``N`` values per pack), ``bit`` (``ceil(N / 8)`` bytes per pack, a bit per token),
            ``segment`` (one per ``seq_lens`` entry: the pieces, then the padding if any), ``piece``
            (one per piece of a sample) or ``image`` (one per image of a vision-language pack, in pack
            order; the manifest's ``image_columns``, never in ``column_names``).
        optional: written only when the input carries it, or only in one layout (``column_names``).
        meaning: one line, for docs and dataset cards.
        stored_only: a column of the ``minimal`` layout that readers turn back into the columns it
            stands for (``packtool.layout``); never a column of what they give.
    """

    name: str
    dtype: np.dtype
    per: str
    optional: bool
    meaning: str
    stored_only: bool = False

    def width(self, n: int) -> int | None:
        """Values per pack of a fixed-width column (``token``, ``bit``) in packs of ``n``; None if ragged."""
        return {"token": n, "bit": -(-n // 8)}.get(self.per)


PACK_COLUMNS: tuple[Column, ...] = (
    Column("input_ids", np.dtype(np.int32), "token", False, "token ids, padded with pad_token_id"),
    Column("labels", np.dtype(np.int32), "token", False, "labels, -100 where no loss is taken"),
    Column("position_ids", np.dtype(np.int32), "token", False, "position ids (convention: position_ids)"),
    Column("seq_lens", np.dtype(np.int32), "segment", False, "lengths of the pieces, then of the padding"),
    Column("loss_mask", np.dtype(np.int8), "token", True, "1 where the loss is taken (fine-tuning input)"),
    Column("sample_index", np.dtype(np.int64), "piece", False, "input index of each piece's sample"),
    Column("sample_offset", np.dtype(np.int64), "piece", False, "where each piece starts in its sample"),
    Column("cp_padding", np.dtype(np.int32), "piece", True, "context-parallel padding ending each piece"),
    Column(
        "next_label",
        np.dtype(np.int32),
        "piece",
        True,
        "label of each piece's last token (minimal layout: labels are rebuilt from input_ids)",
        stored_only=True,
    ),
    Column(
        "loss_mask_bits",
        np.dtype(np.uint8),
        "bit",
        True,
        "loss_mask, 8 tokens a byte (numpy.packbits; minimal layout)",
        stored_only=True,
    ),
    # vision-language packs (docs/vision.md): each image's run of image tokens; the image's encoded bytes
    # are the ``images`` column beside these (IMAGES), not a NumPy column
    Column("image_sample", np.dtype(np.int32), "image", True, "each image's sample: its piece in the pack"),
    Column("image_offset", np.dtype(np.int32), "image", True, "where its span of image tokens starts"),
    Column("image_length", np.dtype(np.int32), "image", True, "its span's tokens, as its processor writes"),
    Column("image_height", np.dtype(np.int32), "image", True, "its height in pixels (from its header)"),
    Column("image_width", np.dtype(np.int32), "image", True, "its width in pixels (from its header)"),
)
COLUMNS: dict[str, Column] = {c.name: c for c in PACK_COLUMNS}
TOKEN_COLUMNS = tuple(c.name for c in PACK_COLUMNS if c.per == "token")  # (N,) per pack
FIXED_COLUMNS = tuple(c.name for c in PACK_COLUMNS if c.per in ("token", "bit"))  # as many values per pack
TRAINING_COLUMNS = ("input_ids", "labels", "position_ids", "seq_lens")  # every pack read has these
IMAGES = "images"  # each image's encoded bytes as read, and its name: list<struct<bytes, path>> per pack
IMAGE_COLUMNS = (IMAGES, *(c.name for c in PACK_COLUMNS if c.per == "image"))  # a vision output's extra


def column_names(
    has_loss_mask: bool,
    layout: str = "full",
    *,
    labels_rebuilt: bool = True,
    shifted: bool = True,
    has_cp_padding: bool = False,
) -> list[str]:
    """The columns an output stores, in their stored order.

    ``full`` stores every column a reader gives. ``minimal`` (``packtool.layout``) leaves out
    ``position_ids``, and ``labels`` when ``labels_rebuilt`` (the input's labels follow the rule the
    readers rebuild them by; with ``shifted`` labels one ``next_label`` per piece goes with them), and
    stores ``loss_mask`` as ``loss_mask_bits``. Any other column is stored as in ``full`` (``cp_padding``
    when ``has_cp_padding``: ``cp_size`` > 1).

    >>> column_names(True, "minimal")
    ['input_ids', 'seq_lens', 'sample_index', 'sample_offset', 'next_label', 'loss_mask_bits']
    """
    optional = {"loss_mask": has_loss_mask, "cp_padding": has_cp_padding}
    names = [
        c.name for c in PACK_COLUMNS if not c.stored_only and c.per != "image" and optional.get(c.name, True)
    ]
    if layout == "full":
        return names
    drop = {"position_ids", "loss_mask"} | ({"labels"} if labels_rebuilt else set())
    names = [c for c in names if c not in drop]
    if labels_rebuilt and shifted:
        names.append("next_label")
    if has_loss_mask:
        names.append("loss_mask_bits")
    return [c.name for c in PACK_COLUMNS if c.name in names]


# --- the layout's derived views ------------------------------------------------------------------------
def pieces_per_pack(piece_offsets: np.ndarray) -> np.ndarray:
    """``(k,)`` int64: how many pieces each pack holds, from the ``(k + 1,)`` per-piece offsets.

    >>> pieces_per_pack(np.array([0, 2, 3])).tolist()
    [2, 1]
    """
    return np.diff(np.asarray(piece_offsets, dtype=np.int64))


def one_pack_offsets(seq_lens: np.ndarray, num_pieces: int) -> tuple[np.ndarray, np.ndarray]:
    """``(seq_lens_offsets, piece_offsets)``, ``(2,)`` int64 each, of a single pack (a pack dict's
    ``seq_lens`` and ``num_pieces``, the length of its ``sample_index``), to call the views on it.

    >>> sl = np.array([2, 1, 1])
    >>> offsets = one_pack_offsets(sl, 2)
    >>> piece_spans(sl, *offsets).tolist(), padding_lengths(sl, *offsets).tolist()
    ([2, 1], [1])
    """
    return np.array([0, len(seq_lens)], dtype=np.int64), np.array([0, num_pieces], dtype=np.int64)


def pack_of_piece(piece_offsets: np.ndarray) -> np.ndarray:
    """``(num_pieces,)`` int64: the pack (0..k-1 in this run) each piece is in.

    >>> pack_of_piece(np.array([0, 2, 3])).tolist()
    [0, 0, 1]
    """
    counts = pieces_per_pack(piece_offsets)
    return np.repeat(np.arange(len(counts), dtype=np.int64), counts)


def piece_starts(spans: np.ndarray, piece_offsets: np.ndarray) -> np.ndarray:
    """``(num_pieces,)`` int64: where each piece starts in its pack, from the pieces' ``spans``
    (``piece_spans``): the spans of the pieces before it in its pack.

    >>> piece_starts(np.array([2, 1, 4]), np.array([0, 2, 3])).tolist()
    [0, 2, 0]
    """
    cs = np.zeros(len(spans) + 1, dtype=np.int64)
    np.cumsum(spans, out=cs[1:])
    return cs[:-1] - cs[np.asarray(piece_offsets[:-1], dtype=np.int64)][pack_of_piece(piece_offsets)]


def has_padding(seq_lens_offsets: np.ndarray, piece_offsets: np.ndarray) -> np.ndarray:
    """``(k,)`` bool: whether each pack ends with padding (its ``seq_lens`` has an entry after its pieces).

    >>> has_padding(np.array([0, 3, 4]), np.array([0, 2, 3])).tolist()
    [True, False]
    """
    return np.diff(seq_lens_offsets) > np.diff(piece_offsets)


def padding_lengths(
    seq_lens: np.ndarray, seq_lens_offsets: np.ndarray, piece_offsets: np.ndarray
) -> np.ndarray:
    """``(k,)`` int64: each pack's padding (its last ``seq_lens`` entry when it has one, else 0); the
    context-parallel padding inside the pieces is not counted (``real_tokens``).

    >>> padding_lengths(np.array([2, 1, 1, 4]), np.array([0, 3, 4]), np.array([0, 2, 3])).tolist()
    [1, 0]
    """
    padded = has_padding(seq_lens_offsets, piece_offsets)
    if not len(seq_lens):
        return np.zeros(len(padded), dtype=np.int64)
    last = np.clip(np.asarray(seq_lens_offsets[1:], dtype=np.int64) - 1, 0, len(seq_lens) - 1)
    return np.where(padded, np.asarray(seq_lens)[last].astype(np.int64), 0)


def piece_slots(seq_lens_offsets: np.ndarray, piece_offsets: np.ndarray) -> np.ndarray:
    """``(num_pieces,)`` int64: where each piece's entry is in the flat ``seq_lens`` (the first entries of
    its pack's).

    >>> piece_slots(np.array([0, 3, 4]), np.array([0, 2, 3])).tolist()
    [0, 1, 3]
    """
    return ranges(np.asarray(seq_lens_offsets[:-1], dtype=np.int64), pieces_per_pack(piece_offsets))


def piece_spans(seq_lens: np.ndarray, seq_lens_offsets: np.ndarray, piece_offsets: np.ndarray) -> np.ndarray:
    """``(num_pieces,)`` int64: every piece's ``seq_lens`` entry (its tokens and its context-parallel
    padding), in piece order: each pack's ``seq_lens`` without its padding entry.

    >>> piece_spans(np.array([2, 1, 1, 4]), np.array([0, 3, 4]), np.array([0, 2, 3])).tolist()
    [2, 1, 4]
    """
    return np.asarray(seq_lens)[piece_slots(seq_lens_offsets, piece_offsets)].astype(np.int64)


def piece_lengths(
    seq_lens: np.ndarray,
    seq_lens_offsets: np.ndarray,
    piece_offsets: np.ndarray,
    cp_padding: np.ndarray | None = None,
) -> np.ndarray:
    """``(num_pieces,)`` int64: every piece's own tokens: its span (``piece_spans``) less its
    ``cp_padding`` (``(num_pieces,)``, None: none).

    >>> piece_lengths(np.array([4, 2, 2]), np.array([0, 3]), np.array([0, 2]), np.array([1, 0])).tolist()
    [3, 2]
    """
    spans = piece_spans(seq_lens, seq_lens_offsets, piece_offsets)
    return spans if cp_padding is None else spans - cp_padding


def per_pack_sum(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``(k,)`` int64: the sum of each pack's values of a ragged column (flat ``values`` split by the
    ``(k + 1,)`` ``offsets``, starting at 0); 0 for a pack with none (unlike ``np.add.reduceat``).

    >>> per_pack_sum(np.array([2, 1, 4]), np.array([0, 2, 2, 3])).tolist()
    [3, 0, 4]
    """
    cs = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=cs[1:])
    return np.diff(cs[offsets])


def real_tokens(
    seq_lens: np.ndarray,
    seq_lens_offsets: np.ndarray,
    piece_offsets: np.ndarray,
    cp_padding: np.ndarray | None = None,
) -> np.ndarray:
    """``(k,)`` int64: the tokens of each pack that are its samples' (neither its padding nor the pieces'
    ``cp_padding``, ``(num_pieces,)`` or None).

    >>> real_tokens(np.array([4, 2, 2]), np.array([0, 3]), np.array([0, 2]), np.array([1, 0])).tolist()
    [5]
    """
    return per_pack_sum(piece_lengths(seq_lens, seq_lens_offsets, piece_offsets, cp_padding), piece_offsets)


def cu_seqlens(seq_lens: np.ndarray) -> np.ndarray:
    """``(T + 1,)`` int32: cumulative lengths over the ``T`` non-empty entries of ``seq_lens`` (any
    shape: flat CSR values, or ``(B, S)`` rows padded with 0), in order: with the packs laid end to end,
    what varlen attention kernels take (the padding of a pack is one sequence of its own).

    >>> cu_seqlens(np.array([[3, 2, 1], [6, 0, 0]])).tolist()
    [0, 3, 5, 6, 12]
    """
    flat = np.asarray(seq_lens).reshape(-1)
    flat = flat[flat > 0]
    cu = np.zeros(flat.size + 1, dtype=np.int32)
    np.cumsum(flat, out=cu[1:])
    return cu


def pack_seq_lens(spans: np.ndarray, piece_offsets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``seq_lens`` of packs of ``n`` tokens from their pieces' ``spans`` (``(num_pieces,)``, split by
    ``piece_offsets``): ``(flat int64 values, (k + 1,) int64 seq_lens_offsets)``, each pack's spans then
    its padding (``n`` less their sum) when that is not 0. The inverse of ``piece_spans`` and
    ``padding_lengths``.

    >>> sl, slo = pack_seq_lens(np.array([2, 1, 4]), np.array([0, 2, 3]), 4)
    >>> sl.tolist(), slo.tolist()
    ([2, 1, 1, 4], [0, 3, 4])
    """
    counts = pieces_per_pack(piece_offsets)
    used = per_pack_sum(spans, piece_offsets)
    padded = (used < n).astype(np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts + padded, out=offsets[1:])
    seq_lens = np.empty(offsets[-1], dtype=np.int64)
    pack = pack_of_piece(piece_offsets)
    piece_slot = np.arange(len(spans), dtype=np.int64) - piece_offsets[pack] + offsets[pack]
    seq_lens[piece_slot] = spans
    where = np.flatnonzero(padded)
    seq_lens[offsets[where + 1] - 1] = n - used[where]
    return seq_lens, offsets
