"""Compressed JSON Lines, JSON and text inputs (``.jsonl.gz``, ``.jsonl.zst``, ``.txt.bz2``, ...).

Corpora ship compressed. A file that starts with a codec's magic bytes (gzip, bz2, zstd, lz4 frames) is
read through pyarrow's decompressing stream (no extra dependency), whatever its name: ``changelog.gz``,
a ``.jsonl`` that is gzip inside. Which format it holds comes from its name with a codec suffix taken
off (``input_format``: ``a.jsonl.gz`` holds JSON Lines), or from ``--input-format``. Such a file cannot be
cut into byte ranges for the workers to read (a compressed stream has no seekable line offsets), so the
driver reads it line by line and hands the workers its records, as for a JSON array; a directory's text
files, one sample each, are decompressed by the worker that reads them.

>>> input_format("corpus/part-0001.jsonl.zst")
('.jsonl', 'zstd')
>>> input_format("notes.txt")
('.txt', None)
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO

import pyarrow as pa

from packtool.storage.files import open_read
from packtool.storage.urls import is_url

# a file's last suffix -> pyarrow's codec name
CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".lz4": "lz4"}
# the first bytes of a stream of each codec (lz4: the frame format, which pyarrow's "lz4" reads)
MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\x28\xb5\x2f\xfd": "zstd", b"\x04\x22\x4d\x18": "lz4"}


def input_format(path: str | os.PathLike) -> tuple[str, str | None]:
    """``(format suffix, codec)`` of ``path`` by its name: ``(".jsonl", "gzip")`` for ``a.jsonl.gz``,
    ``(".txt", None)`` for ``a.txt``."""
    stem, suffix = os.path.splitext(os.fspath(path))
    codec = CODECS.get(suffix.lower())
    if codec is None:
        return suffix, None
    return os.path.splitext(stem)[1], codec


def codec_of(path: str | os.PathLike) -> str | None:
    """The codec ``path``'s bytes start with (``MAGIC``), None for a plain file; by its name when it
    cannot be opened (the reader then names the error).

    >>> codec_of("no/such/file.txt.gz")
    'gzip'
    """
    try:
        with open_read(path, block_size=1 << 16) as f:
            head = f.read(4)
    except OSError:
        return input_format(path)[1]
    return next((codec for magic, codec in MAGIC.items() if head.startswith(magic)), None)


def is_compressed(path: str | os.PathLike) -> bool:
    return codec_of(path) is not None


def open_input(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading bytes, decompressed when its first bytes are a codec's; iterating it
    gives lines. A damaged stream raises ``OSError`` (pyarrow's ``ArrowInvalid`` is one) where it is
    found."""
    codec = codec_of(path)
    if codec is None:
        return open_read(path)
    source = open_read(path) if is_url(os.fspath(path)) else os.fspath(path)  # pyarrow opens a local one
    return io.BufferedReader(pa.input_stream(source, compression=codec), buffer_size=1 << 20)
