"""The images of a vision-language run's encoded samples: beside each scratch chunk, gathered into packs.

The vision encoder (``packtool.encoders.vision``) gives each sample's images as a list of
``IMAGE_STRUCT``: the image's span of tokens in its sample, its size, the XXH3-128 digest of its bytes,
its name, and where its bytes are (a file's ``path`` and stamp, or the ``data`` the record held). A chunk
keeps them as arrays, mapped when read back as its tokens are (``ChunkStore.arrays``, kept open up to the
open-file limit, their pages dropped after each gather), so that gathering a block of shuffled packs from
every chunk costs no file opening:

* ``image_first.npy`` ``(num_samples + 1,)`` int64: sample ``s``'s images are rows ``first[s]:first[s+1]``;
* ``images.npy`` ``(num_images, len(COLUMNS))`` int64, one row per image: ``COLUMNS`` (its span, size,
  file stamp or -1, digest as two int64, and where its name, path and bytes lie in the blob, -1 if none);
* ``image_blob.npy`` uint8: every name, each followed by a NUL, then the paths, then the bytes records
  held.

The chunk's meta counts the images (``num_images``) and digests them (``images_digest``: a resumed run
checks the arrays, and the files' stamps, against it).

``ChunkImages`` addresses a run's images by global sample index, as ``ChunkStore`` does its tokens:

* ``pack_columns(plan)``: the per-image columns of a block of packs (``image_sample``, ``image_offset``,
  ``image_length``, ``image_height``, ``image_width``, ``image_sample_offsets``) and where each image is;
  a piece of a document cut between its images (``--long-samples split``) holds the images whose spans
  lie in it;
* ``blocks(samples)``: each image's block in its sample (every token the processor wrote for it), where
  the planner never cuts a long document;
* ``read(where)``: those images' bytes, unchanged, as the ``images`` struct array (``{"bytes", "path"}``)
  the shard formats write: a file is read again (as inputs are read: ``vision.files.read_image_file``) and
  must give the digest it had when it was encoded, else the run fails naming the sample and image;
* ``tokens_per_pack(plan)`` (``--balance-visual-tokens``), ``changed_file()`` (an image file whose stamp
  is not the one it had when read: the run fails rather than mix old and new images).

``vision_record`` is the manifest's ``vision``: the processor, the images read, packed and left out, and
their statistics in the packs' order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from packtool.arrays import bytes_array, groups, list_parts, np_view, ranges
from packtool.errors import InputError, PacktoolError
from packtool.packing.plan import PackPlan
from packtool.schema import IMAGES, pack_of_piece, per_pack_sum, piece_starts
from packtool.stats import image_stats_of
from packtool.storage.files import exists
from packtool.vision.files import FileStamp, image_digest, read_image_file

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # datasets.Image's storage
FIRST, TABLE, BLOB = "image_first", "images", "image_blob"  # a chunk's image arrays (.npy)
MAPPED = (TABLE, BLOB)  # mapped with the chunk's tokens (ChunkStore.arrays); FIRST is read whole, cached
COLUMNS = ("offset", "length", "height", "width", "file_size", "mtime_ns", "ctime_ns", "inode",
           "digest_lo", "digest_hi", "name_start", "name_len", "path_start", "path_len", "data_start",
           "data_len", "block_start", "block_end")  # fmt: skip
COL = {name: i for i, name in enumerate(COLUMNS)}
NUMBERS = slice(COL["offset"], COL["width"] + 1)  # an image's span and size
STAMP = slice(COL["file_size"], COL["inode"] + 1)
DIGEST = slice(COL["digest_lo"], COL["digest_hi"] + 1)

STATS_BLOCK = 4096  # packs gathered at once for the manifest's image statistics
# (global sample index, field, message) -> an InputError naming the sample's file and row
Locate = Callable[[int, str, str], InputError]


def chunk_images(encoded: list[pa.RecordBatch]) -> pa.LargeListArray | None:
    """The ``images`` column of a chunk's encoded batches, one list per sample; ``None`` when the
    encoder gives none (text samples)."""
    if not encoded or IMAGES not in encoded[0].schema.names:
        return None
    parts = [e.column(IMAGES) for e in encoded]
    return pa.concat_arrays(parts) if len(parts) > 1 else parts[0]


def image_arrays(images: pa.LargeListArray) -> dict[str, np.ndarray]:
    """A chunk's ``images`` column (one list per sample) as its three arrays (module docstring)."""
    first, _ = list_parts(images)
    offsets = np_view(images.offsets)
    flat = images.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    k = len(flat)
    table = np.full((k, len(COLUMNS)), -1, dtype=np.int64)
    for name in ("offset", "length", "height", "width", "file_size", "mtime_ns", "ctime_ns", "inode",
                 "block_start", "block_end"):  # fmt: skip
        table[:, COL[name]] = np_view(flat.field(name).fill_null(-1))
    digests = flat.field("digest")
    raw = np.frombuffer(digests.buffers()[1], dtype=np.uint8)[digests.offset * 16 : (digests.offset + k) * 16]
    table[:, DIGEST] = raw.reshape(-1, 16).copy().view("<i8")
    names = [n.encode() + b"\0" for n in flat.field("name").to_pylist()]
    paths = [None if p is None else p.encode() for p in flat.field("path").to_pylist()]
    data = flat.field("data").to_pylist()
    pieces, at = [], 0
    for column, values in (("name", names), ("path", paths), ("data", data)):
        for i, value in enumerate(values):
            if value is not None:
                table[i, COL[f"{column}_start"]] = at
                table[i, COL[f"{column}_len"]] = len(value) - (column == "name")  # (the NUL is not its)
                pieces.append(value)
                at += len(value)
    blob = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    return {FIRST: first, TABLE: table, BLOB: blob}


