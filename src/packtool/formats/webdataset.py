"""WebDataset tar shards ``packs-NNNNNN.tar``, their ``.tar.idx`` indexes, and the wids / Energon metadata.

Each pack is one WebDataset *sample*: the tar members ``KEY.EXT``, ``KEY`` the pack's global index as
nine digits (``000000123``), ``EXT`` each column the manifest's ``columns`` names (of
``packtool.manifest.PACK_COLUMNS``) as ``NAME.npy`` (version 1 ``.npy``, no pickle) plus ``json``:
``{"pack_index", "num_tokens", "num_samples", "run_id", "shard"}`` (``run_id``/``shard`` match a shard to
its manifest). In the ``minimal`` layout the small columns (all but ``input_ids`` and a stored ``labels``)
and the ``.json``'s keys are the fields of one member instead, ``small_columns.npy`` (``tar.pack_members``,
``tar.PACK_META``). A vision-language pack adds its image columns like the others and one member per image,
``KEY.img{k}.{ext}``: the image's original bytes and extension (``tar.image_member``); readers give them
as the ``images`` column with the member's name as ``path``. Members follow the
``webdataset.TarWriter`` conventions (USTAR, a sample's members adjacent and sorted by extension) and are
written by ``tarfile`` with fixed metadata, so a shard is byte-identical for every run and ``num_proc``.
With ``--tar-compression gzip`` every ``.npy`` member is a gzip stream named ``NAME.npy.gz``, which
webdataset, wids and Energon decompress by that suffix; readers here decompress each member to at most
what a pack can hold (``tar.member_limit``). The shard entry's ``compression`` field says which.

Beside each shard, ``packs-NNNNNN.tar.idx``: little-endian uint64 byte offsets of every pack's first
header, then the end of the last one (Megatron-Energon's layout). Once all shards are written, the
dataset-level index files are added (``packtool.formats.webdataset_index``: wids and Energon metadata), so
no ``energon prepare`` is needed. ``verify``'s checks of a shard are in ``webdataset_check``.

A tar shard is one read unit (the loader decodes it whole).
"""

from __future__ import annotations

import io
import json
import mmap
import os
import tarfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packtool.arrays import bytes_array, concat_ragged
from packtool.errors import ConfigError, InputError, PacktoolError
from packtool.fileio import written_whole
from packtool.formats import tar
from packtool.formats.base import (
    MAX_IMAGE_BYTES,
    FetchShard,
    ShardMeta,
    ShardMismatch,
    ShardReader,
    ShardWriter,
    UnitReader,
    output_root,
    refuse_oversized_images,
)
from packtool.formats.options import OutputOptions
from packtool.formats.tar import (
    BLOCK,
    IMAGE_MEMBER,
    INDEX_SUFFIX,
    META,
    RECORD,
    SMALL_COLUMNS,
    image_member,
    member_size,
    npy_bytes,
    npy_size,
    pack_key,
    pack_members,
    record,
    record_dtype,
    record_fields,
    record_meta,
    tar_index_name,
)
from packtool.formats.webdataset_index import write_dataset_index
from packtool.manifest import BASE_FORMAT_VERSION, COLUMNS, Column, Manifest, ShardEntry
from packtool.packing.plan import PackPlan
from packtool.packs import PackArrays
from packtool.safepath import open_output_file, output_file_problem
from packtool.schema import IMAGES, pieces_per_pack


def pack_json(pack_index: int, num_tokens: int, num_samples: int, run_id: str, shard: int) -> bytes:
    """The ``.json`` member of a pack (always under one tar block)."""
    return json.dumps(
        {
            "pack_index": int(pack_index),
            "num_tokens": int(num_tokens),
            "num_samples": int(num_samples),
            "run_id": str(run_id),
            "shard": int(shard),
        },
        separators=(",", ":"),
    ).encode()


def _member_npy_size(member: str, fields: tuple[tuple[str, int], ...]) -> int:
    """Bytes of the ``.npy`` member ``member`` holding columns of these ``(name, length)``."""
    if member == SMALL_COLUMNS:
        return npy_size((), record_dtype(fields))
    ((name, length),) = fields
    return npy_size((length,), COLUMNS[name].dtype)


