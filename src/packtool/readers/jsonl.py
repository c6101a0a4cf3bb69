"""JSON Lines and JSON files -> ``SourceBatch`` stream.

A ``.jsonl`` file (or a ``.json`` file that does not start with ``[``) is read line by line, in batches;
a ``.json`` file holding one array of objects is read whole (JSON arrays cannot be streamed with the
standard library). Lines are 1-based in error messages; blank lines are skipped. A bad line (not UTF-8,
malformed JSON, not an object, a field of the wrong type) goes to the ``ErrorSink``: it stops the run
(``on_error=fail``) or is left out and counted (``skip``). A JSON array that does not parse stops the run.
A line (or an array's file) that is not UTF-8 is first read by the ``decode`` policy (``readers.decode``).

**Fast path.** A JSON Lines file is parsed by ``pyarrow.json`` (C++, much faster than ``json.loads`` per
line plus columnarizing, and without the pandas import ``pa.array`` costs) as far as a scan, run in
step with it a block at a time, shows its lines non-blank, valid UTF-8 and free of surrogate escapes, and
as long as every column it infers is one the line-by-line path would build the same (null, bool, int64,
string, lists and structs of those; no double, which pyarrow also makes of integers beyond int64, and no
timestamp, which it infers from strings). Anything else, from the first batch it cannot read on, goes
through the line-by-line path, so the records, their line numbers and every error message are the same
either way.

**Lazy.** ``read_jsonl(path, lazy=True)`` (what ``packtool pack`` uses) reads the file only up to its first
record, then scans it for newlines and yields ``JsonlLines``: ranges of lines that the worker encoding them
reads and parses itself (``load(sink)``: the fast path when the range is plain, else line by line), with
the same records, line numbers and errors.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch, UsedFields, batch_from_pylist, resolve_used
from packtool.readers.compressed import is_compressed, open_input
from packtool.readers.decode import DECODED, REPLACED, decode_text, not_utf8, read_text
from packtool.readers.lines import PIECE_BYTES, SCAN_BLOCK, line_ranges, read_span, split_lines
from packtool.storage.files import open_read
from packtool.storage.urls import is_url


def read_jsonl(
    path: str,
    batch_rows: int = 2048,
    sink: ErrorSink | None = None,
    text_field: str = "text",
    lazy: bool = False,
    used_fields: UsedFields = None,
    decode: str = "strict",
) -> Iterator[SourceBatch | JsonlLines]:
    """Yield batches of at most ``batch_rows`` records from a JSON Lines or JSON-array file (read line by
    line, at most ``lines.PIECE_BYTES`` of lines, or one longer line, too).

    With ``lazy``, a JSON Lines file is read here only up to its first record (the caller sees its
    fields); the rest is yielded as ``JsonlLines``, ranges of at most ``batch_rows`` lines and
    ``PIECE_BYTES`` bytes that the process encoding them reads and parses (``load``), found by one scan
    for newlines. A JSON array is read here.

    ``used_fields`` (see ``base.UsedFields``) names the fields the caller reads: a field outside them whose
    values cannot be one column is left out instead of being an error; the ranges carry the set resolved
    from the first record's fields. ``decode``: what a line that is not UTF-8 is read as.
    """
    sink = sink or ErrorSink()
    with open_input(path) as f:
        head = f.read(64).lstrip()
    if head.startswith(b"["):
        yield from _read_json_array(path, batch_rows, sink, text_field, used_fields, decode)
        return
    if is_compressed(path):  # no byte ranges in a compressed stream: read here, line by line
        yield from _read_lines(path, batch_rows, sink, text_field, used_fields=used_fields, decode=decode)
        return
    if lazy:
        names = None
        for piece in _line_ranges(path, batch_rows, text_field, decode):
            if names is not None:
                piece.used_fields = resolve_used(used_fields, names)
                yield piece
                continue
            piece.used_fields = used_fields  # read here until a record shows the caller the fields
            for batch in piece.load(sink):
                names = batch.schema.names
                yield batch
        return
    skip = 0
    state = {"complete": False}
    for batch in _read_arrow(path, batch_rows, state):
        yield batch
        skip += batch.num_rows  # one record per line: these lines are plain, none blank
    if state["complete"]:
        return
    yield from _read_lines(
        path, batch_rows, sink, text_field, skip=skip, used_fields=used_fields, decode=decode
    )


def _read_lines(
    path: str,
    batch_rows: int,
    sink: ErrorSink,
    text_field: str,
    skip: int = 0,
    used_fields: UsedFields = None,
    decode: str = "strict",
) -> Iterator[SourceBatch]:
    """The line-by-line path, from line ``skip + 1`` on."""
    with open_input(path) as f:
        numbered = ((n, raw) for n, raw in enumerate(f, start=1) if n > skip)
        yield from _parse_lines(path, numbered, batch_rows, sink, text_field, used_fields, decode)


def _bounded_int(digits: str) -> int | str:
    """A JSON integer as an ``int``, or as its text when it is longer than Python converts (4,300 digits):
    a field packtool reads then holds a string where it wants a number, and is reported as such."""
    return int(digits) if len(digits) <= 4300 else digits


def _parse_lines(
    path: str,
    numbered: Iterable[tuple[int, bytes]],
    batch_rows: int,
    sink: ErrorSink,
    text_field: str,
    used_fields: UsedFields = None,
    decode: str = "strict",
) -> Iterator[SourceBatch]:
    """``(line number, raw line)`` pairs parsed one by one with ``json``; blank lines are skipped, bad
    ones go to ``sink``; a line that is not UTF-8 is read by the ``decode`` policy."""
    records: list[dict] = []
    lines: list[int] = []
    size = 0  # bytes of the lines in ``records``: a batch holds at most PIECE_BYTES (or one longer line)
    for lineno, raw in numbered:
        if not raw.strip():
            continue
        size += len(raw)
        if _too_deep(raw):
            message = f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
            sink.bad(_line_error(message, path, lineno, "too_deep"))
            continue
        text = read_text(raw, decode, sink, {"source": path, "row": lineno, "row_kind": "line"})
        if text is None:
            continue
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as e:
            sink.bad(
                _line_error(f"malformed JSON: {e.msg} (column {e.colno})", path, lineno, "malformed_json")
            )
            continue
        except ValueError:  # an integer past Python's 4,300 digits: kept as its text, so an unread field
            rec = json.loads(text, parse_int=_bounded_int)  # costs nothing, a read one is bad
        if not isinstance(rec, dict):
            sink.bad(
                _line_error(f"expected a JSON object, got {type(rec).__name__}", path, lineno, "not_object")
            )
            continue
        records.append(rec)
        lines.append(lineno)
        if len(records) >= batch_rows or size >= PIECE_BYTES:
            rows = np.asarray(lines, dtype=np.int64)
            yield batch_from_pylist(records, path, rows, "line", sink, text_field, used_fields)
            records, lines, size = [], [], 0
    if records:
        rows = np.asarray(lines, dtype=np.int64)
        yield batch_from_pylist(records, path, rows, "line", sink, text_field, used_fields)


_BLANK_LINE = re.compile(rb"\n[ \t\r\f\v]*\n")  # a blank line after the first (starts with a literal: fast)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SCAN_BLOCK = SCAN_BLOCK  # bytes checked for plain lines at a time
ARROW_BLOCK = 1 << 22  # bytes pyarrow.json parses at a time


class _PlainLines:
    """How many leading lines of ``path`` are known to be non-blank, valid UTF-8 and free of surrogate
    escapes (``\\uD800`` to ``\\uDFFF``): the file is scanned a block at a time, only as far as asked.

    The Arrow reader asks before it hands out each batch, so the first records go to the workers at once
    instead of after a scan of the whole file, before which no work could start.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines = 0  # lines 1..lines are plain
        self.offset = 0  # bytes of the file scanned: where line ``lines + 1`` starts
        self.stopped = False  # end of file, or a block that is not plain: no more lines will be known

    def cover(self, lines: int) -> bool:
        """Scan on until lines ``1..lines`` are known plain (True) or cannot be (False)."""
        with open_read(self.path) as f:
            while self.lines < lines and not self.stopped:
                f.seek(self.offset)
                self._block(f.read(_SCAN_BLOCK), f)
        return self.lines >= lines

    def _block(self, block: bytes, f) -> None:
        cut = block.rfind(b"\n") + 1
        if len(block) < _SCAN_BLOCK:  # the end of the file: its last line may have no newline
            cut, self.stopped = len(block), True
        elif cut == 0:  # one line longer than a block: read on to its end
            while cut == 0:
                more = f.read(_SCAN_BLOCK)
                block += more
                cut = block.rfind(b"\n") + 1 if more else len(block)
        data = block[:cut]
        if not data:
            return
        if not _plain(data):
            self.stopped = True
            return
        self.lines += data.count(b"\n") + (not data.endswith(b"\n"))
        self.offset += cut


