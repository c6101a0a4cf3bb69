"""Plan slice + encoded chunks -> the arrays of a run of packs (format-independent).

Layout of one pack (NeMo AutoModel ``PackedSequence`` conventions):

* ``input_ids`` ``(N,)`` int32: the pieces end to end, then ``pad_token_id``;
* ``labels`` ``(N,)`` int32: the pieces' labels, then ``-100``;
* ``position_ids`` ``(N,)`` int32: see ``PackPlan.position_ids``;
* ``seq_lens`` ``(num_pieces [+ 1],)`` int32: piece lengths, plus one entry for the padding if any, so
  ``sum(seq_lens) == N``;
* ``loss_mask`` ``(N,)`` int8 (only if the input had one): the pieces' mask, then 0;
* ``sample_index`` ``(num_pieces,)`` int64: the global input index of each piece's sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.encoders.base import IGNORE_INDEX
from packtool.packing.plan import PackPlan
from packtool.writers.chunks import ChunkStore, ranges


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
    """Materialize the packs of ``plan`` (usually a ``plan.slice``), tokens moved by vectorized gathers."""
    n = plan.packed_sequence_size
    k = plan.num_packs
    counts = np.diff(plan.pack_offsets)
    pack_of_piece = np.repeat(np.arange(k, dtype=np.int64), counts)
    # where each piece starts inside its pack: cumulative length of the pack's earlier pieces
    cs = np.zeros(len(plan.length) + 1, dtype=np.int64)
    np.cumsum(plan.length, out=cs[1:])
    offset_in_pack = cs[:-1] - cs[plan.pack_offsets[:-1]][pack_of_piece]
    dest = pack_of_piece * n + offset_in_pack
    used = np.diff(cs[plan.pack_offsets])

    out = {
        "input_ids": np.full(k * n, pad_token_id, dtype=np.int32),
        "labels": np.full(k * n, IGNORE_INDEX, dtype=np.int32),
    }
    if store.has_loss_mask:
        out["loss_mask"] = np.zeros(k * n, dtype=np.int8)
    store.gather(plan.sample, plan.start, plan.length, dest, out)

    # position ids of real tokens: index inside the piece (+ the piece's start in its sample, for nemo)
    tok = ranges(dest, plan.length)
    within = np.arange(len(tok), dtype=np.int64) - np.repeat(cs[:-1], plan.length)
    cols = np.arange(n, dtype=np.int64)[None, :]
    pad_from = used[:, None]
    if plan.position_ids == "nemo":
        real = (np.repeat(plan.start, plan.length) + within) % n
        last = real[cs[plan.pack_offsets[1:]] - 1] if len(real) else np.zeros(k, dtype=np.int64)
        pad = np.minimum(last[:, None] + 1 + cols - pad_from, n - 1)
    else:
        real = within
        pad = cols - pad_from
    position_ids = np.where(cols >= pad_from, pad, 0).astype(np.int32).reshape(-1)
    position_ids[tok] = real

    # seq_lens: piece lengths, then the padding length if the pack is not full
    has_pad = (used < n).astype(np.int64)
    sl_offsets = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(counts + has_pad, out=sl_offsets[1:])
    seq_lens = np.empty(sl_offsets[-1], dtype=np.int32)
    piece_slot = (
        np.arange(len(plan.length), dtype=np.int64)
        - plan.pack_offsets[pack_of_piece]
        + sl_offsets[pack_of_piece]
    )
    seq_lens[piece_slot] = plan.length
    padded = np.flatnonzero(has_pad)
    seq_lens[sl_offsets[padded + 1] - 1] = n - used[padded]

    return PackArrays(
        input_ids=out["input_ids"].reshape(k, n),
        labels=out["labels"].reshape(k, n),
        position_ids=position_ids.reshape(k, n),
        loss_mask=out["loss_mask"].reshape(k, n) if "loss_mask" in out else None,
        seq_lens=seq_lens,
        seq_lens_offsets=sl_offsets,
        sample_index=store.origin(plan.sample),
        sample_index_offsets=plan.pack_offsets.astype(np.int64),
    )