def _lengths(col: Column, n: int, k: int, values: dict[str, np.ndarray]) -> np.ndarray:
    """``(k,)``: how many values column ``col`` holds in each of ``k`` packs of ``n`` tokens (``values``: the
    counts of the ragged kinds, by ``Column.per``)."""
    width = col.width(n)
    return np.full(k, width, dtype=np.int64) if width is not None else values[col.per]


def pack_tar_bytes(plan: PackPlan, columns: list[str], layout: str, compression: str = "none") -> np.ndarray:
    """``(num_packs,)`` int64: bytes each pack of ``plan`` takes in a tar shard storing ``columns`` in
    ``layout``, from the plan alone (to cut shards by ``shard_max_bytes`` before any token is written); with
    a ``compression``, the most it can take (``tar.stored_bound``: what gzip makes of it is known only
    once written)."""
    n, k = plan.packed_sequence_size, plan.num_packs
    counts = pieces_per_pack(plan.pack_offsets)
    values = {"segment": counts + (plan.pack_spans() < n), "piece": counts}  # per pack, by Column.per
    total = np.zeros(k, dtype=np.int64)
    for member, names in pack_members(columns, layout).items():
        if member == META:
            total += member_size(BLOCK - 1)  # under one block, as write_tar_shard asserts
            continue
        # (num_packs, columns of the member): how many values each column has in each pack
        lengths = np.stack([_lengths(COLUMNS[c], n, k, values) for c in names], axis=1)
        uniq, inv = np.unique(lengths, axis=0, return_inverse=True)
        sizes = [
            member_size(
                tar.stored_bound(
                    _member_npy_size(member, tuple(zip(names, u.tolist(), strict=True))), compression
                )
            )
            for u in uniq
        ]
        total += np.array(sizes, dtype=np.int64)[inv.reshape(-1)]
    return total


