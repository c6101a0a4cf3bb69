"""The images of a vision-language run's encoded samples: beside each scratch chunk, gathered into packs.

The vision encoder (``packtool.encoders.vision``) gives each sample's images as a list of
``IMAGE_STRUCT``: the image's span of tokens in its sample, its size, the XXH3-128 digest of its bytes,
its name, and where its bytes are (a file's ``path`` and stamp, or the ``data`` the record held). A chunk
keeps them in ``images.arrow`` (``IMAGE_FILE``: Arrow IPC, one list per sample of the chunk,
memory-mapped when read back), and its meta counts them (``num_images``) and digests them
(``images_digest``: a resumed run checks the file against it).

``ChunkImages`` addresses a run's images by global sample index, as ``ChunkStore`` does its tokens:

* ``pack_columns(plan)``: the per-image columns of a block of packs (``image_sample``, ``image_offset``,
  ``image_length``, ``image_height``, ``image_width``, ``image_sample_offsets``; whole samples only) and
  where each image lies;
* ``read(where)``: those images' bytes, unchanged, as the ``images`` struct array (``{"bytes", "path"}``)
  the shard formats write: a file is read again (as inputs are read: ``vision.images.read_image_file``)
  and must give the digest it had when it was encoded, else the run fails naming the sample and image;
* ``tokens_per_sample()`` (``--balance-visual-tokens``), ``changed_file()`` (an image file whose stamp
  is not the one it had when read: the run fails rather than mix old and new images).

``vision_record`` is the manifest's ``vision``: the processor, the images read, packed and left out, and
their statistics in the packs' order.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import xxhash

from packtool.arrays import groups, list_parts, np_view, ranges
from packtool.encoders.base import IMAGE_FILE_STAMP, IMAGE_STRUCT
from packtool.errors import InputError
from packtool.packing.plan import PackPlan
from packtool.schema import IMAGES, pack_of_piece, per_pack_sum, piece_starts
from packtool.stats import image_stats
from packtool.vision.files import image_digest, read_image_file

IMAGE_FILE = "images.arrow"
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # datasets.Image's storage
NUMBERS = ("offset", "length", "height", "width")  # an image's span and size, as NumPy arrays
MAX_TABLES = 256  # chunks' image tables mapped at once

# (global sample index, field, message) -> an InputError naming the sample's file and row
Locate = Callable[[int, str, str], InputError]


def chunk_images(encoded: list[pa.RecordBatch]) -> pa.LargeListArray | None:
    """The ``images`` column of a chunk's encoded batches, one list per sample; ``None`` when the
    encoder gives none (text samples)."""
    if not encoded or IMAGES not in encoded[0].schema.names:
        return None
    parts = [e.column(IMAGES) for e in encoded]
    return pa.concat_arrays(parts) if len(parts) > 1 else parts[0]


def write_chunk_images(directory: Path, images: pa.LargeListArray) -> dict:
    """Write a chunk's ``images`` (one list per sample) to ``directory / IMAGE_FILE``; returns what the
    chunk's meta adds: ``num_images`` and ``images_digest``."""
    table = pa.table({IMAGES: images})
    with pa.OSFile(str(directory / IMAGE_FILE), "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table)
    offsets, _ = list_parts(images)
    return {"num_images": int(offsets[-1]), "images_digest": images_digest(images)}


def images_digest(images: pa.LargeListArray) -> str:
    """XXH3-128 of a chunk's images: per sample how many, and per image its span, size, digest and name
    (everything a pack's image columns and ``images`` are made of but the bytes, which the digest is of)."""
    h = xxhash.xxh3_128()
    for part in image_fields(list_parts(images)[0], flat_images(images)):
        h.update(part)
    return h.hexdigest()


def image_fields(offsets: np.ndarray, flat: pa.StructArray) -> list[bytes]:
    """The byte strings ``images_digest`` hashes, in order, of a chunk's images (``offsets``: where each
    sample's start in ``flat``): the per-sample counts, each ``NUMBERS`` field, the digests, the names
    (each ended by a NUL). A run's content key hashes these of every chunk in order
    (``pipeline.identity.content_key``), so it does not depend on where chunks start."""
    out = [np.diff(offsets).astype(np.int64).tobytes()]
    out += [np.ascontiguousarray(_numbers(flat, name), dtype=np.int64).tobytes() for name in NUMBERS]
    out.append(_digests(flat).tobytes())
    out.append("".join(name + "\0" for name in flat.field("name").to_pylist()).encode())
    return out


def flat_images(images: pa.LargeListArray) -> pa.StructArray:
    """The images of every sample of ``images``, end to end (a slice's own, not its parent's)."""
    offsets = np_view(images.offsets)
    return images.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _numbers(flat: pa.StructArray, name: str) -> np.ndarray:
    return np_view(flat.field(name))


def _digests(flat: pa.StructArray) -> np.ndarray:
    """``(k, 16)`` uint8: each image's digest."""
    digests = flat.field("digest")
    data = np.frombuffer(digests.buffers()[1], dtype=np.uint8)
    return data[digests.offset * 16 : (digests.offset + len(digests)) * 16].reshape(-1, 16)


class ChunkImages:
    """The images of a run's chunks, by global sample index (module docstring).

    Args:
        files: per chunk, its ``images.arrow`` (``None`` for a chunk without images: a custom policy's).
        sample_starts: ``(num_chunks + 1,)`` int64, the first global sample of each chunk.
        locate: names a sample's file and row in an error (``ChunkStore.locate``).
    """

    def __init__(self, files: list[Path | None], sample_starts: np.ndarray, locate: Locate) -> None:
        self.files, self.sample_starts, self.locate = files, sample_starts, locate
        self._tables: OrderedDict[int, tuple[np.ndarray, pa.StructArray]] = OrderedDict()

    def table(self, c: int) -> tuple[np.ndarray, pa.StructArray]:
        """Chunk ``c``'s ``(num_samples + 1,)`` int64 image offsets and its flat images, memory-mapped."""
        if c in self._tables:
            self._tables.move_to_end(c)
            return self._tables[c]
        file = self.files[c]
        if file is None:
            count = int(self.sample_starts[c + 1] - self.sample_starts[c])
            empty = pa.array([], type=pa.large_list(IMAGE_STRUCT)).values
            entry = (np.zeros(count + 1, dtype=np.int64), empty)
        else:
            column = read_chunk_images(file)
            offsets, _ = list_parts(column)
            entry = (offsets, flat_images(column))
        self._tables[c] = entry
        while len(self._tables) > MAX_TABLES:
            self._tables.popitem(last=False)
        return entry

    def _where(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per sample: its chunk, its first image's index in the chunk's table, its image count."""
        samples = np.asarray(samples, dtype=np.int64)
        chunk = np.searchsorted(self.sample_starts, samples, side="right") - 1
        first = np.zeros(len(samples), dtype=np.int64)
        counts = np.zeros(len(samples), dtype=np.int64)
        for c, sel in groups(chunk):
            offsets, _ = self.table(c)
            local = samples[sel] - self.sample_starts[c]
            first[sel] = offsets[local]
            counts[sel] = offsets[local + 1] - offsets[local]
        return chunk, first, counts

    def counts(self) -> np.ndarray:
        """``(num_samples,)`` int64: each sample's images."""
        parts = [np.diff(self.table(c)[0]) for c in range(len(self.files))]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def digests(self, samples: np.ndarray, index: np.ndarray) -> list[tuple[bytes, str] | None]:
        """The digest and name of image ``index[j]`` of sample ``samples[j]`` (``None`` where it has no such
        image)."""
        chunk, first, counts = self._where(samples)
        out: list[tuple[bytes, str] | None] = [None] * len(chunk)
        for j, (c, f, n, k) in enumerate(
            zip(chunk.tolist(), first.tolist(), counts.tolist(), index.tolist(), strict=True)
        ):
            if 0 <= k < n:
                flat = self.table(c)[1]
                out[j] = (bytes(_digests(flat)[f + k]), flat.field("name")[f + k].as_py())
        return out

    def tokens_per_sample(self) -> np.ndarray:
        """``(num_samples,)`` int64: each sample's image tokens."""
        out = []
        for c in range(len(self.files)):
            offsets, flat = self.table(c)
            cum = np.concatenate([[0], np.cumsum(_numbers(flat, "length"), dtype=np.int64)])
            out.append(cum[offsets[1:]] - cum[offsets[:-1]])
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def pack_columns(self, plan: PackPlan) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...]]:
        """The per-image columns of the packs of ``plan`` (whole samples), and where each image is
        (``(sample, chunk, index in the chunk's table, index in its sample)``, for ``read``)."""
        chunk, first, counts = self._where(plan.sample)
        image_chunk = np.repeat(chunk, counts)
        index = ranges(first, counts)
        numbers = {name: np.zeros(len(index), dtype=np.int64) for name in NUMBERS}
        for c, sel in groups(image_chunk):
            _, flat = self.table(c)
            for name in NUMBERS:
                numbers[name][sel] = _numbers(flat, name)[index[sel]]
        piece_pack = pack_of_piece(plan.pack_offsets)
        piece_in_pack = np.arange(len(plan.sample), dtype=np.int64) - plan.pack_offsets[piece_pack]
        starts = piece_starts(plan.spans, plan.pack_offsets)
        columns = {
            "image_sample": np.repeat(piece_in_pack, counts).astype(np.int32),
            "image_offset": (numbers["offset"] + np.repeat(starts, counts)).astype(np.int32),
            "image_length": numbers["length"].astype(np.int32),
            "image_height": numbers["height"].astype(np.int32),
            "image_width": numbers["width"].astype(np.int32),
            "image_sample_offsets": np.concatenate(
                [[0], np.cumsum(per_pack_sum(counts, plan.pack_offsets))]
            ).astype(np.int64),
        }
        in_sample = np.arange(len(index), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        return columns, (np.repeat(plan.sample, counts), image_chunk, index, in_sample)

    def read(self, where: tuple[np.ndarray, ...]) -> pa.StructArray:
        """The images at ``where`` (``pack_columns``' second value) as ``struct<bytes, path>``: each
        one's bytes as read when it was encoded, and its name. A file whose bytes no longer give their
        digest is an ``InputError`` (exit 3) naming its sample and image: nothing is written from it."""
        data, names = [], []
        for sample, c, i, k in zip(*(w.tolist() for w in where), strict=True):
            _, flat = self.table(c)
            image = flat[i].as_py()
            if image["path"] is None:
                raw = image["data"]
            else:
                try:
                    raw, _ = read_image_file(image["path"], image["name"])
                except InputError as e:
                    raise self.locate(sample, "image", f"image {k} ({image['name']}): {e.reason}") from None
                if image_digest(raw) != image["digest"]:
                    what = "its bytes are not those it was encoded from"
                    raise self._changed(sample, k, image["name"], what)
            data.append(raw)
            names.append(image["name"])
        return pa.StructArray.from_arrays(
            [pa.array(data, type=pa.binary()), pa.array(names, type=pa.string())], fields=list(IMAGE)
        )

    def changed_file(self) -> InputError | None:
        """The first image file (in sample order) whose stamp is not the one it had when it was read, as an
        ``InputError`` naming its sample and image; ``None`` when every one is as it was."""
        for c in range(len(self.files)):
            offsets, flat = self.table(c)
            i = first_changed(flat)
            if i is not None:
                local = int(np.searchsorted(offsets, i, side="right") - 1)
                sample = int(self.sample_starts[c]) + local
                path = flat.field("path")[i].as_py()
                what = "changed" if os.path.exists(path) else "removed"
                name = flat.field("name")[i].as_py()
                return self._changed(sample, i - int(offsets[local]), name, f"{what} while the run read it")
        return None

    def _changed(self, sample: int, k: int, name: str, what: str) -> InputError:
        error = self.locate(sample, "image", f"image {k} ({name}): {what}; nothing was written: run again "
                            "once the images are final")  # fmt: skip
        error.code = "input_changed"
        return error


def first_changed(flat: pa.StructArray) -> int | None:
    """The index of the first image of ``flat`` read from a file whose stamp (size, modification and change
    times, inode) is not the one it had when it was read, or that is gone; ``None`` if there is none."""
    paths = flat.field("path")
    if paths.null_count == len(paths):
        return None
    stamps = np.stack([np_view(flat.field(name).fill_null(-1)) for name in IMAGE_FILE_STAMP], axis=1)
    for i, path in enumerate(paths.to_pylist()):
        if path is None:
            continue
        try:
            st = os.stat(path)
        except OSError:
            return i
        if (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) != tuple(stamps[i].tolist()):
            return i
    return None


def read_chunk_images(file: Path) -> pa.LargeListArray:
    """A chunk's ``images`` column, memory-mapped from its ``IMAGE_FILE``."""
    with pa.memory_map(str(file)) as source:
        return pa.ipc.open_file(source).read_all().column(IMAGES).combine_chunks()


def vision_record(
    processor: dict, images: ChunkImages, input_images: int, plan: PackPlan, ranks: int
) -> dict:
    """The manifest's ``vision``: the processor's identity; ``input_images`` (the images of the samples
    encoded), ``packed_images`` and ``dropped_images`` (in samples the plan left out: too long, over
    ``max_packs``); ``images``: ``stats.image_stats`` of the packs in their written order, their spread
    over steps of ``ranks`` packs."""
    columns, _ = images.pack_columns(plan)
    n = plan.packed_sequence_size
    stats = image_stats(
        columns["image_length"], columns["image_sample_offsets"], np.full(plan.num_packs, n), ranks
    )
    packed = int(len(columns["image_length"]))
    return {
        "processor": processor,
        "input_images": input_images,
        "packed_images": packed,
        "dropped_images": input_images - packed,
        "images": stats,
    }
