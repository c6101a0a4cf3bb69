"""A run's identity: ``run_id`` (what the output is made from and what it encoded) and the stamps a
resumed run must match."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xxhash

from packtool.binding import bound_run_id, reading_fields
from packtool.errors import InputError
from packtool.formats.registry import ShardFormat
from packtool.manifest import IGNORE_INDEX, SHARD_FORMAT_VERSION
from packtool.options import PackOptions
from packtool.pipeline.chunks import CHUNK_ARRAYS, ChunkStore
from packtool.pipeline.content import DIGESTED
from packtool.readers.inputs import expand_inputs
from packtool.storage.files import file_sizes, is_dir, list_prefix, stat
from packtool.storage.urls import is_url


def _files(source: str, files: list[str]) -> list[str]:
    if files:
        return files
    if is_url(source):  # an object, or a prefix (a dataset saved to a store)
        return list_prefix(source).files if is_dir(source) else [source]
    if Path(source).is_dir():
        return sorted(str(p) for p in Path(source).rglob("*") if p.is_file())
    return [source] if Path(source).is_file() else []


# inputs -> ``[(reader kind, source, files)]`` (files ``[]``: the source itself, or every file under it)
Expand = Callable[[list[str]], list[tuple[str, str, list[str]]]]


def input_fingerprint(inputs: list[str], expand: Expand = expand_inputs) -> list[dict]:
    """Names, reader kinds and sizes of the inputs (what the ``run_id`` and the manifest record);
    ``expand``: how the run's reader names them (the text readers' ``expand_inputs`` by default)."""
    return [
        {"source": source, "kind": kind, "bytes": int(file_sizes(_files(source, files)).sum())}
        for kind, source, files in expand(inputs)
    ]


def input_stamps(inputs: list[str], expand: Expand = expand_inputs) -> list[list]:
    """``[path, size, mtime_ns, ctime_ns, inode]`` of every input file, ``[url, size, ETag]`` of every
    object in a store (``storage.files.Stat.stamp``): a resumed run must see the very same files. The
    change time and the inode tell a file rewritten at the same size with its modification time set back
    (``os.utime``), or another file moved over it: no one can set them; a store gives a rewritten object
    a new ETag (or generation)."""
    out = []
    for _kind, source, files in expand(inputs):
        paths = _files(source, files)
        for p in paths:
            try:
                st = stat(p)
            except FileNotFoundError:
                raise InputError("no such file or object", source=str(p)) from None
            out.append([str(p), *st.stamp])
        if not paths:
            out.append([source, None, None, None, None])
    return out


def check_inputs_unchanged(inputs: list[str], stamps: list[list], expand: Expand = expand_inputs) -> None:
    """``InputError`` naming the first input file whose size or modification time is not what it was
    when the run started (``stamps``, from ``input_stamps``): its records may be a mix of old and new."""
    try:
        now = {p: tuple(rest) for p, *rest in input_stamps(inputs, expand)}
    except InputError as e:  # removed meanwhile
        raise InputError(f"changed while the run read it: {e.reason}", source=e.source) from None
    for path, size, *rest in stamps:
        if path not in now:
            raise InputError("removed while the run read it; nothing was written", source=path)
        new_size = now[path][0]
        if now[path] != (size, *rest):
            what = f"{size:,} -> {new_size:,} bytes" if new_size != size else "rewritten at the same size"
            raise InputError(
                f"changed while the run read it ({what}); nothing was written: run again once it is final",
                source=path,
                code="input_changed",
            )
    added = sorted(set(now) - {p for p, *_ in stamps})
    if added:
        raise InputError("appeared while the run read its inputs; nothing was written", source=added[0])


def make_run_id(options: PackOptions, tokenizer: dict, fingerprint: list[dict]) -> str:
    """16 hex digits from the config (less its runtime keys), the tokenizer's identity, the inputs'
    fingerprint and the format version: two runs with the same ``run_id`` write the same bytes."""
    basis = [options.to_dict(include_runtime=False), tokenizer, fingerprint, SHARD_FORMAT_VERSION]
    return hashlib.sha256(json.dumps(basis, sort_keys=True, default=str).encode()).hexdigest()[:16]


def shard_numbers(ranges: list[tuple[int, int, str]]) -> list[int]:
    """Each shard's number within its split (``ranges``: ``(first, end, split)`` in order): ``val-000000``
    is the first held-out shard.

    >>> shard_numbers([(0, 4, "train"), (4, 8, "train"), (8, 9, "val")])
    [0, 1, 0]
    """
    seen: dict[str, int] = {}
    numbers = []
    for _, _, split in ranges:
        numbers.append(seen.get(split, 0))
        seen[split] = numbers[-1] + 1
    return numbers


def bind_run_id(
    run_key: str,
    options: PackOptions,
    fmt: ShardFormat,
    ranges: list[tuple[int, int, str]],
    position_ids: str,
    columns: list[str],
    sample_format: str,
    image_columns: list[str] | tuple[str, ...] | None = None,
) -> str:
    """The run's ``run_id``: ``run_key`` (what the run is made from and what it encoded) bound to the
    manifest fields readers rely on (``binding.reading_fields``), the shards named as they will be."""
    shards = [
        (fmt.writer.shard_name(k, split), b - a, split)
        for k, (a, b, split) in zip(shard_numbers(ranges), ranges, strict=True)
    ]
    fields = reading_fields(
        packed_sequence_size=options.packing.packed_sequence_size,
        shard_format=options.output.format,
        sample_format=sample_format,
        labels=options.encoding.labels,
        position_ids=position_ids,
        pad_token_id=options.packing.pad_token_id,
        columns=columns,
        layout=options.output.columns,
        shards=shards,
        image_columns=image_columns,
    )
    return bound_run_id(run_key, fields)


def content_key(store: ChunkStore) -> str:
    """XXH3-128 of everything the run encoded, sample after sample: each ``DIGESTED`` array end to end
    (a chunk without a ``loss_mask``, in a store with one, as the packs get it: where a label is), the
    samples' lengths, and a vision-language run's images (``images.image_fields``: counts, spans, sizes,
    digests, names). Streamed over the chunks in order, it does not depend on where chunks start, so
    ``--chunk-size`` (how the work is cut) leaves the run id alone. One pass over the encoded tokens,
    about 10 GB/s (docs/performance.md).
    """
    hashers = {name: xxhash.xxh3_128() for name in (*DIGESTED, "lengths")}
    for c in range(len(store.metas)):
        arrays = store.arrays(c)
        for name in ("input_ids", "labels"):
            hashers[name].update(memoryview(np.ascontiguousarray(arrays[name])).cast("B"))
        if store.has_loss_mask:
            mask = arrays.get("loss_mask")
            if mask is None:
                mask = (arrays["labels"] != IGNORE_INDEX).astype(np.int8)
            hashers["loss_mask"].update(memoryview(np.ascontiguousarray(mask)).cast("B"))
        rows = np.ascontiguousarray(store.rows(c), dtype=CHUNK_ARRAYS["rows"])
        hashers["rows"].update(memoryview(rows).cast("B"))
        hashers["lengths"].update(np.diff(store.offsets(c)).astype(np.int64).tobytes())
        store.release(c)
        if store.images is not None:  # each of the images' fields a stream of its own, as the arrays
            for i, part in enumerate(store.images.fields(c)):
                hashers.setdefault(f"images.{i}", xxhash.xxh3_128()).update(part)
    out = xxhash.xxh3_128()
    for name, h in hashers.items():
        out.update(name.encode() + h.digest())
    return out.hexdigest()