def write_chunk_images(directory: Path, images: pa.LargeListArray) -> dict:
    """Write a chunk's ``images`` (one list per sample) as its arrays into ``directory``; returns what the
    chunk's meta adds: ``num_images`` and ``images_digest``."""
    arrays = image_arrays(images)
    for name, values in arrays.items():
        np.save(directory / f"{name}.npy", values, allow_pickle=False)
    table = arrays[TABLE]
    return {"num_images": len(table), "images_digest": images_digest(arrays[FIRST], table, arrays[BLOB])}


def images_digest(first: np.ndarray, table: np.ndarray, blob: np.ndarray) -> str:
    """XXH3-128 of a chunk's images: per sample how many, and per image its span, size, digest and name
    (everything a pack's image columns and ``images`` are made of but the bytes, which the digest is of)."""
    h = xxhash.xxh3_128()
    for part in image_fields(first, table, blob):
        h.update(part)
    return h.hexdigest()


def image_fields(first: np.ndarray, table: np.ndarray, blob: np.ndarray) -> list[bytes]:
    """The byte strings ``images_digest`` hashes, in order, of a chunk's images: the per-sample counts,
    the spans and sizes, the digests, the names (each ended by a NUL). A run's content key hashes each of
    these of every chunk in order, as a stream of its own (``pipeline.identity.content_key``), so it does
    not depend on where chunks start."""
    names = int(table[-1, COL["name_start"]] + table[-1, COL["name_len"]] + 1) if len(table) else 0
    return [
        np.diff(first).astype(np.int64).tobytes(),
        np.ascontiguousarray(table[:, NUMBERS]).tobytes(),
        np.ascontiguousarray(table[:, DIGEST]).tobytes(),
        np.asarray(blob[:names]).tobytes(),
    ]


def _text(blob: np.ndarray, row: np.ndarray, field: str) -> str | None:
    start, length = int(row[COL[f"{field}_start"]]), int(row[COL[f"{field}_len"]])
    return None if length < 0 else blob[start : start + length].tobytes().decode()


