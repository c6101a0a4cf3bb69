"""The write step: plan + encoded chunks -> shards, one task per shard, in parallel.

Each task gathers its packs' tokens from the chunks with vectorized copies (``build_pack_arrays``), only
the columns the layout stores (``output_columns``, ``packtool.layout``), and hands them to the shard
format (``packtool.formats``), a few row groups at a time where the format takes blocks. A finished shard
leaves a record in ``_work/shards/`` so that a resumed run keeps it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.fileio import file_digests, write_json_atomic
from packtool.formats.registry import ShardFormat, ShardMeta, get_format
from packtool.layout import to_stored
from packtool.manifest import IGNORE_INDEX, ShardEntry, column_names
from packtool.options import PackOptions
from packtool.packing.plan import PackPlan
from packtool.packs import PackArrays, pack_position_ids
from packtool.pipeline.chunks import ChunkStore
from packtool.pipeline.encode import RunSpec, worker
from packtool.schema import pack_of_piece, pack_seq_lens, piece_starts
from packtool.storage.folders import StoreFolder
from packtool.storage.scratch import Scratch, as_scratch


def output_columns(options: PackOptions, store: ChunkStore) -> list[str]:
    """The columns the run's shards store: its layout (``columns``) for what the chunks hold (a loss mask;
    labels that follow the rule ``minimal`` rebuilds them by, as each chunk recorded when encoded)."""
    return column_names(
        store.has_loss_mask,
        options.output.columns,
        labels_rebuilt=store.labels_follow_rule,
        shifted=options.encoding.labels == "shifted",
        has_cp_padding=options.packing.cp_size > 1,
    )


def build_pack_arrays(
    plan: PackPlan, store: ChunkStore, pad_token_id: int = 0, columns: list[str] | None = None
) -> PackArrays:
    """Materialize the packs of ``plan`` (usually a ``plan.slice`` of one row group), with the stored
    ``columns`` (default: the ``full`` layout's), and a vision-language run's images with their columns
    (``pipeline.images``).

    Tokens are copied by ``store.pieces_into`` straight from the chunks' maps into the ``(k, N)`` arrays
    (one slice per run of pieces contiguous in a chunk and in the pack), over arrays filled with the
    padding values (so context-parallel padding after a piece is ``pad_token_id``, label -100, loss mask 0,
    and its positions run on from the piece's); positions come from one ``arange`` minus each segment's
    start. Temporaries are O(k * N), never per-token Python. A column the layout does not store is not
    built.
    """
    columns = column_names(store.has_loss_mask) if columns is None else columns
    n = plan.packed_sequence_size
    k = plan.num_packs
    span = plan.spans  # each piece's tokens, then its context-parallel padding (cp_size), if any
    # piece i lands in its pack's row, after the pieces before it in its pack
    dest = pack_of_piece(plan.pack_offsets) * n + piece_starts(span, plan.pack_offsets)

    input_ids = np.full((k, n), pad_token_id, dtype=np.int32)
    out = {"input_ids": input_ids.reshape(-1)}
    labels = loss_mask = next_label = None
    if "labels" in columns:
        labels = np.full((k, n), IGNORE_INDEX, dtype=np.int32)
        out["labels"] = labels.reshape(-1)
    if store.has_loss_mask:  # stored as it is, or as loss_mask_bits
        loss_mask = np.zeros((k, n), dtype=np.int8)
        out["loss_mask"] = loss_mask.reshape(-1)
    store.pieces_into(plan.sample, plan.start, plan.length, dest, out)
    if "next_label" in columns:  # the label of each piece's last token, as the chunks hold it
        next_label = store.values_at(plan.sample, plan.start + plan.length - 1, "labels")

    # seq_lens: piece spans, then the padding length if the pack is not full
    seg_len, sl_offsets = pack_seq_lens(span, plan.pack_offsets, n)

    position_ids = None
    if "position_ids" in columns:
        position_ids = pack_position_ids(
            seg_len, sl_offsets, plan.pack_offsets, plan.start, n, plan.position_ids
        )
    seq_lens = seg_len.astype(np.int32)

    packs = PackArrays(
        input_ids=input_ids,
        labels=labels,
        position_ids=position_ids,
        loss_mask=loss_mask,
        seq_lens=seq_lens,
        seq_lens_offsets=sl_offsets,
        sample_index=store.origin(plan.sample),
        sample_index_offsets=plan.pack_offsets.astype(np.int64),
        sample_offset=plan.start.astype(np.int64),
        cp_padding=None if plan.span is None else (plan.span - plan.length).astype(np.int32),
        next_label=next_label,
    )
    packs = to_stored(packs, columns)
    if store.images is not None:  # vision-language packs: each image's columns, and its bytes
        image_columns, where = store.images.pack_columns(plan)
        for name, values in image_columns.items():
            setattr(packs, name, values)
        packs.images = store.images.read(where)
    return packs


@dataclass(frozen=True)
class ShardTask:
    """One shard to write: the run (``spec``), the shard (``meta``: the run id, its index, its first pack),
    its packs (``plan``), where the encoded samples are (``scratch``) and the local folder it is written in
    (``out_dir``), its ``split`` and its ``number`` among the shards of its split (``val-000000`` is the
    first validation shard); ``out_url``: the store prefix it is uploaded to once written (an output in a
    store), else None."""

    spec: RunSpec
    meta: ShardMeta
    plan: PackPlan
    scratch: Scratch
    out_dir: str
    split: str = "train"
    number: int = 0
    out_url: str | None = None


def write_shard(task: ShardTask, store: ChunkStore | None = None) -> ShardEntry:
    """Write ``task``'s shard into its output directory (uploaded to the store of an output there, and
    removed here); returns its manifest entry. The tokens come from ``store`` (a ``MemoryStore`` the caller
    holds), else from the chunks in ``task.scratch``."""
    spec, meta, plan, scratch = task.spec, task.meta, task.plan, as_scratch(task.scratch)
    w = worker(spec)
    options = w.options
    store = store if store is not None else w.store(scratch)
    writer = get_format(options.output.format).writer
    step = writer.block_packs(options.output, options.packing.packed_sequence_size) or max(plan.num_packs, 1)
    columns = output_columns(options, store)
    blocks = (
        build_pack_arrays(
            plan.slice(a, min(a + step, plan.num_packs)), store, options.packing.pad_token_id, columns
        )
        for a in range(0, plan.num_packs, step)
    )
    path = Path(task.out_dir) / writer.shard_name(task.number, task.split)
    path.parent.mkdir(parents=True, exist_ok=True)  # a machine of a cluster that wrote nothing yet
    entry = shard_entry(path, meta, plan, task.split, writer.write(path, blocks, meta, options.output))
    if task.out_url is not None:
        shard_format = get_format(options.output.format)
        for name in [entry.path, *shard_format.reader.index_files(entry)]:  # the shard, then its index
            StoreFolder(task.out_url).put_file(path.with_name(name), name)
            path.with_name(name).unlink()
    record = _record(meta.shard)
    scratch.path(record).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(scratch.path(record), entry.to_dict())  # done: a resumed run skips it
    scratch.publish(record)
    return entry


def shard_entry(path: Path, meta: ShardMeta, plan: PackPlan, split: str, fields: dict) -> ShardEntry:
    """The manifest entry of the shard just written at ``path`` (the packs of ``plan``, of ``split``):
    its size and digests (the whole file: tokens, and a vision-language shard's image bytes), and the
    format's own ``fields``."""
    sha256, crc32 = file_digests(path)
    return ShardEntry(
        path=path.name,
        first_pack=meta.first_pack,
        num_packs=plan.num_packs,
        num_tokens=int(plan.length.sum()),
        bytes=path.stat().st_size,
        sha256=sha256,
        crc32=crc32,
        split=None if split == "train" else split,
        fields=fields,
    )


def _record(index: int) -> str:
    """The scratch's record of finished shard ``index``."""
    return f"shards/packs-{index:06d}.json"


def finished_shard(scratch: Scratch, has_shard: Callable[[str, int], bool], index: int) -> ShardEntry | None:
    """The entry of shard ``index`` if an earlier attempt of this run wrote it whole (its record is in the
    ``scratch``, and ``has_shard(name, size)`` finds it in the output), else None."""
    try:
        record = as_scratch(scratch).fetch(_record(index), fresh=True)
    except FileNotFoundError:
        return None
    if not record.exists():
        return None
    entry = ShardEntry.from_dict(json.loads(record.read_text()))
    return entry if has_shard(entry.path, entry.bytes) else None


def split_shard_ranges(
    fmt: ShardFormat, plan: PackPlan, num_train: int, options: PackOptions, columns: list[str]
) -> list[tuple[int, int, str]]:
    """``(first, end, split)`` of every shard: the training packs ``0..num_train-1``, then the held-out
    validation packs, each split cut into shards by the format on its own (no shard mixes them)."""
    out = []
    for split, a, b in (("train", 0, num_train), ("val", num_train, plan.num_packs)):
        if b > a:
            ranges = fmt.writer.shard_ranges(plan.slice(a, b), options.output, columns)
            out += [(a + x, a + y, split) for x, y in ranges]
    return out
