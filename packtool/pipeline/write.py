"""The write step: plan + encoded chunks -> shards, one task per shard, in parallel.

Each task gathers its packs' tokens from the chunks with vectorized copies (``build_pack_arrays``) and
hands them to the shard format (``packtool.formats``), a few row groups at a time where the format takes
blocks. A finished shard leaves a record in ``_work/shards/`` so that a resumed run keeps it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from packtool.fileio import file_digests, write_json_atomic
from packtool.formats import ShardMeta, get_format
from packtool.manifest import IGNORE_INDEX, ShardEntry
from packtool.packing.plan import PackPlan
from packtool.packs import PackArrays, pack_position_ids
from packtool.pipeline.chunks import ChunkStore
from packtool.pipeline.encode import RunSpec, worker


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


def write_shard(
    spec: RunSpec,
    meta: ShardMeta,
    plan: PackPlan,
    work_dir: str,
    out_dir: str,
    store: ChunkStore | None = None,
) -> ShardEntry:
    """Write shard ``meta.shard`` (the packs of ``plan``) into ``out_dir``; returns its manifest entry.
    The tokens come from ``store`` (a ``MemoryStore`` the caller holds), else from the chunks in
    ``work_dir``."""
    w = worker(spec)
    cfg = w.config
    store = store if store is not None else w.store(work_dir)
    fmt = get_format(cfg.format)
    step = fmt.block_packs(cfg) or max(plan.num_packs, 1)
    blocks = (
        build_pack_arrays(plan.slice(a, min(a + step, plan.num_packs)), store, cfg.pad_token_id)
        for a in range(0, plan.num_packs, step)
    )
    name = fmt.shard_name(meta.shard)
    path = Path(out_dir) / name
    info = fmt.write(path, blocks, meta, cfg)
    sha256, crc32 = file_digests(path)
    entry = ShardEntry(
        path=name,
        first_pack=meta.first_pack,
        num_packs=plan.num_packs,
        num_tokens=int(plan.length.sum()),
        bytes=path.stat().st_size,
        sha256=sha256,
        crc32=crc32,
        **info,
    )
    write_json_atomic(_record(work_dir, meta.shard), entry.to_dict())  # done: a resumed run skips it
    return entry


def _record(work_dir: str, index: int) -> Path:
    return Path(work_dir) / "shards" / f"packs-{index:06d}.json"


def finished_shard(work_dir: str, out_dir: str, index: int) -> ShardEntry | None:
    """The entry of shard ``index`` if an earlier attempt of this run wrote it whole, else None."""
    record = _record(work_dir, index)
    if not record.exists():
        return None
    entry = ShardEntry.from_dict(json.loads(record.read_text()))
    shard = Path(out_dir) / entry.path
    return entry if shard.exists() and shard.stat().st_size == entry.bytes else None
