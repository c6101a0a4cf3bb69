"""Plain text -> ``SourceBatch`` stream with one column, ``text``.

A ``.txt`` file gives one sample per non-blank line; a directory of text files gives one sample per
file (see ``read_text_dir``), each decompressed if it is compressed. A UTF-8 byte order mark at the
start of a file is dropped; a text that is not UTF-8 is read by the ``decode`` policy (``readers.decode``:
``strict``, ``replace`` or an encoding).

**Lazy.** With ``lazy=True`` (what ``packtool pack`` uses) nothing is decoded here: a ``.txt`` file is
scanned for newlines and yielded as ``TextLines`` (line ranges), a directory as ``TextFiles`` (its file
names); the process that encodes a range reads and decodes it (``load(sink)``), with the same records,
line numbers and errors as the whole-file reader. Ranges and batches hold at most ``PIECE_BYTES`` of
input (or one line or file, if longer), so long documents are handed out a few MiB at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch
from packtool.readers.compressed import is_compressed, open_input
from packtool.readers.decode import read_text
from packtool.readers.lines import PIECE_BYTES, line_ranges, read_span, split_lines
from packtool.storage.files import file_sizes

_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark: not part of the text


def read_text_lines(
    path: str,
    batch_rows: int = 8192,
    text_field: str = "text",
    sink: ErrorSink | None = None,
    lazy: bool = False,
    decode: str = "strict",
) -> Iterator[SourceBatch | TextLines]:
    """One sample per non-blank line; line numbers are 1-based. A line that is not UTF-8 is read by the
    ``decode`` policy (or goes to ``sink``). Batches of at most ``batch_rows`` lines and ``PIECE_BYTES``
    bytes (or one longer line).

    With ``lazy``, such ranges (``TextLines``) from one scan for newlines, read later."""
    if lazy and not is_compressed(path):  # a compressed file has no byte ranges: read here
        for first_line, starts in line_ranges(path, batch_rows):
            yield TextLines(path, first_line, starts, text_field, decode=decode)
        return
    with open_input(path) as f:
        numbered = enumerate(f, start=1)
        yield from _parse_lines(path, numbered, batch_rows, text_field, sink or ErrorSink(), decode)


def _parse_lines(
    path: str,
    numbered: Iterable[tuple[int, bytes]],
    batch_rows: int,
    text_field: str,
    sink: ErrorSink,
    decode: str = "strict",
) -> Iterator[SourceBatch]:
    """``(line number, raw line)`` pairs -> batches of the non-blank lines' texts; bad ones go to ``sink``."""
    raws: list[bytes] = []
    lines: list[int] = []
    size = 0
    for lineno, raw in numbered:
        raw = raw.rstrip(b"\r\n")
        if lineno == 1 and raw.startswith(_BOM):  # a UTF-8 byte order mark, as JSON Lines drop it
            raw = raw[len(_BOM) :]
        if not raw.strip():
            continue
        raws.append(raw)
        lines.append(lineno)
        size += len(raw)
        if len(raws) >= batch_rows or size >= PIECE_BYTES:
            yield from _texts(path, raws, lines, text_field, "line", sink, decode=decode)
            raws, lines, size = [], [], 0
    if raws:
        yield from _texts(path, raws, lines, text_field, "line", sink, decode=decode)


def _schema(text_field: str) -> pa.Schema:
    return pa.schema([pa.field(text_field, pa.large_string())])


@dataclass
class TextLines:
    """Lines ``first_line .. first_line + num_rows - 1`` (1-based) of the ``.txt`` file ``source``, not read
    yet: ``line_starts`` holds each line's byte offset, then where the last one ends.

    It stands for a ``SourceBatch`` until ``load(sink)`` reads it (``num_rows`` counts lines, blank ones
    included); pickling it costs 8 bytes a line whatever the lines hold, so a worker reads its own.
    ``decode``: what a line that is not UTF-8 is read as (``readers.decode``).
    """

    source: str
    first_line: int
    line_starts: np.ndarray  # (num_rows + 1,) int64
    text_field: str = "text"
    row_kind: str = "line"
    decode: str = "strict"

    @property
    def num_rows(self) -> int:
        return len(self.line_starts) - 1

    @property
    def schema(self) -> pa.Schema:
        return _schema(self.text_field)

    def slice(self, offset: int, length: int) -> TextLines:
        length = min(length, self.num_rows - offset)
        starts = self.line_starts[offset : offset + length + 1]
        return TextLines(self.source, self.first_line + offset, starts, self.text_field, decode=self.decode)

    def load(self, sink: ErrorSink | None = None) -> list[SourceBatch]:
        """The non-blank lines' texts, as ``read_text_lines`` gives them (same line numbers, same errors)."""
        data = read_span(self.source, int(self.line_starts[0]), int(self.line_starts[-1]), self.first_line)
        numbered = enumerate(split_lines(data), start=self.first_line)
        rows, sink = max(self.num_rows, 1), sink or ErrorSink()
        return list(_parse_lines(self.source, numbered, rows, self.text_field, sink, self.decode))


