"""A path or a URL, read: open, stat, list and glob, the same calls for local disk and an object store.

Every reader of inputs opens and stats through here (``open_read``, ``stat``), so an ``s3://`` input is
read the way a local one is: seekable, in ranges (a JSON Lines range is one ranged GET), and told apart
from a changed one by its stamp. Local paths keep the local rules (regular files only: a FIFO would block,
a device never ends); in a store every object is a regular file and a prefix is a directory.

``Stat.stamp`` is what says a file is still the one read: the size, modification and change times and
the inode on disk; the size and the ETag (S3, Azure) or generation (GCS) in a store, else its
modification time.

>>> import tempfile, os
>>> d = tempfile.mkdtemp(); p = os.path.join(d, "a.txt"); _ = open(p, "w").write("hi")
>>> s = stat(p); (s.size, s.kind)
(2, 'file')
>>> open_read(p).read()
b'hi'
"""

from __future__ import annotations

import os
import stat as stat_module
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from packtool.errors import InputError
from packtool.storage.urls import filesystem, is_url, local_path, store_error

READ_BLOCK = 8 << 20  # bytes a remote file fetches at a time (a ranged GET), read ahead as it is read on


@dataclass(frozen=True)
class Stat:
    """What a file or an object is: ``size`` in bytes, ``kind`` (``file``, ``directory``, or what a
    local special file is: ``a FIFO``, ...), and ``stamp`` (a tuple: equal only for the same file)."""

    size: int
    kind: str
    stamp: tuple

    @property
    def is_file(self) -> bool:
        return self.kind == "file"


def stat(path: str | os.PathLike) -> Stat:
    """``Stat`` of a local path (symbolic links followed) or a URL; ``FileNotFoundError`` when there is
    none, a store's other failures as ``store_error``'s one line."""
    path = os.fspath(path)
    if not is_url(path):
        st = os.stat(local_path(path))
        kind = (
            "file"
            if stat_module.S_ISREG(st.st_mode)
            else ("directory" if stat_module.S_ISDIR(st.st_mode) else file_kind(st.st_mode))
        )
        return Stat(st.st_size, kind, (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    fs, inner = filesystem(path)
    try:
        info = fs.info(inner)
    except FileNotFoundError:
        raise
    except Exception as e:
        raise store_error(e, path) from None
    return remote_stat(info)


def remote_stat(info: dict) -> Stat:
    """``Stat`` of an object from its fsspec ``info`` record."""
    kind = "directory" if info.get("type") == "directory" else "file"
    size = int(info.get("size") or 0)
    tag = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("md5Hash")
    when = info.get("LastModified") or info.get("mtime") or info.get("last_modified") or info.get("updated")
    return Stat(size, kind, (size, str(tag if tag is not None else when)))


def exists(path: str | os.PathLike) -> bool:
    try:
        stat(path)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False


def is_dir(path: str | os.PathLike) -> bool:
    """A local directory (a link to one too), or a URL that is a prefix holding objects."""
    path = os.fspath(path)
    if not is_url(path):
        return os.path.isdir(local_path(path))
    fs, inner = filesystem(path)
    try:
        return bool(fs.isdir(inner))
    except Exception as e:
        raise store_error(e, path, "list") from None


def size(path: str | os.PathLike) -> int:
    return stat(path).size


def open_read(path: str | os.PathLike, block_size: int = READ_BLOCK) -> BinaryIO:
    """``path`` open for reading bytes, seekable. A URL reads ``block_size`` bytes ahead (one ranged
    request each); a missing object is ``FileNotFoundError``, as a missing file is."""
    path = os.fspath(path)
    if not is_url(path):
        return open(local_path(path), "rb")
    fs, inner = filesystem(path)
    try:
        return fs.open(inner, "rb", block_size=block_size, cache_type="readahead")
    except FileNotFoundError:
        raise
    except Exception as e:
        raise store_error(e, path) from None


def read_bytes(path: str | os.PathLike, limit: int) -> bytes:
    """The whole of a small file (a manifest, a config), ``InputError`` if it holds more than ``limit``
    bytes: what names it is untrusted, and reading it must not allocate without bound."""
    path = os.fspath(path)
    with open_read(path, block_size=min(limit + 1, READ_BLOCK)) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"larger than {limit:,} bytes: not a file packtool writes", source=path)
    return data


@dataclass(frozen=True)
class Listing:
    """What a prefix of a store holds, its sub-prefixes included: ``files`` (URLs, in tree order: sorted
    by their parts) with their ``stats``, and the ``hidden`` ones (a part starting with ``.``), relative to
    the prefix."""

    files: list[str]
    stats: dict[str, Stat]
    hidden: list[str]


def list_prefix(url: str) -> Listing:
    """Every object under the prefix ``url`` (a "directory" of a store), ``InputError`` if it cannot be
    listed. Objects whose name ends in ``/`` (folder markers some tools write) are not files."""
    fs, inner = filesystem(url)
    try:
        found = fs.find(inner, detail=True)
    except Exception as e:
        raise store_error(e, url, "list") from None
    root = inner.rstrip("/")
    base = url.rstrip("/")
    files, stats, hidden = [], {}, []
    for name, info in found.items():
        rel = name[len(root) :].lstrip("/")
        if not rel or name.endswith("/") or info.get("type") == "directory":
            continue
        if any(part.startswith(".") for part in rel.split("/")):
            hidden.append(rel)
            continue
        full = f"{base}/{rel}"
        files.append(full)
        stats[full] = remote_stat(info)
    files.sort(key=lambda u: u[len(base) :].split("/"))
    return Listing(files, stats, sorted(hidden))


def _listed(url: str, how: str) -> tuple[str, Any]:
    """``(scheme://, what fsspec's ``how`` call, ``glob`` or ``ls``, finds at url)``, with details; a
    store's failure as ``store_error``'s one line."""
    fs, inner = filesystem(url)
    try:
        found = getattr(fs, how)(inner, detail=True)
    except Exception as e:
        raise store_error(e, url, "list") from None
    return url[: url.index("://") + 3], found


def glob_urls(pattern: str) -> list[str]:
    """The objects a URL pattern matches (``*``, ``?``, ``[...]``, ``**`` for any depth), sorted."""
    proto, found = _listed(pattern, "glob")
    return sorted(proto + name for name, info in found.items() if info.get("type") != "directory")


def has_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def file_sizes(paths: list[str]) -> np.ndarray:
    """``(len(paths),)`` int64: each file's size; URLs from one listing per folder they are in, not one
    request per object."""
    out = np.empty(len(paths), dtype=np.int64)
    listed: dict[str, dict[str, int]] = {}
    for i, path in enumerate(paths):
        if not is_url(path):
            out[i] = os.path.getsize(local_path(path))
            continue
        folder = path.rpartition("/")[0]
        if folder not in listed:
            proto, entries = _listed(folder, "ls")
            listed[folder] = {proto + e["name"]: int(e.get("size") or 0) for e in entries}
        found = listed[folder].get(path)
        out[i] = found if found is not None else size(path)
    return out


_KINDS = {
    stat_module.S_IFIFO: "a FIFO",
    stat_module.S_IFCHR: "a character device",
    stat_module.S_IFBLK: "a block device",
    stat_module.S_IFSOCK: "a socket",
    stat_module.S_IFDIR: "a directory",
}


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words (``a FIFO``); ``a regular file`` for one."""
    if stat_module.S_ISREG(mode):
        return "a regular file"
    return _KINDS.get(stat_module.S_IFMT(mode), "not a regular file")
