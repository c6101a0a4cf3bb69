"""Plain text -> ``SourceBatch`` stream with one column, ``text``.

A ``.txt`` file gives one sample per non-blank line; a directory of ``.txt`` files gives one sample per
file (see ``read_text_dir``). A UTF-8 byte order mark at the start of a file is dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch

_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark: not part of the text


def read_text_lines(
    path: str, batch_rows: int = 8192, text_field: str = "text", sink: ErrorSink | None = None
) -> Iterator[SourceBatch]:
    """One sample per non-blank line; line numbers are 1-based. A line that is not UTF-8 goes to ``sink``."""
    sink = sink or ErrorSink()
    texts: list[str] = []
    lines: list[int] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            raw = raw.rstrip(b"\r\n")
            if lineno == 1 and raw.startswith(_BOM):  # a UTF-8 byte order mark, as JSON Lines drop it
                raw = raw[len(_BOM) :]
            if not raw.strip():
                continue
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                sink.bad(
                    InputError(
                        f"not valid UTF-8 (byte {e.start})",
                        source=path,
                        row=lineno,
                        row_kind="line",
                        code="not_utf8",
                    )
                )
                continue
            lines.append(lineno)
            if len(texts) >= batch_rows:
                yield _batch(path, texts, lines, text_field, "line")
                texts, lines = [], []
    if texts:
        yield _batch(path, texts, lines, text_field, "line")


def read_text_dir(
    files: list[str],
    source: str,
    batch_rows: int = 1024,
    text_field: str = "text",
    sink: ErrorSink | None = None,
) -> Iterator[SourceBatch]:
    """One sample per file (sorted by name); the row is the file's index in that order."""
    sink = sink or ErrorSink()
    texts: list[str] = []
    rows: list[int] = []
    for i, file in enumerate(files):
        try:
            data = Path(file).read_bytes()
            texts.append((data[len(_BOM) :] if data.startswith(_BOM) else data).decode("utf-8"))
        except UnicodeDecodeError as e:
            sink.bad(InputError(f"not valid UTF-8 (byte {e.start})", source=file, code="not_utf8"))
            continue
        rows.append(i)
        if len(texts) >= batch_rows:
            yield _batch(source, texts, rows, text_field, "file")
            texts, rows = [], []
    if texts:
        yield _batch(source, texts, rows, text_field, "file")


def _batch(source: str, texts: list[str], rows: list[int], field: str, kind: str) -> SourceBatch:
    batch = pa.record_batch({field: pa.array(texts, type=pa.large_string())})
    return SourceBatch(source, batch, np.asarray(rows, dtype=np.int64), kind)