def read_text_dir(
    files: list[str],
    source: str,
    batch_rows: int = 1024,
    text_field: str = "text",
    sink: ErrorSink | None = None,
    lazy: bool = False,
    decode: str = "strict",
) -> Iterator[SourceBatch | TextFiles]:
    """One sample per file, in the order of ``files`` (the directory's, sorted); the row is the file's
    index in that order; a file that is not UTF-8 is read by the ``decode`` policy. Ranges of at most
    ``batch_rows`` files and ``PIECE_BYTES`` bytes on disk (or one larger file).

    With ``lazy``, those ranges (``TextFiles``), read later."""
    sizes = file_sizes(files)
    ends = np.cumsum(sizes)
    start = 0
    while start < len(files):
        before = int(ends[start - 1]) if start else 0
        within = int(np.searchsorted(ends, before + PIECE_BYTES, side="right"))
        stop = max(start + 1, min(start + batch_rows, within))
        part = TextFiles(source, files[start:stop], start, text_field, sizes=sizes[start:stop], decode=decode)
        if lazy:
            yield part
        else:
            yield from part.load(sink)
        start = stop


@dataclass
class TextFiles:
    """Files ``first_row ..`` (their indices in the directory's sorted list) of the directory ``source``,
    one sample each, not read yet; ``load(sink)`` reads them (decompressing a compressed one).
    ``sizes``: ``(num_rows,)`` int64, each file's bytes on disk; ``decode``: what a file that is not UTF-8
    is read as (``readers.decode``)."""

    source: str
    files: list[str]
    first_row: int
    text_field: str = "text"
    row_kind: str = "file"
    sizes: np.ndarray | None = None
    decode: str = "strict"

    def __post_init__(self) -> None:
        if self.sizes is None:
            self.sizes = file_sizes(self.files)

    @property
    def num_rows(self) -> int:
        return len(self.files)

    @property
    def schema(self) -> pa.Schema:
        return _schema(self.text_field)

    def slice(self, offset: int, length: int) -> TextFiles:
        end = offset + length
        return TextFiles(
            self.source, self.files[offset:end], self.first_row + offset, self.text_field,
            sizes=self.sizes[offset:end], decode=self.decode,
        )  # fmt: skip

    def load(self, sink: ErrorSink | None = None) -> list[SourceBatch]:
        """The files' texts (a file that is not UTF-8 is read by ``decode``, or goes to ``sink``)."""
        raws: list[bytes] = []
        for file in self.files:
            try:
                with open_input(file) as f:
                    data = f.read()
            except OSError as e:  # a worker reads it: the same one-line error as the driver's reader
                raise InputError(f"cannot read: {e.strerror or e}", source=file) from None
            raws.append(data[len(_BOM) :] if data.startswith(_BOM) else data)
        rows = list(range(self.first_row, self.first_row + len(raws)))
        sink = sink or ErrorSink()
        return list(_texts(self.source, raws, rows, self.text_field, "file", sink, self.files, self.decode))


def _texts(
    source: str,
    raws: list[bytes],
    rows: list[int],
    field: str,
    kind: str,
    sink: ErrorSink,
    files: list[str] | None = None,
    decode: str = "strict",
) -> Iterator[SourceBatch]:
    """One batch of the texts ``raws`` (UTF-8 bytes), built in Arrow from the bytes (no Python string is
    made, and ``pa.array`` would import pandas in every worker); a text that is not UTF-8 is read by the
    ``decode`` policy, or goes to ``sink``, named by its line (``kind`` ``line``) or its file (``files``,
    for ``kind`` ``file``)."""
    texts = _strings(raws)
    try:
        texts.validate(full=True)
    except pa.ArrowInvalid:  # some text is not UTF-8: find which, read or leave out those, keep the others
        kept_raws, kept_rows = [], []
        for i, raw in enumerate(raws):
            where = {"source": files[i]} if files else {"source": source, "row": rows[i], "row_kind": kind}
            text = read_text(raw, decode, sink, where)
            if text is not None:
                kept_raws.append(text.encode("utf-8"))
                kept_rows.append(rows[i])
        raws, rows = kept_raws, kept_rows
        texts = _strings(raws)
    if raws:
        batch = pa.RecordBatch.from_arrays([texts], schema=_schema(field))
        yield SourceBatch(source, batch, np.asarray(rows, dtype=np.int64), kind)


def _strings(raws: list[bytes]) -> pa.LargeStringArray:
    """``large_string`` over the concatenated bytes of ``raws`` (not validated)."""
    offsets = np.zeros(len(raws) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, raws), dtype=np.int64, count=len(raws)), out=offsets[1:])
    return pa.LargeStringArray.from_buffers(len(raws), pa.py_buffer(offsets), pa.py_buffer(b"".join(raws)))
