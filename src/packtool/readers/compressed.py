"""Compressed JSON Lines, JSON and text inputs (``.jsonl.gz``, ``.jsonl.zst``, ``.txt.bz2``, ...).

Corpora ship compressed. A file whose last suffix names a codec is read through pyarrow's decompressing
stream (gzip, bz2, zstd, lz4: no extra dependency), as the format its inner suffix names. Such a file
cannot be cut into byte ranges for the workers to read (a compressed stream has no seekable line
offsets), so the driver reads it line by line and hands the workers its records, as for a JSON array.

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

# a file's last suffix -> pyarrow's codec name
CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".lz4": "lz4"}


def input_format(path: str | os.PathLike) -> tuple[str, str | None]:
    """``(format suffix, codec)`` of ``path``: ``(".jsonl", "gzip")`` for ``a.jsonl.gz``,
    ``(".txt", None)`` for ``a.txt``."""
    stem, suffix = os.path.splitext(os.fspath(path))
    codec = CODECS.get(suffix.lower())
    if codec is None:
        return suffix, None
    return os.path.splitext(stem)[1], codec


def is_compressed(path: str | os.PathLike) -> bool:
    return input_format(path)[1] is not None


def open_input(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading bytes, decompressed when its suffix names a codec; iterating it gives
    lines. A damaged stream raises ``OSError`` (pyarrow's ``ArrowInvalid`` is one) where it is found."""
    codec = input_format(path)[1]
    if codec is None:
        return open(path, "rb")
    return io.BufferedReader(pa.input_stream(os.fspath(path), compression=codec), buffer_size=1 << 20)
