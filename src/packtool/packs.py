"""``PackArrays``: a run of packs in memory, the one layout the writer, every shard format, ``read_packs``,
the loader and ``verify`` share.

Layout of one pack (NeMo AutoModel ``PackedSequence`` conventions; columns and the layout's derived views in
``packtool.schema``):

* ``input_ids`` ``(N,)`` int32: the pieces end to end, then ``pad_token_id``;
* ``labels`` ``(N,)`` int32: the pieces' labels, then ``-100``;
* ``position_ids`` ``(N,)`` int32: see ``PackPlan.position_ids``;
* ``seq_lens`` ``(num_pieces [+ 1],)`` int32: piece lengths, plus one entry for the padding if any, so
  ``sum(seq_lens) == N``;
* ``loss_mask`` ``(N,)`` int8 (only if the input had one): the pieces' mask, then 0;
* ``sample_index`` ``(num_pieces,)`` int64: the global input index of each piece's sample;
* ``sample_offset`` ``(num_pieces,)`` int64: where each piece starts inside its sample (0 unless the sample
  was split), so that the pieces of a split sample can be put back together whatever the pack order;
* ``cp_padding`` ``(num_pieces,)`` int32 (only with ``cp_size > 1``): the context-parallel padding at the end
  of each piece's ``seq_lens`` entry (the piece's own tokens are the entry minus it);
* vision-language packs (docs/vision.md) add, per image in pack order, ``images`` (its encoded bytes as
  read and its name: ``{"bytes", "path"}``) and ``image_sample``, ``image_offset``, ``image_length``,
  ``image_height``, ``image_width`` ``(num_images,)`` int32 (its sample's piece in the pack, its run of
  image tokens, its size in pixels).

The ``minimal`` layout (``--columns minimal``) stores fewer of them: ``packtool.layout``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from packtool import schema
from packtool.arrays import ranges
from packtool.schema import COLUMNS, IMAGES, PACK_COLUMNS, TOKEN_COLUMNS

# where the offsets of a ragged column's values are kept, by ``Column.per``: every piece column shares one,
# every image column (and ``images``) another
OFFSETS = {"segment": "seq_lens_offsets", "piece": "sample_index_offsets", "image": "image_sample_offsets"}


@dataclass
class PackArrays:
    """A run of ``num_packs`` packs: fixed-width columns ``(num_packs, width)``, ragged ones as CSR.

    A reader that was not asked for the provenance columns leaves ``sample_index``,
    ``sample_index_offsets`` and ``sample_offset`` as None (``sample_index_offsets`` is set when it read
    ``cp_padding``); ``loss_mask`` and ``cp_padding`` are None when the data has none.
    ``sample_index_offsets`` split every per-piece column. The columns of the ``minimal`` layout that
    stand for others (``next_label``, ``loss_mask_bits``) are set only between a shard and
    ``packtool.layout`` (what the writer stores, what a reader read), never in what readers give.
    """

    input_ids: np.ndarray  # (num_packs, N) int32
    labels: np.ndarray | None = None  # (num_packs, N) int32
    position_ids: np.ndarray | None = None  # (num_packs, N) int32
    loss_mask: np.ndarray | None = None  # (num_packs, N) int8
    seq_lens: np.ndarray | None = None  # flat int32, split by seq_lens_offsets
    seq_lens_offsets: np.ndarray | None = None  # (num_packs + 1,) int64
    sample_index: np.ndarray | None = None  # flat int64, split by sample_index_offsets
    sample_index_offsets: np.ndarray | None = None  # (num_packs + 1,) int64
    sample_offset: np.ndarray | None = None  # flat int64, split by sample_index_offsets
    cp_padding: np.ndarray | None = None  # flat int32, split by sample_index_offsets (cp_size > 1)
    next_label: np.ndarray | None = None  # flat int32, split by sample_index_offsets (minimal)
    loss_mask_bits: np.ndarray | None = None  # (num_packs, ceil(N / 8)) uint8 (minimal)
    # vision-language packs: flat per image, split by image_sample_offsets (num_packs + 1,) int64
    image_sample: np.ndarray | None = None  # int32, the image's sample (its piece in the pack)
    image_offset: np.ndarray | None = None  # int32, where its run of image tokens starts in the pack
    image_length: np.ndarray | None = None  # int32, its image tokens
    image_height: np.ndarray | None = None  # int32, from its header
    image_width: np.ndarray | None = None  # int32
    image_sample_offsets: np.ndarray | None = None  # (num_packs + 1,) int64
    images: pa.StructArray | None = None  # struct<bytes: binary, path: string>, one per image

    @property
    def num_packs(self) -> int:
        return self.input_ids.shape[0]

    # the layout's derived views (``packtool.schema``), for every pack at once
    def pieces_per_pack(self) -> np.ndarray:
        """``(num_packs,)`` int64: the pieces of each pack (``schema.pieces_per_pack``)."""
        return schema.pieces_per_pack(self.sample_index_offsets)

    def has_padding(self) -> np.ndarray:
        """``(num_packs,)`` bool: whether each pack ends with padding (``schema.has_padding``)."""
        return schema.has_padding(self.seq_lens_offsets, self.sample_index_offsets)

    def padding_lengths(self) -> np.ndarray:
        """``(num_packs,)`` int64: each pack's padding, cp padding excluded (``schema.padding_lengths``)."""
        return schema.padding_lengths(self.seq_lens, self.seq_lens_offsets, self.sample_index_offsets)

    def piece_spans(self) -> np.ndarray:
        """``(num_pieces,)`` int64: each piece's ``seq_lens`` entry, cp padding included
        (``schema.piece_spans``)."""
        return schema.piece_spans(self.seq_lens, self.seq_lens_offsets, self.sample_index_offsets)

    def piece_lengths(self) -> np.ndarray:
        """``(num_pieces,)`` int64: each piece's own tokens (``schema.piece_lengths``)."""
        return schema.piece_lengths(
            self.seq_lens, self.seq_lens_offsets, self.sample_index_offsets, self.cp_padding
        )

    def real_tokens(self) -> np.ndarray:
        """``(num_packs,)`` int64: each pack's samples' tokens, neither padding nor cp padding
        (``schema.real_tokens``).

        >>> p = PackArrays(np.zeros((1, 8), np.int32), seq_lens=np.array([4, 2, 2]),
        ...                seq_lens_offsets=np.array([0, 3]), sample_index_offsets=np.array([0, 2]),
        ...                cp_padding=np.array([1, 0]))
        >>> p.real_tokens().tolist(), p.padding_lengths().tolist(), p.piece_lengths().tolist()
        ([5], [2], [3, 2])
        """
        return schema.real_tokens(
            self.seq_lens, self.seq_lens_offsets, self.sample_index_offsets, self.cp_padding
        )

    def token_columns(self) -> dict[str, np.ndarray]:
        """The ``(num_packs, N)`` columns present, by name, in column order."""
        return {name: a for name in TOKEN_COLUMNS if (a := getattr(self, name)) is not None}

    def present(self) -> list[str]:
        """The columns this holds (not None), in column order."""
        return [c.name for c in PACK_COLUMNS if getattr(self, c.name) is not None]

    def parts(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Column ``name`` as flat values and ``(num_packs + 1,)`` offsets (a fixed-width one's are
        ``arange * width``): what a Parquet list column or a run of tar members holds."""
        values = getattr(self, name)
        if values.ndim == 2:
            k, width = values.shape
            return values.reshape(-1), np.arange(k + 1, dtype=np.int64) * width
        return values, getattr(self, OFFSETS[COLUMNS[name].per])

    def row(self, name: str, k: int) -> np.ndarray:
        """Pack ``k``'s values of column ``name`` (a view)."""
        values = getattr(self, name)
        if values.ndim == 2:
            return values[k]
        offsets = getattr(self, OFFSETS[COLUMNS[name].per])
        return values[offsets[k] : offsets[k + 1]]

    def stored(self, k: int) -> dict[str, np.ndarray]:
        """Pack ``k``'s values of every column held, by name (what a tar shard's members hold)."""
        return {name: self.row(name, k) for name in self.present()}

    def take(self, rows: np.ndarray) -> PackArrays:
        """Packs ``rows`` (indices, in order) as new ``PackArrays``."""
        rows = np.asarray(rows, dtype=np.int64)
        fields: dict[str, np.ndarray] = {}
        for name in self.present():
            if COLUMNS[name].per in OFFSETS:  # ragged: each row's values, new offsets
                values, offsets = self.parts(name)
                counts = offsets[rows + 1] - offsets[rows]
                fields[name] = values[ranges(offsets[rows], counts)]
                new = np.zeros(len(rows) + 1, dtype=np.int64)
                np.cumsum(counts, out=new[1:])
                fields[OFFSETS[COLUMNS[name].per]] = new
            else:
                fields[name] = getattr(self, name)[rows]
        if self.images is not None:
            offsets = self.image_sample_offsets
            counts = offsets[rows + 1] - offsets[rows]
            fields[IMAGES] = self.images.take(pa.array(ranges(offsets[rows], counts)))
            fields["image_sample_offsets"] = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return PackArrays(**fields)

    @classmethod
    def from_parts(cls, parts: dict[str, tuple[np.ndarray, np.ndarray]], n: int) -> PackArrays:
        """Packs from each column's flat values and offsets (``parts``' inverse), for packs of ``n`` tokens.

        Raises ``ValueError`` naming the column when a fixed-width one does not hold its width in every
        pack, or per-piece columns do not hold as many values as each other in every pack.
        """
        fields: dict[str, np.ndarray] = {}
        for name, (values, offsets) in parts.items():
            col = COLUMNS[name]
            k = len(offsets) - 1
            width = col.width(n)
            if width is not None:
                if values.size != k * width or not np.array_equal(offsets, np.arange(k + 1) * width):
                    raise ValueError(f"column '{name}' does not hold {width} values in every row")
                fields[name] = values.reshape(k, width)
                continue
            fields[name] = values
            where = OFFSETS[col.per]
            if where in fields and not np.array_equal(fields[where], offsets):
                raise ValueError(f"column '{name}' does not hold one value per {col.per} in every row")
            fields[where] = offsets
        return cls(**fields)

    def pack(self, k: int, with_sample_index: bool = False) -> dict[str, np.ndarray]:
        """Pack ``k`` as a dict of NumPy views: the token columns, ``seq_lens``, and with
        ``with_sample_index`` its ``sample_index`` and ``sample_offset`` (when read); ``cp_padding`` when
        the output has it; a vision-language pack's image columns when read, with ``images`` a list of
        ``{"bytes", "path"}`` dicts (``datasets.Image``'s storage)."""
        out = {name: a[k] for name, a in self.token_columns().items()}
        out["seq_lens"] = self.seq_lens[self.seq_lens_offsets[k] : self.seq_lens_offsets[k + 1]]
        if self.sample_index_offsets is not None:
            a, b = self.sample_index_offsets[k], self.sample_index_offsets[k + 1]
            for c in PACK_COLUMNS:
                wanted = with_sample_index or c.name == "cp_padding"  # part of the layout: always given
                if c.per != "piece" or c.stored_only or not wanted:
                    continue
                if (v := getattr(self, c.name)) is not None:
                    out[c.name] = v[a:b]
        if self.image_sample_offsets is not None:  # a vision-language pack: its images, in pack order
            a, b = int(self.image_sample_offsets[k]), int(self.image_sample_offsets[k + 1])
            if self.images is not None:
                out[IMAGES] = self.images.slice(a, b - a).to_pylist()
            for c in PACK_COLUMNS:
                if c.per == "image" and (v := getattr(self, c.name)) is not None:
                    out[c.name] = v[a:b]
        return out

    def packs(self, with_sample_index: bool = False) -> list[dict[str, np.ndarray]]:
        return [self.pack(k, with_sample_index) for k in range(self.num_packs)]


def pack_position_ids(
    seq_lens: np.ndarray,
    seq_lens_offsets: np.ndarray,
    piece_offsets: np.ndarray,
    piece_start: np.ndarray,
    n: int,
    convention: str,
) -> np.ndarray:
    """``(k, N)`` int32 position ids of ``k`` packs, from their layout alone (see ``PackPlan.position_ids``).

    Args:
        seq_lens: flat segment lengths: each pack's pieces, then its padding if any (CSR by
            ``seq_lens_offsets``, ``(k + 1,)``).
        piece_offsets: ``(k + 1,)`` where each pack's pieces start in ``piece_start``.
        piece_start: where each piece starts inside its sample (0 unless the sample was split).
        convention: ``nemo`` (positions run on from ``piece_start``, modulo N, and over the padding,
            clamped to N - 1) or ``restart`` (0 at every segment).

    The writer makes the column with this and ``verify`` checks it with the same function.

    >>> pack_position_ids(np.array([2, 1, 1]), np.array([0, 3]), np.array([0, 2]), np.array([0, 5]), 4,
    ...                   "restart").tolist()
    [[0, 1, 0, 0]]
    """
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    k = len(seq_lens_offsets) - 1
    pack_of_piece = schema.pack_of_piece(piece_offsets)
    piece_slot = schema.piece_slots(seq_lens_offsets, piece_offsets)
    seg_first = np.zeros(len(seq_lens), dtype=np.int64)
    piece_len = seq_lens[piece_slot]
    if convention == "nemo":
        seg_first[piece_slot] = piece_start
        padded = np.flatnonzero(schema.has_padding(seq_lens_offsets, piece_offsets))
        last_piece = piece_offsets[1:][padded] - 1
        seg_first[seq_lens_offsets[padded + 1] - 1] = (
            piece_start[last_piece] + piece_len[last_piece] - 1
        ) % n + 1
    seg_begin = np.zeros(len(seq_lens), dtype=np.int64)
    np.cumsum(seq_lens[:-1], out=seg_begin[1:])
    # int32 arithmetic when every position fits (always, unless a split sample is over 2**31 tokens long)
    dtype = np.int32 if k * n + int(seg_first.max(initial=0)) < 2**31 else np.int64
    pos = np.arange(k * n, dtype=dtype) - np.repeat((seg_begin - seg_first).astype(dtype), seq_lens)
    if convention == "nemo":  # runs on over a split sample modulo N; padding clamped to N - 1
        if np.any(seg_first[piece_slot] + piece_len > n):  # a piece whose positions pass N
            used = np.bincount(pack_of_piece, weights=piece_len, minlength=k)
            real = np.arange(n)[None, :] < used[:, None]
            pos = np.where(real.reshape(-1), pos % n, pos)
        np.minimum(pos, n - 1, out=pos)  # real cells are < N by now: only the padding changes
    return pos.astype(np.int32, copy=False).reshape(k, n)
