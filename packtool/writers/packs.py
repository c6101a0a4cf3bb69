"""Plan slice + encoded chunks -> the arrays of a run of packs (format-independent).

Layout of one pack (NeMo AutoModel ``PackedSequence`` conventions):

* ``input_ids`` ``(N,)`` int32: the pieces end to end, then ``pad_token_id``;
* ``labels`` ``(N,)`` int32: the pieces' labels, then ``-100``;
* ``position_ids`` ``(N,)`` int32: see ``PackPlan.position_ids``;
* ``seq_lens`` ``(num_pieces [+ 1],)`` int32: piece lengths, plus one entry for the padding if any, so
  ``sum(seq_lens) == N``;
* ``loss_mask`` ``(N,)`` int8 (only if the input had one): the pieces' mask, then 0;
* ``sample_index`` ``(num_pieces,)`` int64: the global input index of each piece's sample;
* ``sample_offset`` ``(num_pieces,)`` int64: where each piece starts inside its sample (0 unless the sample
  was split), so that the pieces of a split sample can be put back together whatever the pack order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.encoders.base import IGNORE_INDEX
from packtool.packing.plan import PackPlan
from packtool.writers.chunks import ChunkStore


@dataclass
class PackArrays:
    """A run of ``num_packs`` packs: fixed-width columns ``(num_packs, N)`` and ragged ones as CSR."""

    input_ids: np.ndarray  # (num_packs, N) int32
    labels: np.ndarray  # (num_packs, N) int32
    position_ids: np.ndarray  # (num_packs, N) int32
    loss_mask: np.ndarray | None  # (num_packs, N) int8
    seq_lens: np.ndarray  # flat int32, split by seq_lens_offsets
    seq_lens_offsets: np.ndarray  # (num_packs + 1,) int64
    sample_index: np.ndarray  # flat int64, split by plan.pack_offsets
    sample_index_offsets: np.ndarray  # (num_packs + 1,) int64
    sample_offset: np.ndarray  # flat int64, split by sample_index_offsets

    @property
    def num_packs(self) -> int:
        return self.input_ids.shape[0]

    def pack(self, k: int) -> dict[str, np.ndarray]:
        out = {
            "input_ids": self.input_ids[k],
            "labels": self.labels[k],
            "position_ids": self.position_ids[k],
            "seq_lens": self.seq_lens[self.seq_lens_offsets[k] : self.seq_lens_offsets[k + 1]],
        }
        if self.loss_mask is not None:
            out["loss_mask"] = self.loss_mask[k]
        return out


def build_pack_arrays(plan: PackPlan, store: ChunkStore, pad_token_id: int = 0) -> PackArrays:
    """Materialize the packs of ``plan`` (usually a ``plan.slice`` of one row group).

    Tokens are copied by ``store.pieces_into`` straight from the chunks' maps into the ``(k, N)`` arrays
    (one slice per run of pieces contiguous in a chunk and in the pack), over arrays filled with the
    padding values; positions come from one ``arange`` minus each segment's start. Temporaries are
    O(k * N), never per-token Python.
    """
    n = plan.packed_sequence_size
    k = plan.num_packs
    counts = np.diff(plan.pack_offsets)
    cs = np.zeros(len(plan.length) + 1, dtype=np.int64)
    np.cumsum(plan.length, out=cs[1:])
    used = np.diff(cs[plan.pack_offsets])
    pack_of_piece = np.repeat(np.arange(k, dtype=np.int64), counts)
    # piece i lands in row pack_of_piece[i], after the pieces before it in its pack
    dest = pack_of_piece * n + cs[:-1] - cs[plan.pack_offsets[:-1]][pack_of_piece]

    input_ids = np.full((k, n), pad_token_id, dtype=np.int32)
    labels = np.full((k, n), IGNORE_INDEX, dtype=np.int32)
    out = {"input_ids": input_ids.reshape(-1), "labels": labels.reshape(-1)}
    loss_mask = None
    if store.has_loss_mask:
        loss_mask = np.zeros((k, n), dtype=np.int8)
        out["loss_mask"] = loss_mask.reshape(-1)
    store.pieces_into(plan.sample, plan.start, plan.length, dest, out)

    # seq_lens: piece lengths, then the padding length if the pack is not full
    has_pad = (used < n).astype(np.int64)
    sl_offsets = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(counts + has_pad, out=sl_offsets[1:])
    seg_len = np.empty(sl_offsets[-1], dtype=np.int64)
    piece_slot = (
        np.arange(len(plan.length), dtype=np.int64)
        - plan.pack_offsets[pack_of_piece]
        + sl_offsets[pack_of_piece]
    )
    seg_len[piece_slot] = plan.length
    padded = np.flatnonzero(has_pad)
    seg_len[sl_offsets[padded + 1] - 1] = n - used[padded]

    position_ids = pack_position_ids(seg_len, sl_offsets, plan.pack_offsets, plan.start, n, plan.position_ids)
    seq_lens = seg_len.astype(np.int32)

    return PackArrays(
        input_ids=input_ids,
        labels=labels,
        position_ids=position_ids,
        loss_mask=loss_mask,
        seq_lens=seq_lens,
        seq_lens_offsets=sl_offsets,
        sample_index=store.origin(plan.sample),
        sample_index_offsets=plan.pack_offsets.astype(np.int64),
        sample_offset=plan.start.astype(np.int64),
    )


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
    counts = np.diff(piece_offsets)
    pack_of_piece = np.repeat(np.arange(k, dtype=np.int64), counts)
    piece_slot = np.arange(len(piece_start), dtype=np.int64) - piece_offsets[:-1][pack_of_piece]
    piece_slot += seq_lens_offsets[:-1][pack_of_piece]
    seg_first = np.zeros(len(seq_lens), dtype=np.int64)
    piece_len = seq_lens[piece_slot]
    if convention == "nemo":
        seg_first[piece_slot] = piece_start
        padded = np.flatnonzero(np.diff(seq_lens_offsets) > counts)
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
