"""WebDataset tar files of ``.npy`` members, byte by byte: parsed with ``tarfile`` and ``numpy.lib.format``.

A WebDataset *sample* is a run of adjacent members ``KEY.EXT`` with the same ``KEY``; packtool writes one
sample per pack. These functions read an archive held in memory (``bytes`` or an ``mmap``) without
extracting it: headers with ``tarfile.TarInfo.frombuf``, ``.npy`` headers with ``numpy.lib.format``, the
data as NumPy views, so a shard is read with one copy per member at most.

Which members a pack has is ``pack_members``: one ``.npy`` per column and a ``json`` of the pack's
metadata (``PACK_META``), except that a ``minimal`` pack's *small columns* (every column but the token
columns) and its metadata are the fields of one record, ``small_columns.npy`` (``record``,
``record_fields``, ``record_meta``): each tar member costs a 512-byte header and pads its data to 512
bytes, which one member per small column, and the ``json``, paid several times over.
"""

from __future__ import annotations

import functools
import io
import math
import os
import re
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.conventions import MAX_IMAGE_BYTES
from packtool.errors import InputError
from packtool.manifest import COLUMNS, Manifest, ShardEntry
from packtool.safepath import open_output_file

BLOCK = tarfile.BLOCKSIZE  # 512
RECORD = tarfile.RECORDSIZE  # 10240: tarfile pads the archive to a multiple of this
INDEX_SUFFIX = ".idx"  # packs-000000.tar -> packs-000000.tar.idx
KEY_DIGITS = 9


def pack_key(index: int) -> str:
    """The WebDataset key of global pack ``index``: digits only, so no dot can split it.

    >>> pack_key(123)
    '000000123'
    """
    return f"{index:0{KEY_DIGITS}d}"


