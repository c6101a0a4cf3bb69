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
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.errors import InputError
from packtool.manifest import COLUMNS, ShardEntry

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


def pack_members(columns: Iterable[str], layout: str) -> dict[str, tuple[str, ...]]:
    """The members of a pack storing ``columns`` (in stored order) in ``layout`` (``full`` or ``minimal``),
    by extension, each with the columns it holds: ``NAME.npy`` holds column ``NAME``; a ``full`` pack has
    a ``json`` member too, its metadata (``PACK_META``). In the ``minimal`` layout only the token columns
    (``input_ids``, a stored ``labels``) are members of their own, and the others, the *small columns*,
    are the fields of ``small_columns.npy`` (``record``), after the pack's metadata: no ``json``.

    >>> pack_members(["input_ids", "seq_lens"], "full")
    {'input_ids.npy': ('input_ids',), 'seq_lens.npy': ('seq_lens',), 'json': ()}
    >>> pack_members(["input_ids", "seq_lens", "sample_index"], "minimal")
    {'input_ids.npy': ('input_ids',), 'small_columns.npy': ('seq_lens', 'sample_index')}
    """
    columns = list(columns)
    if layout != "minimal":
        return {**{f"{c}.npy": (c,) for c in columns}, META: ()}
    small = tuple(c for c in columns if COLUMNS[c].per != "token")
    return {**{f"{c}.npy": (c,) for c in columns if c not in small}, SMALL_COLUMNS: small}


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


def npy_view(path: Path, name: str, buf, offset: int, size: int) -> np.ndarray:
    """The ``.npy`` member at ``buf[offset : offset + size]`` as a read-only view into ``buf``.

    Raises ``InputError`` naming ``path`` and member ``name`` if it is not a plain ``.npy`` array of
    exactly ``size`` bytes (no pickle, no Fortran order).
    """
    header = io.BytesIO(bytes(buf[offset : offset + min(size, 4096)]))
    fmt = np.lib.format
    try:
        version = fmt.read_magic(header)
        read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"version {version}")
        shape, fortran, dtype = read(header)
    except ValueError as e:
        raise InputError(f"{path}: member {name} has a bad .npy header ({e})") from None
    count = math.prod(shape)  # exact: np.prod of (2**32, 2**32) overflows int64 to 0
    start = header.tell()
    if dtype.hasobject or fortran or start + count * dtype.itemsize != size:
        raise InputError(f"{path}: member {name} is not a plain C-order .npy array of its size")
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset + start).reshape(shape)


def read_index(tar_path: str | Path) -> np.ndarray:
    """``(num_samples + 1,)`` uint64 byte offsets of the samples of ``tar_path`` (from its ``.tar.idx``:
    Megatron-Energon's layout, each sample's first header, then where the last one ends)."""
    return np.fromfile(str(tar_path) + INDEX_SUFFIX, dtype="<u8")


@dataclass(frozen=True)
class TarFields:
    """A tar shard entry's own field (``ShardEntry.fields``): ``index``, the name of its ``.tar.idx``
    (older manifests have none: the shard's name and ``.idx``). Any other field there is not this
    format's and is left alone.

    >>> TarFields.of(ShardEntry("packs-000000.tar", 0, 1, 9, 10, "ab", fields={"new": 1})).index_name
    'packs-000000.tar.idx'
    """

    path: str
    index: str | None = None

    @classmethod
    def of(cls, entry: ShardEntry) -> TarFields:
        return cls(entry.path, entry.fields.get("index"))

    @property
    def index_name(self) -> str:
        return self.index or self.path + INDEX_SUFFIX


def tar_index_name(entry: ShardEntry) -> str:
    """The ``.tar.idx`` file of a shard entry."""
    return TarFields.of(entry).index_name
