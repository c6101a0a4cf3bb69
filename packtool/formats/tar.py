"""WebDataset tar files of ``.npy`` members, byte by byte: parsed with ``tarfile`` and ``numpy.lib.format``.

A WebDataset *sample* is a run of adjacent members ``KEY.EXT`` with the same ``KEY``; packtool writes one
sample per pack. These functions read an archive held in memory (``bytes`` or an ``mmap``) without
extracting it: headers with ``tarfile.TarInfo.frombuf``, ``.npy`` headers with ``numpy.lib.format``, the
data as NumPy views, so a shard is read with one copy per member at most.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from packtool.errors import InputError
from packtool.manifest import ShardEntry

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


def npy_bytes(array: np.ndarray) -> bytes:
    """A 1-D array as a version 1 ``.npy`` file (no pickle)."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


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
    count = int(np.prod(shape))
    start = header.tell()
    if dtype.hasobject or fortran or start + count * dtype.itemsize != size:
        raise InputError(f"{path}: member {name} is not a plain C-order .npy array of its size")
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset + start).reshape(shape)


def read_index(tar_path: str | Path) -> np.ndarray:
    """``(num_samples + 1,)`` uint64 byte offsets of the samples of ``tar_path`` (from its ``.tar.idx``:
    Megatron-Energon's layout, each sample's first header, then where the last one ends)."""
    return np.fromfile(str(tar_path) + INDEX_SUFFIX, dtype="<u8")


def tar_index_name(entry: ShardEntry) -> str:
    """The ``.tar.idx`` file of a shard entry (its ``index``; older manifests have none)."""
    return entry.index or entry.path + INDEX_SUFFIX