def member_size(data_bytes: int) -> int:
    """Bytes a member of ``data_bytes`` takes in a tar: its header block and its data padded to blocks."""
    return BLOCK + -(-data_bytes // BLOCK) * BLOCK


def tarinfo(name: str, size: int) -> tarfile.TarInfo:
    """A member header with fixed metadata (mtime 0, uid/gid 0, mode 0444, no owner names), so a shard's
    bytes depend on its packs alone."""
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mtime = 0
    ti.mode = 0o444
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


# a vision-language pack's images: member KEY.img{k}.{ext}, the image's original bytes and extension, so that
# webdataset's and Energon's decoders pick their image decoder by the last extension
IMAGE_MEMBER = re.compile(r"img(\d+)\.([a-z0-9]+)")
IMAGE_EXTENSIONS = ("png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff")
IMAGE_MAGIC = ((b"\x89PNG", "png"), (b"\xff\xd8\xff", "jpg"), (b"GIF8", "gif"), (b"BM", "bmp"),
               (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"))  # fmt: skip


def image_member(k: int, path: str | None, data: bytes) -> str:
    """The extension of a pack's ``k``-th image member: ``img{k}.`` and the image's own extension (its
    name's, else the one its first bytes say; ``bin`` when neither is an image format's).

    >>> image_member(0, "pics/cat.JPG", b""), image_member(1, None, b"RIFF....WEBPVP8 ")
    ('img0.jpg', 'img1.webp')
    """
    ext = (path or "").rpartition(".")[2].lower() if "." in (path or "") else ""
    if ext not in IMAGE_EXTENSIONS:
        webp = data[:4] == b"RIFF" and data[8:12] == b"WEBP"
        ext = "webp" if webp else next((e for magic, e in IMAGE_MAGIC if data.startswith(magic)), "bin")
    return f"img{k}.{ext}"


META = "json"  # a full pack's metadata member
SMALL_COLUMNS = "small_columns.npy"  # a minimal pack's small columns and metadata: fields of one record
RUN_ID_BYTES = 16  # make_run_id's 16 hex digits: a fixed width, so a record's size follows from the plan
# a pack's metadata (what matches a shard to its manifest, and its counts): the keys of a full pack's
# .json member, and the first fields of a minimal pack's record, with their dtypes there
PACK_META = {
    "pack_index": np.dtype("<i8"),
    "num_tokens": np.dtype("<i8"),
    "num_samples": np.dtype("<i8"),
    "run_id": np.dtype(f"S{RUN_ID_BYTES}"),
    "shard": np.dtype("<i8"),
}


def pack_members(
    columns: Iterable[str], layout: str, compression: str = "none"
) -> dict[str, tuple[str, ...]]:
    """The members of a pack storing ``columns`` (in stored order) in ``layout`` (``full`` or ``minimal``),
    by extension, each with the columns it holds: ``NAME.npy`` holds column ``NAME``; a ``full`` pack has
    a ``json`` member too, its metadata (``PACK_META``). In the ``minimal`` layout only the token columns
    (``input_ids``, a stored ``labels``) are members of their own, and the others, the *small columns*,
    are the fields of ``small_columns.npy`` (``record``), after the pack's metadata: no ``json``. With a
    ``compression`` (``COMPRESSIONS``) every ``.npy`` member's name takes its suffix (the ``json``, under
    one tar block, never does).

    >>> pack_members(["input_ids", "seq_lens"], "full")
    {'input_ids.npy': ('input_ids',), 'seq_lens.npy': ('seq_lens',), 'json': ()}
    >>> pack_members(["input_ids", "seq_lens", "sample_index"], "minimal", "gzip")
    {'input_ids.npy.gz': ('input_ids',), 'small_columns.npy.gz': ('seq_lens', 'sample_index')}
    """
    columns = list(columns)
    z = COMPRESSIONS[compression]
    if layout != "minimal":
        return {**{f"{c}.npy{z}": (c,) for c in columns}, META: ()}
    small = tuple(c for c in columns if COLUMNS[c].per != "token")
    return {**{f"{c}.npy{z}": (c,) for c in columns if c not in small}, SMALL_COLUMNS + z: small}


# --- compressed members (--tar-compression) -------------------------------------------------------------
# how a pack's .npy members are stored -> the suffix their names take (KEY.input_ids.npy.gz): the readers of
# tar shards decompress a member by that suffix (webdataset's gzfilter, wids' default_decoder, Energon's
# SampleDecoder, which is webdataset's); none of them decompresses another (zstd, ...)
COMPRESSIONS = {"none": "", "gzip": ".gz"}
GZIP_LEVEL = 1  # zlib's fastest level (docs/performance.md compares the levels' bytes and time)
MAX_NPY_HEADER = 4096  # npy_view reads a .npy header from the first 4096 bytes of a member


def compression_suffix(compression: str, where: str) -> str:
    """The member-name suffix of ``compression`` (``COMPRESSIONS``); ``InputError`` naming ``where`` (the
    shard entry) for one this packtool does not read."""
    if not isinstance(compression, str) or compression not in COMPRESSIONS:
        raise InputError(
            f"{where}: tar members compressed with {compression!r}, which this packtool does not read "
            f"({', '.join(COMPRESSIONS)}): upgrade packtool"
        )
    return COMPRESSIONS[compression]


def compress(data: bytes, compression: str) -> bytes:
    """``data`` as a member of ``compression`` stores it: a gzip stream (no name, mtime 0: the same bytes
    every run) or as it is."""
    return zlib.compress(data, GZIP_LEVEL, wbits=31) if compression == "gzip" else data


def npy_limit(names: Iterable[str], n: int) -> int:
    """The most bytes a ``.npy`` member holding columns ``names`` can be in a pack of ``n`` tokens (a
    header, the pack's metadata, at most ``n`` values of a token column and ``2 n + 2`` of another): what
    a compressed member may decompress to, so a crafted one (a gzip bomb) cannot make a reader allocate
    more than a few times ``n`` bytes per member.

    >>> npy_limit(["input_ids"], 1024) == MAX_NPY_HEADER + 48 + 4 * (2 * 1024 + 2)
    True
    """
    meta = sum(dtype.itemsize for dtype in PACK_META.values())
    return MAX_NPY_HEADER + meta + sum(COLUMNS[c].dtype.itemsize * (2 * n + 2) for c in names)


def member_limit(ext: str, n: int) -> int:
    """The most bytes member ``KEY.ext`` (``input_ids.npy.gz``, ``small_columns.npy.gz``) can decompress to
    in a pack of ``n`` tokens (``npy_limit``): its column's, or for the record every column a record may
    hold (a record with a field too many is then reported as such, not as too large); a member of no
    column is held to the widest column's.

    >>> member_limit("input_ids.npy.gz", 1024) == npy_limit(["input_ids"], 1024)
    True
    """
    stored = stored_name(ext)
    if stored == SMALL_COLUMNS:
        return npy_limit([c for c, col in COLUMNS.items() if col.per != "token"], n)
    column = stored.removesuffix(".npy")
    return npy_limit([column if column in COLUMNS else "sample_index"], n)  # (int64: the widest dtype)


def decompress(path: Path, name: str, data, limit: int) -> bytes:
    """The bytes of member ``name``'s gzip stream ``data``, at most ``limit`` of them (``member_limit``).

    Raises ``InputError`` naming ``path`` and the member when it is not one whole gzip stream, or holds
    more than ``limit`` bytes (only ``limit + 1`` are ever allocated)."""
    stream = zlib.decompressobj(wbits=31)
    try:
        out = stream.decompress(data, limit + 1)
    except zlib.error as e:
        raise InputError(f"{path}: member {name} is not a gzip stream ({e})") from None
    if len(out) > limit or stream.unconsumed_tail:
        raise InputError(
            f"{path}: member {name} decompresses to over {limit:,} bytes, more than a pack holds"
        )
    if not stream.eof:
        raise InputError(f"{path}: member {name} is a truncated gzip stream")
    if stream.unused_data:
        raise InputError(f"{path}: member {name} has bytes after its gzip stream")
    return out


def decompress_head(path: Path, name: str, data, length: int) -> bytes:
    """The first ``length`` bytes (fewer if it holds fewer) of member ``name``'s gzip stream ``data``; the
    rest is never decompressed. ``InputError`` when it does not decompress."""
    try:
        return zlib.decompressobj(wbits=31).decompress(data, length)
    except zlib.error as e:
        raise InputError(f"{path}: member {name} is not a gzip stream ({e})") from None


def stored_bound(nbytes: int, compression: str) -> int:
    """The most bytes a member of ``nbytes`` can take once stored with ``compression``: zlib's
    ``compressBound`` and gzip's 18-byte header and trailer (incompressible data grows a little).

    >>> stored_bound(4096, "none"), stored_bound(4096, "gzip")
    (4096, 4128)
    """
    if compression == "none":
        return nbytes
    return nbytes + (nbytes >> 12) + (nbytes >> 14) + (nbytes >> 25) + 13 + 18


def npy_member(path: Path, name: str, buf, offset: int, size: int, n: int) -> np.ndarray:
    """The ``.npy`` member ``name`` (``KEY.EXT``) at ``buf[offset : offset + size]`` as an array: a
    read-only view into ``buf``, or, for a compressed member (``name`` ends ``.npy.gz``), into its bytes
    decompressed (at most ``member_limit`` for a pack of ``n`` tokens). ``InputError`` as ``npy_view`` and
    ``decompress`` raise it."""
    if name.endswith(".gz"):
        limit = member_limit(name.partition(".")[2], n)
        data = decompress(path, name, buf[offset : offset + size], limit)
        return npy_view(path, name, data, 0, len(data))
    return npy_view(path, name, buf, offset, size)


def stored_name(ext: str) -> str:
    """A member's extension without its compression suffix (``input_ids.npy.gz`` -> ``input_ids.npy``).

    >>> stored_name("input_ids.npy.gz"), stored_name("small_columns.npy")
    ('input_ids.npy', 'small_columns.npy')
    """
    for suffix in COMPRESSIONS.values():
        if suffix and ext.endswith(".npy" + suffix):
            return ext[: -len(suffix)]
    return ext


@functools.lru_cache(maxsize=4096)
def record_dtype(fields: tuple[tuple[str, int], ...]) -> np.dtype:
    """The dtype of a record: the pack's metadata (``PACK_META``: scalars), then a field per ``(column,
    length)``, a ``(length,)`` subarray of the column's dtype, packed in that order."""
    return np.dtype([*PACK_META.items(), *((name, COLUMNS[name].dtype, (n,)) for name, n in fields)])


def record(arrays: dict[str, np.ndarray], meta: dict[str, int | str]) -> np.ndarray:
    """The 0-d structured array (``shape ()``) whose fields are the pack's metadata ``meta`` (by
    ``PACK_META`` key; ``run_id`` ASCII, at most ``RUN_ID_BYTES``) and the columns ``arrays`` (1-D, by
    name): what ``small_columns.npy`` stores, and ``numpy.load`` gives back (``rec["seq_lens"]``,
    ``rec["run_id"]``, bytes)."""
    run_id = str(meta["run_id"]).encode("ascii")
    if len(run_id) > RUN_ID_BYTES:
        raise ValueError(f"run_id {meta['run_id']!r} is longer than {RUN_ID_BYTES} bytes")
    rec = np.zeros((), record_dtype(tuple((name, len(a)) for name, a in arrays.items())))
    for key in PACK_META:
        rec[key] = run_id if key == "run_id" else meta[key]
    for name, a in arrays.items():
        rec[name] = a
    return rec


def record_fields(path: Path, name: str, rec: np.ndarray) -> dict[str, np.ndarray]:
    """The fields of ``rec``, the record of member ``name``, by name: views, 0-d for the pack's metadata
    (``PACK_META``), 1-D for the columns.

    Raises ``InputError`` naming ``path`` and the member when it is not a record (a structured array of
    shape ``()``), or the fields that are not of their shape."""
    if rec.dtype.names is None or rec.shape != ():
        raise InputError(f"{path}: member {name} is not a record of columns (a structured .npy of shape ())")
    fields = {field: rec[field] for field in rec.dtype.names}
    meta = [f for f, a in fields.items() if f in PACK_META and a.ndim != 0]
    if meta:
        raise InputError(f"{path}: member {name} has field(s) {', '.join(meta)} that are not one value")
    flat = [f for f, a in fields.items() if f not in PACK_META and a.ndim != 1]
    if flat:
        raise InputError(f"{path}: member {name} has field(s) {', '.join(flat)} that are not 1-D arrays")
    return fields


def record_meta(fields: dict[str, np.ndarray]) -> tuple[dict[str, int | str], dict[str, str]]:
    """The pack's metadata among a record's ``fields`` (``record_fields``) as the ``.json`` member holds
    it (``run_id`` a str, the others ints), and for each field of another dtype than ``PACK_META``'s (left
    out of the first) what it is.

    >>> rec = record({"seq_lens": np.array([3, 1], np.int32)}, dict(pack_index=7, num_tokens=3,
    ...     num_samples=1, run_id="0123456789abcdef", shard=0))
    >>> record_meta({f: rec[f] for f in rec.dtype.names})
    ({'pack_index': 7, 'num_tokens': 3, 'num_samples': 1, 'run_id': '0123456789abcdef', 'shard': 0}, {})
    """
    meta: dict[str, int | str] = {}
    bad: dict[str, str] = {}
    for key, dtype in PACK_META.items():
        if key not in fields:
            continue
        value = fields[key]
        if value.dtype != dtype:
            bad[key] = f"a {value.dtype} value, expected {dtype}"
            continue
        if key != "run_id":
            meta[key] = int(value)
            continue
        try:
            meta[key] = value.item().decode("ascii")
        except UnicodeDecodeError:
            bad[key] = f"not ASCII ({value.item()!r})"
    return meta, bad


def npy_bytes(array: np.ndarray) -> bytes:
    """An array (1-D, or a ``record``) as a version 1 ``.npy`` file (no pickle)."""
    buf = io.BytesIO()
    array = array if array.flags.c_contiguous else array.copy(order="C")  # (ascontiguousarray makes 0-d 1-D)
    np.lib.format.write_array(buf, array, version=(1, 0), allow_pickle=False)
    return buf.getvalue()


@functools.lru_cache(maxsize=4096)
def npy_size(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of the ``.npy`` file ``npy_bytes`` writes for an array of ``shape`` and ``dtype`` (header
    included), without writing it.

    >>> npy_size((3,), np.dtype(np.int32)) == len(npy_bytes(np.zeros(3, np.int32)))
    True
    """
    buf = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(dtype)
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return len(buf.getvalue()) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def members(path: Path, buf) -> Iterator[tuple[str, int, int]]:
    """``(name, data offset, size)`` of every regular file of the archive in ``buf``, in order.

    Raises ``InputError`` naming ``path`` and the byte where the archive stops parsing (a damaged
    header, a member running past the end, an end inside a member).
    """
    pos, end = 0, len(buf)
    while pos + BLOCK <= end:
        header = bytes(buf[pos : pos + BLOCK])
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "strict")
        except tarfile.EOFHeaderError:  # the end-of-archive marker (a zero block)
            return
        except (tarfile.HeaderError, UnicodeDecodeError):
            raise InputError(f"{path}: bad tar header checksum at byte {pos}") from None
        if info.size < 0:  # GNU base-256 allows a negative size: the position would not advance
            raise InputError(f"{path}: bad tar header at byte {pos} (member {info.name}: size {info.size})")
        if pos + BLOCK + info.size > end:
            raise InputError(
                f"{path}: truncated tar archive (member {info.name} at byte {pos} runs past the end)"
            )
        if info.isreg():
            yield info.name, pos + BLOCK, info.size
        pos += member_size(info.size)
    if pos != end:
        raise InputError(f"{path}: truncated tar archive (ends inside the member at byte {pos})")


class _FileBytes:
    """An open file as ``tar.members`` reads an archive (``len`` and slices), each slice one ``os.pread``:
    its headers walked without reading its members' data."""

    def __init__(self, fd: int) -> None:
        self.fd, self.size = fd, os.fstat(fd).st_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, part: slice) -> bytes:
        return os.pread(self.fd, part.stop - part.start, part.start)


def refuse_oversized_members(path: Path, fd: int) -> None:
    """``InputError`` naming the first image member (``KEY.img{k}.{ext}``) of the tar open as ``fd`` over
    ``MAX_IMAGE_BYTES``, from the members' headers alone: before a vision-language shard is read into
    memory. A shard that does not parse is left to the reader (which says where)."""
    walk = members(path, _FileBytes(fd))
    while True:
        try:
            name, _, size = next(walk)
        except (StopIteration, InputError):  # the end, or a damaged header: the reader says where
            return
        if size > MAX_IMAGE_BYTES and IMAGE_MEMBER.fullmatch(name.partition(".")[2]):
            raise InputError(
                f"{path}: member {name} takes {size:,} bytes, over the {MAX_IMAGE_BYTES:,} an image may take"
            )


def samples(
    path: Path, buf, complete: set[str] | None = None
) -> Iterator[tuple[str, int, dict[str, tuple[int, int]], int]]:
    """The samples of the archive in ``buf`` as ``(key, header offset, {ext: (data offset, size)}, end
    offset)``: adjacent members with the same key, as WebDataset groups them (a repeated member is kept as
    ``"EXT (again)"``).

    Raises ``InputError`` where the archive does not parse, after yielding the samples before it. The
    sample being read when it fails is yielded first only if ``complete`` is given and the sample already
    holds every member of it (so the error belongs to the next one); else it is left out.
    """
    key, start, found, end = None, 0, {}, 0
    try:
        for member, offset, size in members(path, buf):
            k, _, ext = member.partition(".")
            if k != key:
                if key is not None:
                    yield key, start, found, end
                key, start, found = k, offset - BLOCK, {}
            found[ext if ext not in found else f"{ext} (again)"] = (offset, size)
            end = offset + -(-size // BLOCK) * BLOCK
    except InputError:
        if key is not None and complete is not None and complete <= found.keys():
            yield key, start, found, end
        raise
    if key is not None:
        yield key, start, found, end


def npy_header(path: Path, name: str, data) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data start)`` of the ``.npy`` file at the start of ``data`` (bytes or a view).

    Raises ``InputError`` naming ``path`` and member ``name`` if it is not a plain ``.npy`` header (version
    1 or 2, no pickle, no Fortran order, in the first ``MAX_NPY_HEADER`` bytes)."""
    header = io.BytesIO(bytes(data[:MAX_NPY_HEADER]))
    fmt = np.lib.format
    try:
        version = fmt.read_magic(header)
        read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"version {version}")
        shape, fortran, dtype = read(header)
    except ValueError as e:
        raise InputError(f"{path}: member {name} has a bad .npy header ({e})") from None
    if dtype.hasobject or fortran:
        raise InputError(f"{path}: member {name} is not a plain C-order .npy array of its size")
    return shape, dtype, header.tell()


def npy_view(path: Path, name: str, buf, offset: int, size: int) -> np.ndarray:
    """The ``.npy`` member at ``buf[offset : offset + size]`` as a read-only view into ``buf``.

    Raises ``InputError`` naming ``path`` and member ``name`` if it is not a plain ``.npy`` array of
    exactly ``size`` bytes (no pickle, no Fortran order).
    """
    shape, dtype, start = npy_header(path, name, buf[offset : offset + min(size, MAX_NPY_HEADER)])
    count = math.prod(shape)  # exact: np.prod of (2**32, 2**32) overflows int64 to 0
    # a shape NumPy cannot make even empty: (0, 2**62) holds no value, yet its strides overflow
    nonzero = math.prod(d for d in shape if d) * dtype.itemsize
    if start + count * dtype.itemsize != size or nonzero >= 1 << 63:
        raise InputError(f"{path}: member {name} is not a plain C-order .npy array of its size")
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset + start).reshape(shape)


def record_head(path: Path, name: str, data) -> dict[str, np.ndarray]:
    """The pack's metadata fields (``PACK_META``, those it has) of the record ``small_columns.npy`` whose
    first bytes (header and metadata: ``MAX_NPY_HEADER`` + 48 at most) are ``data``, by name, 0-d: the
    metadata without the columns after it, so a compressed record is decompressed that far only.

    Raises ``InputError`` as ``npy_header`` does, or when ``data`` ends before the metadata does."""
    shape, dtype, start = npy_header(path, name, data)
    if dtype.names is None or shape != ():
        raise InputError(f"{path}: member {name} is not a record of columns (a structured .npy of shape ())")
    present = [k for k in PACK_META if k in dtype.names]
    head = np.dtype(
        {
            "names": present,
            "formats": [dtype.fields[k][0] for k in present],
            "offsets": [dtype.fields[k][1] for k in present],
            "itemsize": max((dtype.fields[k][1] + dtype.fields[k][0].itemsize for k in present), default=0),
        }
    )
    if start + head.itemsize > len(data):
        raise InputError(f"{path}: member {name} ends before the pack's metadata does")
    rec = np.frombuffer(data, dtype=head, count=1, offset=start).reshape(())
    return {k: rec[k] for k in present}


def read_index(tar_path: str | Path) -> np.ndarray:
    """``(num_samples + 1,)`` uint64 byte offsets of the samples of ``tar_path`` (from its ``.tar.idx``:
    Megatron-Energon's layout, each sample's first header, then where the last one ends). For a file
    packtool wrote; one of an output being read goes through ``read_shard_index``."""
    return np.fromfile(str(tar_path) + INDEX_SUFFIX, dtype="<u8")


def read_shard_index(directory: str | Path, name: str, num_packs: int | None, tar_bytes: int) -> np.ndarray:
    """``(num_packs + 1,)`` int64: the offsets of the ``.tar.idx`` ``name`` of output ``directory`` (an
    untrusted file: opened by ``safepath.open_output_file``) for a tar of ``tar_bytes`` bytes holding
    ``num_packs`` packs (``None``: as many as it lists).

    Raises ``InputError`` naming the file, before any pack is read by it, when it does not hold ``num_packs
    + 1`` offsets of 8 bytes, or they do not rise from 0 to at most ``tar_bytes``: what a reader then reads
    of the tar (``offsets[k]`` to ``offsets[k + 1]``) lies inside it."""
    path = Path(directory) / name
    with open_output_file(directory, name) as f:
        size = os.fstat(f.fileno()).st_size
        want = size if num_packs is None else (num_packs + 1) * 8
        if size != want or size % 8 or size < 16:
            raise InputError(
                f"{path}: {size:,} bytes, where {num_packs} packs take {want:,} (8 per offset, one more "
                "than the packs): a stale or damaged index"
            )
        raw = np.frombuffer(f.read(size), dtype="<u8")
    if raw[0] != 0 or raw.max() > tar_bytes or np.any(raw[1:] < raw[:-1]):  # (uint64: none negative)
        raise InputError(
            f"{path}: its offsets do not rise from 0 inside the tar's {tar_bytes:,} bytes: a damaged index"
        )
    return raw.astype(np.int64)


@dataclass(frozen=True)
class TarFields:
    """A tar shard entry's own fields (``ShardEntry.fields``): ``index``, the name of its ``.tar.idx``
    (older manifests have none: the shard's name and ``.idx``), and ``compression``, how its ``.npy``
    members are stored (``COMPRESSIONS``; before format 6 none). Any other field there is not this
    format's and is left alone.

    >>> TarFields.of(ShardEntry("packs-000000.tar", 0, 1, 9, 10, "ab", fields={"new": 1})).index_name
    'packs-000000.tar.idx'
    """

    path: str
    index: str | None = None
    compression: str = "none"  # of the .npy members (COMPRESSIONS); format 6 on, absent before: none

    @classmethod
    def of(cls, entry: ShardEntry) -> TarFields:
        return cls(entry.path, entry.fields.get("index"), entry.fields.get("compression", "none"))

    @property
    def index_name(self) -> str:
        return self.index or self.path + INDEX_SUFFIX


def check_compression(entry: ShardEntry) -> str:
    """The compression of a shard entry's ``.npy`` members (``TarFields.compression``).

    Raises ``InputError`` in one line for one this packtool does not read (a newer packtool's)."""
    compression = TarFields.of(entry).compression
    compression_suffix(compression, f"shard {entry.path}, field 'compression'")
    return compression


def member_compression(manifest: Manifest) -> str:
    """The compression of an output's ``.npy`` members, for the files that name them (Energon's field map,
    the dataset card): its first shard's ``TarFields.compression``, none for one this packtool does not
    read (reading the shard refuses it)."""
    compression = TarFields.of(manifest.shards[0]).compression if manifest.shards else "none"
    return compression if isinstance(compression, str) and compression in COMPRESSIONS else "none"


def tar_index_name(entry: ShardEntry) -> str:
    """The ``.tar.idx`` file of a shard entry."""
    return TarFields.of(entry).index_name