def first_changed(table: np.ndarray, blob: np.ndarray) -> int | None:
    """The row of the first image of a chunk read from a file whose stamp (size, modification and change
    times, inode) is not the one it had when it was read, or that is gone; ``None`` if there is none."""
    for i in np.flatnonzero(table[:, COL["path_len"]] >= 0).tolist():
        try:
            now = FileStamp.of_path(_text(blob, table[i], "path"))
        except (OSError, PacktoolError):
            return i
        if now != FileStamp(*table[i, STAMP].tolist()):
            return i
    return None


def images_intact(directory: Path, meta: dict) -> bool:
    """Whether a scratch chunk's image arrays give its meta's ``images_digest`` and its image files are as
    they were when read (a resumed run encodes it again otherwise)."""
    arrays = {name: np.load(directory / f"{name}.npy", allow_pickle=False) for name in (FIRST, TABLE, BLOB)}
    if arrays[TABLE].ndim != 2 or arrays[TABLE].shape[1] != len(COLUMNS):  # (another version's columns)
        return False
    digest = images_digest(arrays[FIRST], arrays[TABLE], arrays[BLOB])
    return digest == meta["images_digest"] and first_changed(arrays[TABLE], arrays[BLOB]) is None


class ChunkImages:
    """The images of a run's chunks, by global sample index (module docstring); ``store``: the run's
    ``ChunkStore``, whose maps and caches it reads them through."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def arrays(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Chunk ``c``'s ``(first, table, blob)``; empty for a chunk without images (a custom policy's)."""
        if "num_images" not in self.store.metas[c]:
            n = int(self.store.sample_starts[c + 1] - self.store.sample_starts[c])
            return np.zeros(n + 1, np.int64), np.zeros((0, len(COLUMNS)), np.int64), np.zeros(0, np.uint8)
        a = self.store.arrays(c)
        return self.store.cached(c, FIRST), a[TABLE], a[BLOB]

    def _where(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per sample: its chunk, its first image's row in the chunk's table, its image count."""
        samples = np.asarray(samples, dtype=np.int64)
        chunk = np.searchsorted(self.store.sample_starts, samples, side="right") - 1
        first = np.zeros(len(samples), dtype=np.int64)
        counts = np.zeros(len(samples), dtype=np.int64)
        for c, sel in groups(chunk):
            offsets = self.store.cached(c, FIRST) if "num_images" in self.store.metas[c] else None
            if offsets is None:
                continue
            local = samples[sel] - self.store.sample_starts[c]
            first[sel] = offsets[local]
            counts[sel] = offsets[local + 1] - offsets[local]
        return chunk, first, counts

    def counts(self) -> np.ndarray:
        """``(num_samples,)`` int64: each sample's images."""
        parts = [np.diff(self.arrays(c)[0]) for c in range(len(self.store.metas))]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def tokens_per_pack(self, plan: PackPlan) -> np.ndarray:
        """``(num_packs,)`` int64: the image tokens of each pack of ``plan`` (``pack_columns``,
        ``STATS_BLOCK`` packs at a time)."""
        out = [np.zeros(0, dtype=np.int64)]
        for a in range(0, plan.num_packs, STATS_BLOCK):
            columns, _ = self.pack_columns(plan.slice(a, min(a + STATS_BLOCK, plan.num_packs)))
            out.append(
                per_pack_sum(columns["image_length"].astype(np.int64), columns["image_sample_offsets"])
            )
        return np.concatenate(out)

    def blocks(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The blocks of the images of ``samples`` (global indices), in their samples: ``(offsets,
        starts, ends)``, sample ``j``'s images' ``[start, end)`` at ``offsets[j]:offsets[j + 1]``, in order
        (``packing.planner.make_plan``'s ``blocks``)."""
        chunk, first, counts = self._where(samples)
        index, image_chunk = ranges(first, counts), np.repeat(chunk, counts)
        found = np.zeros((len(index), 2), dtype=np.int64)
        for c, sel in groups(image_chunk):
            found[sel] = self.arrays(c)[1][index[sel]][:, [COL["block_start"], COL["block_end"]]]
            self.store.release(c)
        offsets = np.zeros(len(samples) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return offsets, found[:, 0], found[:, 1]

    def digests(self, samples: np.ndarray, index: np.ndarray) -> list[tuple[bytes, str] | None]:
        """The digest and name of image ``index[j]`` of sample ``samples[j]`` (``None`` where it has no such
        image)."""
        chunk, first, counts = self._where(samples)
        out: list[tuple[bytes, str] | None] = [None] * len(chunk)
        for j, (c, f, n, k) in enumerate(
            zip(chunk.tolist(), first.tolist(), counts.tolist(), index.tolist(), strict=True)
        ):
            if 0 <= k < n:
                _, table, blob = self.arrays(c)
                out[j] = (table[f + k, DIGEST].tobytes(), _text(blob, table[f + k], "name"))
        return out

    def images_before(self, samples: np.ndarray, at: np.ndarray) -> np.ndarray:
        """``(len(samples),)`` int64: how many of sample ``samples[j]``'s images have spans starting before
        its token ``at[j]`` (a piece of a cut document: the index of its first image in its sample)."""
        chunk, first, counts = self._where(samples)
        out = np.zeros(len(chunk), dtype=np.int64)
        for j in np.flatnonzero((counts > 0) & (np.asarray(at) > 0)).tolist():
            rows = self.arrays(int(chunk[j]))[1][first[j] : first[j] + counts[j], COL["offset"]]
            out[j] = int((rows < at[j]).sum())
        return out

    def pack_columns(self, plan: PackPlan) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...]]:
        """The per-image columns of the packs of ``plan``, and where each image is (``(sample, chunk, row
        in the chunk's table, index in its sample)``, for ``read``). A piece holds the images of its sample
        whose spans lie in it (all of them for a whole sample; a document cut between its images,
        ``--long-samples split``, gives each image to one piece)."""
        chunk, first, counts = self._where(plan.sample)
        image_chunk = np.repeat(chunk, counts)
        index = ranges(first, counts)
        numbers = np.zeros((len(index), NUMBERS.stop - NUMBERS.start), dtype=np.int64)
        for c, sel in groups(image_chunk):
            numbers[sel] = self.arrays(c)[1][index[sel], NUMBERS]
            self.store.release(c)
        in_sample = np.arange(len(index), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        piece = np.repeat(np.arange(len(plan.sample), dtype=np.int64), counts)
        offset = numbers[:, 0] - plan.start[piece]  # where its span starts in its piece
        inside = (offset >= 0) & (offset + numbers[:, 1] <= plan.length[piece])
        if not inside.all():  # pieces of a cut document: each image goes with the piece it lies in
            numbers, offset, piece, in_sample = (
                numbers[inside],
                offset[inside],
                piece[inside],
                in_sample[inside],
            )
            image_chunk, index = image_chunk[inside], index[inside]
            counts = np.bincount(piece, minlength=len(plan.sample)).astype(np.int64)
        _, length, height, width = numbers.T
        piece_pack = pack_of_piece(plan.pack_offsets)
        piece_in_pack = np.arange(len(plan.sample), dtype=np.int64) - plan.pack_offsets[piece_pack]
        starts = piece_starts(plan.spans, plan.pack_offsets)
        columns = {
            "image_sample": piece_in_pack[piece].astype(np.int32),
            "image_offset": (offset + starts[piece]).astype(np.int32),
            "image_length": length.astype(np.int32),
            "image_height": height.astype(np.int32),
            "image_width": width.astype(np.int32),
            "image_sample_offsets": np.concatenate(
                [[0], np.cumsum(per_pack_sum(counts, plan.pack_offsets))]
            ).astype(np.int64),
        }
        return columns, (plan.sample[piece], image_chunk, index, in_sample)

    def read(self, where: tuple[np.ndarray, ...]) -> pa.StructArray:
        """The images at ``where`` (``pack_columns``' second value) as ``struct<bytes, path>``: each
        one's bytes as read when it was encoded, and its name. A file whose bytes no longer give their
        digest is an ``InputError`` (exit 3) naming its sample and image: nothing is written from it."""
        sample, chunk, index, in_sample = where
        data: list[bytes | None] = [None] * len(sample)
        names: list[str | None] = [None] * len(sample)
        for c, sel in groups(chunk):  # one chunk's maps at a time, their pages dropped after
            _, table, blob = self.arrays(c)
            for j in sel.tolist():
                row = table[int(index[j])]
                names[j] = name = _text(blob, row, "name")
                path = _text(blob, row, "path")
                if path is None:
                    start = int(row[COL["data_start"]])
                    data[j] = blob[start : start + int(row[COL["data_len"]])].tobytes()
                    continue
                k, s = int(in_sample[j]), int(sample[j])
                try:
                    raw, _ = read_image_file(path, name)
                except InputError as e:
                    raise self.store.locate(s, "image", f"image {k} ({name}): {e.reason}") from None
                if image_digest(raw) != row[DIGEST].tobytes():
                    raise self._changed(s, k, name, "its bytes are not those it was encoded from")
                data[j] = raw
            self.store.release(c)
        return pa.StructArray.from_arrays(
            [bytes_array(data, pa.binary()), bytes_array(names, pa.string())], fields=list(IMAGE)
        )

    def changed_file(self) -> InputError | None:
        """The first image file (in sample order) whose stamp is not the one it had when it was read, as an
        ``InputError`` naming its sample and image; ``None`` when every one is as it was."""
        for c in range(len(self.store.metas)):
            first, table, blob = self.arrays(c)
            i = first_changed(table, blob)
            self.store.release(c)
            if i is not None:
                local = int(np.searchsorted(first, i, side="right") - 1)
                sample = int(self.store.sample_starts[c]) + local
                what = "changed" if exists(_text(blob, table[i], "path")) else "removed"
                name = _text(blob, table[i], "name")
                return self._changed(sample, i - int(first[local]), name, f"{what} while the run read it")
        return None

    def fields(self, c: int) -> list[bytes]:
        """Chunk ``c``'s ``image_fields`` (the run's content key)."""
        out = image_fields(*self.arrays(c))
        self.store.release(c)
        return out

    def _changed(self, sample: int, k: int, name: str, what: str) -> InputError:
        error = self.store.locate(sample, "image", f"image {k} ({name}): {what}; nothing was written: run "
                                  "again once the images are final")  # fmt: skip
        error.code = "input_changed"
        return error


def vision_record(
    processor: dict, images: ChunkImages, input_images: int, plan: PackPlan, ranks: int
) -> dict:
    """The manifest's ``vision``: the processor's identity; ``input_images`` (the images of the samples
    encoded), ``packed_images`` and ``dropped_images`` (in samples the plan left out: too long, over
    ``max_packs``); ``images``: ``stats.image_stats`` of the packs in their written order, their spread
    over steps of ``ranks`` packs. Gathered ``STATS_BLOCK`` packs at a time: what it holds is per pack."""
    counts, tokens, smallest, largest = [], [], None, 0
    for a in range(0, plan.num_packs, STATS_BLOCK):
        part = plan.slice(a, min(a + STATS_BLOCK, plan.num_packs))
        columns, _ = images.pack_columns(part)
        length, offsets = columns["image_length"].astype(np.int64), columns["image_sample_offsets"]
        counts.append(np.diff(offsets))
        tokens.append(per_pack_sum(length, offsets))
        if len(length):
            smallest = int(length.min()) if smallest is None else min(smallest, int(length.min()))
            largest = max(largest, int(length.max()))
    counts_all = np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)
    tokens_all = np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int64)
    n = np.full(plan.num_packs, plan.packed_sequence_size)
    stats = image_stats_of(counts_all, tokens_all, smallest or 0, largest, n, ranks)
    packed = int(counts_all.sum())
    return {
        "processor": processor,
        "input_images": input_images,
        "packed_images": packed,
        "dropped_images": input_images - packed,
        "images": stats,
    }
