"""An image file read as packtool reads its inputs, and what identifies its bytes (no Pillow needed).

``read_image_file(path)`` reads a regular file only (a FIFO or a device, also behind a symbolic link, is
refused without blocking on it), of at most ``conventions.MAX_IMAGE_BYTES``, to its end and no further,
and gives its ``FileStamp``: a run compares the stamp again before it commits, so an image replaced while
the run reads the images fails it instead of mixing old and new ones. ``image_digest`` is the XXH3-128 of
the bytes: the run's identity is made from it, and a file read again when its pack is written must give it
again.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import xxhash

from packtool.conventions import MAX_IMAGE_BYTES
from packtool.errors import InputError
from packtool.storage import files as storage_files
from packtool.storage.files import file_kind, read_bytes
from packtool.storage.urls import is_url


@dataclass(frozen=True)
class FileStamp:
    """What says an image file is the one that was read: its size, modification and change times, inode
    (a file rewritten at the same size with its modification time set back still changes its ctime)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    @classmethod
    def of_path(cls, path: str) -> FileStamp:
        """The stamp of a local file or of an object in a store (``FileNotFoundError`` if there is none):
        an object's is its size and its ETag (or generation), digested to fit the same four integers."""
        if not is_url(path):
            return cls.of(os.stat(path))
        size, tag = storage_files.stat(path).stamp
        digest = xxhash.xxh64_intdigest(str(tag).encode()) - (1 << 63)  # an int64, as the chunks keep it
        return cls(size, digest, 0, 0)


def read_image_file(path: str, name: str | None = None) -> tuple[bytes, FileStamp]:
    """The bytes of the image file ``path`` and its ``FileStamp``, read as packtool reads its inputs: a
    regular file only (a FIFO or a device, behind a symbolic link too, is refused without blocking on it),
    of at most ``MAX_IMAGE_BYTES``, read to its end and no further.

    Raises ``InputError`` naming ``name`` (default: the path), field ``image``.
    """
    where = name if name is not None else path
    if "\0" in path:  # (os.open raises ValueError for it)
        raise InputError(
            "its path holds a NUL byte, which no file name can", source=where, field="image",
            code="missing_image",
        )  # fmt: skip
    if is_url(path):
        return _read_image_object(path, where)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)  # O_NONBLOCK: opening a FIFO does not wait for a writer
    except OSError as e:
        raise InputError(
            f"cannot read image: {e.strerror or e}", source=where, field="image", code="missing_image"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(
                f"is {file_kind(st.st_mode)}, not a regular file",
                source=where,
                field="image",
                code="bad_image",
            )
        if st.st_size > MAX_IMAGE_BYTES:
            raise InputError(
                f"{st.st_size:,} bytes, over the {MAX_IMAGE_BYTES:,} an image may take",
                source=where, field="image", code="image_too_large",
            )  # fmt: skip
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left or os.read(fd, 1):  # shorter or longer than its size said: written while read
            raise InputError("changed while it was read", source=where, field="image", code="input_changed")
    except OSError as e:
        raise InputError(
            f"cannot read image: {e.strerror or e}", source=where, field="image", code="missing_image"
        ) from None
    finally:
        os.close(fd)
    return b"".join(chunks), FileStamp.of(st)


def _read_image_object(url: str, where: str) -> tuple[bytes, FileStamp]:
    """``read_image_file`` for an image object in a store: its stamp, then its bytes (at most
    ``MAX_IMAGE_BYTES``: refused from its size before any is read)."""
    try:
        stamp = FileStamp.of_path(url)
        if stamp.size > MAX_IMAGE_BYTES:
            raise InputError(
                f"{stamp.size:,} bytes, over the {MAX_IMAGE_BYTES:,} an image may take",
                source=where, field="image", code="image_too_large",
            )  # fmt: skip
        data = read_bytes(url, MAX_IMAGE_BYTES)
    except FileNotFoundError:
        raise InputError("cannot read image: no such object", source=where, field="image",
                         code="missing_image") from None  # fmt: skip
    except InputError as e:
        if e.field == "image":
            raise
        raise InputError(f"cannot read image: {e.reason}", source=where, field="image",
                         code="missing_image") from None  # fmt: skip
    except OSError as e:  # the object replaced while it was read (the store refuses the rest of it)
        raise InputError(
            f"cannot read image: {e}", source=where, field="image", code="input_changed"
        ) from None
    if len(data) != stamp.size:
        raise InputError("changed while it was read", source=where, field="image", code="input_changed")
    return data, stamp


def image_digest(data: bytes) -> bytes:
    """The 16-byte XXH3-128 digest of an image's bytes (what the run's identity and its checks use).

    >>> len(image_digest(b"\\x89PNG"))
    16
    """
    return xxhash.xxh3_128_digest(data)