def _plain(data: bytes) -> bool:
    """Whether ``data`` (whole lines) is valid UTF-8 with no blank line, no surrogate escape and no line
    nested deeper than ``MAX_JSON_DEPTH``: what ``pyarrow.json`` reads as the line-by-line path does, one
    record per line."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    lines = data if data.endswith(b"\n") else data + b"\n"
    blank_first = not lines[: lines.find(b"\n")].strip()
    return not (
        blank_first or _BLANK_LINE.search(lines) or _SURROGATE_ESCAPE.search(lines) or _has_deep_line(data)
    )


# Deeper JSON than this is a bad record (``too_deep``), found before any parser sees it: Python's parser
# raises RecursionError near 1,000 levels and Arrow's overflows its stack (a crash) near 20,000. Real
# records nest a few levels; 128 leaves room for any of them.
MAX_JSON_DEPTH = 128
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_depth(line: bytes) -> int:
    """How deep the arrays and objects of one JSON text nest (brackets inside strings do not count).

    >>> json_depth(b'{"a": [[1], {"b": "[[["}]}')
    3
    """
    b = np.frombuffer(_JSON_STRING.sub(b"", line), dtype=np.uint8)
    step = np.isin(b, (91, 123)).astype(np.int64) - np.isin(b, (93, 125))
    return int(np.cumsum(step).max(initial=0))


def _too_deep(line: bytes) -> bool:
    return line.count(b"[") + line.count(b"{") > MAX_JSON_DEPTH and json_depth(line) > MAX_JSON_DEPTH


def _has_deep_line(data: bytes) -> bool:
    """Whether a line of ``data`` nests deeper than ``MAX_JSON_DEPTH``.

    Quick counts over the whole block first: a line that deep holds more than ``MAX_JSON_DEPTH`` opening
    brackets, of which at most one is its first byte, so the block's brackets that do not open a line
    number ``MAX_JSON_DEPTH`` or more. Records of one object with flat fields (``{"text": ...}``) stop
    there, instead of counting every line's brackets one by one (which cost more than parsing them).
    """
    b = np.frombuffer(data, dtype=np.uint8)
    is_open = (b == 91) | (b == 123)  # [ {
    opens = int(np.count_nonzero(is_open))
    if opens <= MAX_JSON_DEPTH:
        return False
    line_openers = int(np.count_nonzero(is_open[1:] & (b[:-1] == 10))) + bool(is_open[:1].any())
    if opens - line_openers < MAX_JSON_DEPTH:
        return False
    return any(_too_deep(line) for line in data.split(b"\n"))


@dataclass
class JsonlLines:
    """Lines ``first_line .. first_line + num_rows - 1`` (1-based) of the JSON Lines file ``source``, not
    read yet: ``line_starts`` holds each line's byte offset, then where the last one ends.

    It stands for a ``SourceBatch`` until ``load(sink)`` reads and parses it (``num_rows`` counts lines, blank
    ones included); pickling it costs 8 bytes a line whatever the lines hold, so a worker reads its own.
    ``used_fields``: the fields the encoder reads (``base.UsedFields``; None: all); ``decode``: what a
    line that is not UTF-8 is read as (``readers.decode``).
    """

    source: str
    first_line: int
    line_starts: np.ndarray  # (num_rows + 1,) int64
    text_field: str = "text"
    row_kind: str = "line"
    used_fields: UsedFields = None
    decode: str = "strict"

    @property
    def num_rows(self) -> int:
        return len(self.line_starts) - 1

    def slice(self, offset: int, length: int) -> JsonlLines:
        length = min(length, self.num_rows - offset)
        starts = self.line_starts[offset : offset + length + 1]
        return JsonlLines(
            self.source, self.first_line + offset, starts, self.text_field, used_fields=self.used_fields,
            decode=self.decode,
        )  # fmt: skip

    def load(self, sink: ErrorSink | None = None) -> list[SourceBatch]:
        """The records of these lines, as the whole-file reader would give them (same line numbers, same
        errors to ``sink``): ``pyarrow.json`` when the lines are plain and it types them as ``json`` would,
        else line by line."""
        sink = sink or ErrorSink()
        data = read_span(self.source, int(self.line_starts[0]), int(self.line_starts[-1]), self.first_line)
        batches = self._load_arrow(data)
        if batches is not None:
            return batches
        lines = split_lines(data)
        numbered = enumerate(lines, start=self.first_line)
        return list(
            _parse_lines(
                self.source, numbered, len(lines) or 1, sink, self.text_field, self.used_fields, self.decode
            )
        )

    def _load_arrow(self, data: bytes) -> list[SourceBatch] | None:
        if not data or not _plain(data):
            return None
        try:
            table = pj.read_json(
                io.BytesIO(data), read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1)
            )
        except (pa.ArrowException, UnicodeDecodeError):
            return None
        if table.num_rows != self.num_rows or not _same_as_python_values(table):
            return None
        out, line = [], self.first_line
        for b in table.combine_chunks().to_batches():
            out.append(
                SourceBatch(self.source, b, np.arange(line, line + b.num_rows, dtype=np.int64), "line")
            )
            line += b.num_rows
        return out


def _line_ranges(
    path: str, lines_per_piece: int, text_field: str, decode: str = "strict"
) -> Iterator[JsonlLines]:
    """The lines of ``path`` as ``JsonlLines`` of ``lines_per_piece`` lines, from one scan for newlines."""
    for first_line, starts in line_ranges(path, lines_per_piece):
        yield JsonlLines(path, first_line, starts, text_field, decode=decode)


def _same_as_python(t: pa.DataType) -> bool:
    """Whether an inferred type is the one ``pa.array`` gives the same Python values."""
    if pa.types.is_list(t):
        return _same_as_python(t.value_type)
    if pa.types.is_struct(t):
        return all(_same_as_python(t.field(i).type) for i in range(t.num_fields))
    return t in (pa.null(), pa.bool_(), pa.int64(), pa.string())


def _same_as_python_values(data: pa.Table | pa.RecordBatch) -> bool:
    """Whether what ``pyarrow.json`` parsed holds the values Python's parser gives: types ``pa.array``
    gives the same Python values (``_same_as_python``), and lists whose offsets match their values.
    Arrow's JSON reader can drop the nulls a list starts with while its offsets count them (a list whose
    first values it reads are null: ``[null, "a.png"]``, apache/arrow#51305), which shifts every value
    after them or reads past the values' end: a batch with lists is validated in full, and read line by
    line where it fails."""
    if not all(_same_as_python(f.type) for f in data.schema):
        return False
    if not any(pa.types.is_list(f.type) or pa.types.is_struct(f.type) for f in data.schema):
        return True
    try:
        data.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _read_arrow(path: str, batch_rows: int, state: dict) -> Iterator[SourceBatch]:
    """Batches parsed by ``pyarrow.json`` while it can (see the module docstring); sets
    ``state["complete"]`` once the whole file is read. Stopping early (a block it cannot read or would
    type differently, a line that is not plain) is not an error: the caller reads on line by line from the
    first row not yielded."""
    plain = _PlainLines(path)
    if not plain.cover(1):
        return
    row = 0
    try:
        source = open_read(path) if is_url(path) else path  # pyarrow opens a local path itself
        reader = pj.open_json(source, read_options=pj.ReadOptions(block_size=ARROW_BLOCK))
        for batch in reader:
            if not _same_as_python_values(batch):
                return
            # row k is line k only up to the first line that is not plain: hand over there
            stop = not plain.cover(row + batch.num_rows)
            if stop:
                batch = batch.slice(0, plain.lines - row)
            for start in range(0, batch.num_rows, batch_rows):
                piece = batch.slice(start, batch_rows)
                lines = np.arange(row + 1, row + 1 + piece.num_rows, dtype=np.int64)
                yield SourceBatch(path, piece, lines, "line")
                row += piece.num_rows
            if stop:
                return
    except (pa.ArrowException, OSError, UnicodeDecodeError):
        return
    state["complete"] = True


def _line_error(message: str, path: str, lineno: int, code: str) -> InputError:
    return InputError(message, source=path, row=lineno, row_kind="line", code=code)


def _read_json_array(
    path: str,
    batch_rows: int,
    sink: ErrorSink,
    text_field: str,
    used_fields: UsedFields = None,
    decode: str = "strict",
) -> Iterator[SourceBatch]:
    """The objects of a file holding one JSON array, read whole; one that is not UTF-8 is read by the
    ``decode`` policy (each of its records counted as decoded) or stops the run."""
    with open_input(path) as f:
        raw = f.read()
    replaced = None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        try:
            text, replaced = decode_text(raw, decode)
        except UnicodeError as again:
            err = not_utf8(e, decode, again)  # the whole file: no record to leave out
            way = " (--decode replace or --decode ENCODING, e.g. latin-1, reads it)"
            raise InputError(
                err.reason + (way if decode == "strict" else ""), source=path, code="not_utf8"
            ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"malformed JSON: {e.msg} (line {e.lineno}, column {e.colno})", source=path, code="malformed_json"
        ) from None
    except RecursionError:
        raise InputError("JSON nested too deep to parse", source=path, code="too_deep") from None
    if not isinstance(data, list):
        raise InputError(f"expected a JSON array of objects, got {type(data).__name__}", source=path)
    if replaced is not None:
        sink.note(DECODED, sum(isinstance(rec, dict) for rec in data))
        if replaced:
            sink.note(REPLACED, replaced)
    rows = []
    for i, rec in enumerate(data):
        if isinstance(rec, dict):
            rows.append(i)
        else:
            sink.bad(
                InputError(
                    f"expected a JSON object, got {type(rec).__name__}", source=path, row=i, code="not_object"
                )
            )
    for start in range(0, len(rows), batch_rows):
        idx = rows[start : start + batch_rows]
        rows_i = np.asarray(idx, dtype=np.int64)
        yield batch_from_pylist([data[i] for i in idx], path, rows_i, "row", sink, text_field, used_fields)