def shard_bounds(
    plan: PackPlan,
    shard_size: int,
    shard_max_bytes: int | None,
    columns: list[str],
    layout: str,
    compression: str = "none",
) -> list[tuple[int, int]]:
    """Pack ranges ``[(first, end), ...]`` of the tar shards: at most ``shard_size`` packs and, when
    ``shard_max_bytes`` is set, at most that many bytes per ``.tar`` file (end-of-archive blocks included;
    compressed members counted at their largest, ``pack_tar_bytes``).

    Raises ``ConfigError`` when one pack alone is larger than ``shard_max_bytes``.
    """
    k = plan.num_packs
    if shard_max_bytes is None:
        return [(a, min(a + shard_size, k)) for a in range(0, k, shard_size)]
    sizes = pack_tar_bytes(plan, columns, layout, compression)
    cum = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(sizes, out=cum[1:])
    # a shard of S bytes of members becomes ceil((S + 2 blocks) / RECORD) * RECORD bytes on disk
    budget = (shard_max_bytes // RECORD) * RECORD - 2 * BLOCK
    out, a = [], 0
    while a < k:
        by_bytes = int(np.searchsorted(cum, cum[a] + budget, side="right")) - 1
        b = min(a + shard_size, by_bytes, k)
        if b <= a:
            need = -(-(int(sizes[a]) + 2 * BLOCK) // RECORD) * RECORD
            raise ConfigError(
                f"shard_max_bytes {shard_max_bytes} is smaller than one pack's tar shard ({need} bytes)"
            )
        out.append((a, b))
        a = b
    return out


def write_tar_shard(
    path: str | Path,
    packs: PackArrays,
    *,
    first_pack: int,
    run_id: str,
    shard: int,
    layout: str,
    compression: str = "none",
) -> dict:
    """Write ``packs`` (the columns ``layout`` stores; ``.npy`` members stored with ``compression``,
    ``tar.COMPRESSIONS``) as the tar shard ``path`` and its ``path.idx`` (both through ``.tmp`` names and
    a rename); return the shard entry's own fields (``tar.TarFields``: ``{"index":
    "packs-NNNNNN.tar.idx", "compression": "none"}``)."""
    path = Path(path)
    refuse_oversized_images(packs.images)
    groups = pack_members(packs.present(), layout, compression)
    k = packs.num_packs
    num_samples = packs.pieces_per_pack()
    num_tokens = packs.real_tokens()  # neither the padding nor the pieces' context-parallel padding
    offsets = np.zeros(k + 1, dtype="<u8")
    index = path.with_name(path.name + INDEX_SUFFIX)
    with written_whole(path) as tmp, written_whole(index) as index_tmp:
        with open(tmp, "wb") as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as archive:
                for i in range(k):
                    offsets[i] = archive.offset
                    key = pack_key(first_pack + i)
                    meta = {
                        "pack_index": first_pack + i,
                        "num_tokens": int(num_tokens[i]),
                        "num_samples": int(num_samples[i]),
                        "run_id": run_id,
                        "shard": shard,
                    }
                    members = {}
                    for ext, names in groups.items():
                        arrays = {name: packs.row(name, i) for name in names}
                        if ext == META:
                            members[ext] = pack_json(**meta)
                            assert len(members[ext]) < BLOCK, meta  # pack_tar_bytes counts one block for it
                        elif tar.stored_name(ext) == SMALL_COLUMNS:
                            members[ext] = tar.compress(npy_bytes(record(arrays, meta)), compression)
                        else:
                            members[ext] = tar.compress(npy_bytes(arrays[names[0]]), compression)
                    if (
                        packs.images is not None
                    ):  # KEY.img{k}.{ext}: each image's bytes as read, never compressed
                        a, b = packs.image_sample_offsets[i], packs.image_sample_offsets[i + 1]
                        for m, image in enumerate(packs.images.slice(a, b - a).to_pylist()):
                            members[image_member(m, image["path"], image["bytes"])] = image["bytes"]
                    for ext in sorted(members):  # webdataset.TarWriter's order
                        data = members[ext]
                        archive.addfile(tar.tarinfo(f"{key}.{ext}", len(data)), io.BytesIO(data))
                offsets[k] = archive.offset
        index_tmp.write_bytes(offsets.tobytes())
    return {"index": index.name, "compression": compression}


# --- reading -------------------------------------------------------------------------------------------
def pack_meta(path: Path, key: str, found: dict[str, tuple[int, int]], buf) -> dict | None:
    """The metadata of pack ``key`` (its members ``{ext: (data offset, size)}`` in ``buf``): its ``.json``
    member (``full``), or the ``PACK_META`` fields of its ``small_columns.npy`` record (``minimal``; of a
    compressed one, ``small_columns.npy.gz``, only its first bytes are decompressed); None when it has
    neither.

    Raises ``InputError`` naming the member when the ``.json`` is not a JSON object, the record does not
    parse or one of its metadata fields is not of its dtype."""
    if META in found:
        offset, size = found[META]
        try:
            meta = json.loads(bytes(buf[offset : offset + size]))
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            raise InputError(f"{path}: member {key}.{META} is not a JSON object")
        return meta
    ext = next((e for e in found if tar.stored_name(e) == SMALL_COLUMNS), None)
    if ext is None:
        return None
    name = f"{key}.{ext}"
    offset, size = found[ext]
    if ext == SMALL_COLUMNS:
        fields = record_fields(path, name, tar.npy_view(path, name, buf, offset, size))
    else:
        head = tar.decompress_head(path, name, buf[offset : offset + size], tar.MAX_NPY_HEADER + 64)
        fields = tar.record_head(path, name, head)
    meta, bad = record_meta(fields)
    if bad:
        field, what = next(iter(bad.items()))
        raise InputError(f"{path}: member {name} has a field {field} that is {what}")
    return meta


def _check_run_id(path: Path, meta: dict | None, run_id: str, first: int | None) -> None:
    """Refuse a shard whose first pack's metadata names another run than ``run_id`` (the manifest's), or
    another first pack than global pack ``first`` (a shard list duplicated or reordered in the manifest).
    Its ``shard`` number is ``verify``'s to check: other tools may rewrite a pack's ``.json``, its
    ``pack_index`` and ``run_id`` kept."""
    found = None if meta is None else meta.get("run_id")
    if found is not None and found != run_id:
        raise InputError(f"{path}: shard of run {found}, the manifest is run {run_id}")
    if meta is None or found is None:  # before format_version 2: nothing to match
        return
    if first is not None and meta.get("pack_index") != first:
        raise InputError(
            f"{path}: the shard's first pack is pack {meta.get('pack_index')}, the manifest's {first}"
        )


def _stored_columns(
    path: Path, key: str, found: dict[str, tuple[int, int]], buf, columns, n: int
) -> dict[str, np.ndarray]:
    """The stored columns of pack ``key`` named in ``columns`` (its members ``{ext: (data offset, size)}``
    in ``buf``: ``NAME.npy``, and the fields of ``small_columns.npy``; ``.npy.gz`` decompressed to at most
    what a pack of ``n`` tokens holds), as array copies by name (``buf`` may close after)."""
    out = {}
    if IMAGES in columns:
        out[IMAGES] = image_members(path, key, found, buf)
    for ext, (offset, size) in found.items():
        stored = tar.stored_name(ext)
        name = f"{key}.{ext}"
        if stored == SMALL_COLUMNS:
            fields = record_fields(path, name, tar.npy_member(path, name, buf, offset, size, n))
            out.update({c: a.copy() for c, a in fields.items() if c in columns})
        elif stored.endswith(".npy") and (column := stored[: -len(".npy")]) in columns:
            out[column] = tar.npy_member(path, name, buf, offset, size, n).copy()
    return out


def image_members(path: Path, key: str, found: dict[str, tuple[int, int]], buf) -> list[tuple[str, bytes]]:
    """A vision-language pack's image members ``KEY.img{k}.{ext}`` (of ``found``, its members ``{ext:
    (data offset, size)}`` in ``buf``, of the tar ``path``) in image order: ``(member name, bytes)``;
    ``InputError`` for one over ``MAX_IMAGE_BYTES``, before any is copied."""
    images = sorted((int(m[1]), ext) for ext in found if (m := IMAGE_MEMBER.fullmatch(ext)))
    over = next((ext for _, ext in images if found[ext][1] > MAX_IMAGE_BYTES), None)
    if over is not None:  # checked before its bytes are copied
        raise InputError(
            f"{path}: member {key}.{over} takes {found[over][1]:,} bytes, over the {MAX_IMAGE_BYTES:,} an "
            "image may take"
        )
    return [(f"{key}.{ext}", bytes(buf[found[ext][0] : sum(found[ext])])) for _, ext in images]


def images_array(images: list[tuple[str, bytes]]) -> pa.StructArray:
    """``(member name, bytes)`` of images as the ``images`` column's values (``struct<bytes, path>``)."""
    return pa.StructArray.from_arrays(
        [bytes_array([b for _, b in images], pa.binary()), bytes_array([m for m, _ in images], pa.string())],
        names=["bytes", "path"],
    )


def stack_packs(packs: list[dict[str, np.ndarray]], n: int) -> PackArrays:
    """Pack dicts of one shard (consecutive; stored columns by name) as ``PackArrays`` of packs of ``n``
    tokens; ``ValueError`` as ``PackArrays.from_parts`` raises it."""
    names = [name for name in (packs[0] if packs else ()) if name != IMAGES]
    parts = {name: concat_ragged([p[name] for p in packs], COLUMNS[name].dtype) for name in names}
    out = PackArrays.from_parts(parts, n)
    if packs and IMAGES in packs[0]:  # (member name, bytes) per image: as the images column holds them
        counts = [len(p[IMAGES]) for p in packs]
        if out.image_sample_offsets is not None and np.diff(out.image_sample_offsets).tolist() != counts:
            raise ValueError("a pack's image members are not one per image_* value")
        out.images = images_array([image for p in packs for image in p[IMAGES]])
        out.image_sample_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return out


def read_tar_packs(
    path: Path,
    n: int,
    columns: Iterable[str],
    run_id: str | None = None,
    crc32: int | None = None,
    first_pack: int | None = None,
    directory: Path | None = None,
) -> list[dict]:
    """The packs of one tar shard in order, as dicts of the ``columns`` asked for.

    The shard is memory-mapped; each column read becomes one array copy. With ``run_id``, a shard whose
    first pack's metadata (``pack_meta``) names another run raises ``InputError``; with ``crc32``, a shard
    whose bytes have another CRC-32 (a damaged or replaced file) raises ``ShardMismatch`` before any pack
    is parsed; with ``first_pack`` (the global index of its first pack in the manifest), so does a shard
    whose first pack says another. ``path`` is opened as a file of output ``directory`` (its folder by
    default: ``safepath.open_output_file``): a FIFO or a link out put in its place is ``InputError``.
    """
    columns = set(columns)
    out = []
    directory = path.parent if directory is None else directory
    with open_output_file(directory, path.relative_to(directory).as_posix()) as f:
        if os.fstat(f.fileno()).st_size == 0:
            return []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if crc32 is not None and (found := zlib.crc32(buf)) != crc32:
                raise ShardMismatch(
                    f"checksum mismatch (CRC-32 {found:08x}, written {crc32:08x}): the shard's bytes changed "
                    "since it was written"
                )
            for key, _start, found, _end in tar.samples(path, buf):
                if run_id is not None:
                    _check_run_id(path, pack_meta(path, key, found, buf), run_id, first_pack)
                    run_id = None  # the first pack's is enough: a shard is written by one run
                pack = _stored_columns(path, key, found, buf, columns, n)
                missing = [c for c in columns if c not in pack]
                if missing:
                    raise InputError(f"{path}: pack {key} stores no {', '.join(missing)}")
                if "input_ids" in pack and pack["input_ids"].shape != (n,):
                    shape = pack["input_ids"].shape
                    raise InputError(f"{path}: pack {key} has input_ids of shape {shape}, expected ({n},)")
                out.append(pack)
    return out


CRC32_VERSION = 3  # the format_version from which shard entries carry the file's crc32
COMPRESSED_FORMAT_VERSION = 6  # the format_version from which .npy members may be compressed


class TarUnitReader(UnitReader):
    """Whole tar shards of an output (a shard is one unit)."""

    def __init__(self, directory: Path, manifest: Manifest, verify_checksums: bool = True) -> None:
        self.directory, self.manifest, self.verify_checksums = Path(directory), manifest, verify_checksums

    def read_stored(self, shard: int, part: int, columns: list[str]) -> PackArrays:
        entry = self.manifest.shards[shard]
        m = self.manifest
        crc = entry.crc32 if self.verify_checksums else None
        if crc is None and self.verify_checksums and m.format_version >= CRC32_VERSION:
            raise ShardMismatch(
                f"the manifest records no crc32 for it, which format_version {m.format_version} writes "
                "(an edited manifest)"
            )
        first = sum(e.num_packs for e in m.shards[:shard])
        tar.check_compression(entry)  # one this packtool does not read is refused before any byte is read
        path = self.directory / entry.path
        packs = read_tar_packs(path, m.packed_sequence_size, columns, m.run_id, crc, first, self.directory)
        if len(packs) != entry.num_packs:
            raise ShardMismatch(f"{len(packs)} packs, the manifest says {entry.num_packs}")
        return stack_packs(packs, m.packed_sequence_size)


class TarWriter(ShardWriter):
    """Writes ``packs-NNNNNN.tar`` (WebDataset: one sample a pack) with its ``.tar.idx``, cut at
    ``shard_size`` packs or ``shard_max_bytes``, and the dataset-level index files (``webdataset_index``)."""

    suffix = ".tar"

    def shard_ranges(
        self, plan: PackPlan, options: OutputOptions, columns: list[str]
    ) -> list[tuple[int, int]]:
        wds = options.webdataset
        return shard_bounds(
            plan, options.shard_size, wds.shard_max_bytes, columns, options.columns, wds.tar_compression
        )

    def write(
        self, path: Path, blocks: Iterable[PackArrays], meta: ShardMeta, options: OutputOptions
    ) -> dict:
        (packs,) = list(blocks)  # block_packs is None: the whole shard in one block
        return write_tar_shard(
            path,
            packs,
            first_pack=meta.first_pack,
            run_id=meta.run_id,
            shard=meta.shard,
            layout=options.columns,
            compression=options.webdataset.tar_compression,
        )

    def format_major(self, fields: dict) -> int:
        """6 for compressed members (a 5.x reader looks for ``NAME.npy``, finds ``NAME.npy.gz``), else 5."""
        return (
            COMPRESSED_FORMAT_VERSION if fields.get("compression", "none") != "none" else BASE_FORMAT_VERSION
        )

    def write_dataset_index(
        self, directory: Path, manifest: Manifest, options: OutputOptions, fetch_shard: FetchShard = None
    ) -> list[str]:
        energon = options.webdataset.energon_index
        return write_dataset_index(directory, manifest, energon=energon, fetch_shard=fetch_shard)


class TarReader(ShardReader):
    """Reads tar shards: a shard is one read unit; a pack alone through its ``.tar.idx``."""

    def units(self, entry: ShardEntry) -> list[int]:
        return [entry.num_packs]

    def open_reader(
        self, directory: Path, manifest: Manifest, verify_checksums: bool = True
    ) -> TarUnitReader:
        return TarUnitReader(directory, manifest, verify_checksums)

    def read_stored_pack(
        self, path: Path, entry: ShardEntry, row: int, manifest: Manifest
    ) -> PackArrays | None:
        """Pack ``row`` read alone through the shard's ``.tar.idx`` (only that pack's bytes). The index is
        untrusted: one that is not the shard's (``tar.read_shard_index``) raises ``InputError`` naming it."""
        directory = output_root(path, entry)
        if output_file_problem(directory, tar_index_name(entry)) == "missing":
            return None  # read in order
        with open_output_file(directory, entry.path) as f:
            size = os.fstat(f.fileno()).st_size
            offsets = tar.read_shard_index(directory, tar_index_name(entry), entry.num_packs, size)
            if not 0 <= row < len(offsets) - 1:
                return None
            start, end = int(offsets[row]), int(offsets[row + 1])
            f.seek(start)
            data = f.read(end - start)
        if len(data) != end - start:
            return None
        try:
            groups = list(tar.samples(path, data))
            if len(groups) != 1:
                return None
            key, _, found, _ = groups[0]
            pack = _stored_columns(path, key, found, data, [*COLUMNS, IMAGES], manifest.packed_sequence_size)
        except PacktoolError:  # a damaged member: reading in order says so, as for any format
            return None
        n = manifest.packed_sequence_size
        stored = [*manifest.columns, *(manifest.image_columns or ())]
        if any(c not in pack for c in stored) or pack["input_ids"].shape != (n,):
            return None
        try:
            return stack_packs([{c: pack[c] for c in stored}], n)
        except ValueError:
            return None

    def summary(self, path: Path) -> dict[str, Any]:
        """run_id, shard number, first pack and pack count from the ``.tar.idx`` and the metadata
        (``pack_meta``) of the shard's first and last packs (two small reads, whatever the shard's size)."""
        with open_output_file(path.parent, path.name) as f:
            size = os.fstat(f.fileno()).st_size
            offsets = tar.read_shard_index(path.parent, path.name + INDEX_SUFFIX, None, size)
            if size != -(-(int(offsets[-1]) + 2 * BLOCK) // RECORD) * RECORD:
                raise InputError(
                    f"{path.name}{INDEX_SUFFIX} does not end where the tar's {size:,} bytes do (stale index?)"
                )
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        with buf:
            first = _pack_meta(path, buf, int(offsets[0]), int(offsets[1]))
            last = _pack_meta(path, buf, int(offsets[-2]), int(offsets[-1]))
        # a shard written before format_version 2 has no run_id or shard to compare (verify says so)
        return {
            **{key: first[key] for key in ("run_id", "shard") if key in first},
            "first_pack": first.get("pack_index"),
            "num_packs": last["pack_index"] - first["pack_index"] + 1,
        }

    def index_files(self, entry: ShardEntry) -> list[str]:
        return [tar_index_name(entry)]

    def entry_fields(self, entry: ShardEntry) -> tar.TarFields:
        return tar.TarFields.of(entry)


def _pack_meta(path: Path, buf, start: int, end: int) -> dict:
    """The metadata (``pack_meta``) of the pack at ``buf[start:end]`` (offsets from the ``.tar.idx``)."""
    chunk = bytes(buf[start:end])  # one pack: a few times N bytes
    groups = list(tar.samples(path, chunk))
    meta = None
    if len(groups) == 1:
        key, _, found, _ = groups[0]
        meta = pack_meta(path, key, found, chunk)
    if meta is None:
        raise InputError(
            f"{path}: no pack metadata ({META}, {SMALL_COLUMNS}) between bytes {start} and {end}"
        )
    return meta
