"""Parquet files -> ``SourceBatch`` stream, one row group slice at a time.

Two ways to read:

* ``read_parquet(path)`` reads the records here and yields ``SourceBatch`` objects;
* ``read_parquet(path, lazy=True)`` reads only the footer and yields ``ParquetRows`` (a row range, no
  data): the process that encodes a chunk reads its rows itself (``ParquetRows.load``). With
  ``--num-proc > 1`` the tokens then go from the file to the worker that encodes them, instead of being
  decoded by the driver and pickled through a pipe (which cost more than encoding pretokenized input).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch
from packtool.storage.files import open_read, stat
from packtool.storage.urls import is_url

BATCH_ROWS = 8192


def _iter_groups(pf: pq.ParquetFile, groups: range, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The batches of row groups ``groups``, one row group's reader at a time: a reader over several
    decodes ahead of the batch it hands out, so a corrupt row group failed before the rows ahead of it were
    read (errors said "after row 0" whatever row group it was). Columns of a view type come as their plain
    type (``plain_batch``)."""
    views = plain_type(pf.schema_arrow) != pf.schema_arrow
    for g in groups:
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g]):
            yield plain_batch(batch) if views else batch


def plain_type(t: pa.DataType | pa.Schema) -> pa.DataType | pa.Schema:
    """``t`` with every Arrow view type (``string_view``, ``binary_view``, ``list_view``, as Polars and
    DuckDB write Parquet) replaced by the plain type the readers and encoders take (``large_string``,
    ``large_binary``, ``large_list``), nested ones too.

    >>> plain_type(pa.schema([("text", pa.string_view()), ("ids", pa.list_view(pa.int32()))]))
    text: large_string
    ids: large_list<item: int32>
      child 0, item: int32
    """
    if isinstance(t, pa.Schema):
        return pa.schema([f.with_type(plain_type(f.type)) for f in t], metadata=t.metadata)
    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t):
        return pa.large_binary()
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.large_list(t.value_field.with_type(plain_type(t.value_type)))
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and plain_type(t.value_type) != t.value_type:
        return pa.large_list(t.value_field.with_type(plain_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(plain_type(f.type)) for f in t])
    return t


def plain_array(a: pa.Array) -> pa.Array:
    """Array ``a`` as ``plain_type`` types it (unchanged when it holds no view type). A list view is
    rebuilt from its values in view order and its lengths: Arrow's own cast of ``list_view`` to a list
    (pyarrow 26) dropped the values of every list after the first."""
    t = a.type
    if plain_type(t) == t:
        return a
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return a.cast(plain_type(t))
    mask = a.is_null() if a.null_count else None
    if pa.types.is_struct(t):
        fields = [plain_array(f) for f in a.flatten()]
        return pa.StructArray.from_arrays(fields, fields=list(plain_type(t)), mask=mask)
    lengths = np.nan_to_num(pc.list_value_length(a).to_numpy(zero_copy_only=False)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = plain_array(pc.list_flatten(a))
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values, mask=mask)


def plain_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each column as ``plain_array`` gives it."""
    return pa.RecordBatch.from_arrays(
        [plain_array(c) for c in batch.columns], schema=plain_type(batch.schema)
    )


def _open(path: str) -> pq.ParquetFile:
    """The file as a buffered stream (``pre_buffer=False``, 1 MiB reads): by default pyarrow loads a whole
    row group before the first batch, and writers default to row groups of 1Mi rows, so memory would grow
    with the file (docs/performance.md, memory)."""
    try:
        source = open_read(path) if is_url(path) else path  # pyarrow opens a local path itself
        pf = pq.ParquetFile(source, pre_buffer=False, buffer_size=1 << 20)
    except FileNotFoundError:
        raise InputError("no such file or object", source=path) from None
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"not a readable Parquet file: {_one_line(e)}", source=path) from None
    names = pf.schema_arrow.names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # a field by that name would be ambiguous: Arrow refuses to pick one
        raise InputError(f"{len(names) - len(set(names)) + 1} columns are named {twice[0]!r}", source=path)
    return pf


def num_rows(path: str) -> int:
    """Rows of the Parquet file ``path``, from its footer (a ranged read of its end in a store)."""
    return _open(path).metadata.num_rows


def read_parquet(path: str, batch_rows: int = BATCH_ROWS, lazy: bool = False) -> Iterator[SourceBatch]:
    """Yield batches of at most ``batch_rows`` rows (``ParquetRows``, one per row group, if ``lazy``);
    rows are 0-based in error messages."""
    pf = _open(path)
    if lazy:
        md, schema = pf.metadata, plain_type(pf.schema_arrow)
        row = 0
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            n = group.num_rows
            if n:
                yield ParquetRows(path, row, n, schema, row_bytes=group.total_byte_size / n)
            row += n
        return
    row = 0
    try:
        for batch in _iter_groups(pf, range(pf.metadata.num_row_groups), batch_rows):
            yield SourceBatch(path, batch, np.arange(row, row + batch.num_rows, dtype=np.int64), "row")
            row += batch.num_rows
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"corrupt Parquet data after row {row}: {_one_line(e)}", source=path) from None


@dataclass
class ParquetRows:
    """Rows ``[start, start + num_rows)`` of the Parquet file ``source``, not read yet.

    It stands for a ``SourceBatch`` until ``load()`` reads it (``num_rows``, ``source``, ``row_kind``,
    ``schema`` and ``slice`` are the same); pickling it costs a few bytes whatever the rows hold.
    ``row_bytes``: the bytes a row of its row group takes uncompressed, on average (the footer's).

    >>> # rows 100..149 of a file, read where they are encoded
    >>> # piece = ParquetRows("train.parquet", 100, 50, schema); batches = piece.load()
    """

    source: str
    start: int
    num_rows: int
    schema: pa.Schema
    row_kind: str = "row"
    row_bytes: float = 0.0

    def slice(self, offset: int, length: int) -> ParquetRows:
        length = min(length, self.num_rows - offset)
        return ParquetRows(self.source, self.start + offset, length, self.schema, row_bytes=self.row_bytes)

    def load(self, sink: ErrorSink | None = None) -> list[SourceBatch]:
        """The rows as ``SourceBatch`` objects (several if they span row groups or read batches)."""
        return read_rows(self.source, self.start, self.num_rows)


def read_rows(path: str, start: int, num_rows: int) -> list[SourceBatch]:
    """Rows ``[start, start + num_rows)`` of the Parquet file ``path`` as ``SourceBatch`` objects (0-based
    row numbers, several batches if the rows span row groups or read batches).

    Each process keeps a cursor per file (the last few files): reading the rows that follow the last ones
    read continues the same stream, so consecutive ranges cost one pass over the file. A cursor is reopened
    when the file's size or modification time changed since it was opened (a worker process outlives a
    job, e.g. a Ray worker, and the next job may read a rewritten file of the same name).
    """
    cursor = _CURSORS.pop(path, None)
    if cursor is None or cursor.stamp != _stamp(path):
        cursor = _Cursor(path)
    _CURSORS[path] = cursor  # most recently used last
    while len(_CURSORS) > _MAX_CURSORS:
        _CURSORS.popitem(last=False)
    return cursor.read(start, num_rows)


_CURSORS: OrderedDict[str, _Cursor] = OrderedDict()  # per process: consecutive pieces continue a stream
_MAX_CURSORS = 4


def _stamp(path: str) -> tuple:
    try:
        return stat(path).stamp
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror or e}", source=path) from None


class _Cursor:
    """A read position in one Parquet file: reading the rows that follow the last ones read continues the
    same stream; any other start reopens the stream at the row group holding it (and skips to the row)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stamp = _stamp(path)
        self.pf = _open(path)
        md = self.pf.metadata
        sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        self.group_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.stream: Iterator[pa.RecordBatch] | None = None
        self.pos = 0  # row of the file the stream's next row is
        self.pending: pa.RecordBatch | None = None  # rows read but not handed out yet (they start at pos)

    def _seek(self, start: int) -> None:
        g = int(np.searchsorted(self.group_starts, start, side="right") - 1)
        self.stream = _iter_groups(self.pf, range(g, len(self.group_starts) - 1), BATCH_ROWS)
        self.pos, self.pending = int(self.group_starts[g]), None

    def _next(self) -> pa.RecordBatch:
        if self.pending is not None:
            b, self.pending = self.pending, None
            return b
        try:
            return next(self.stream)
        except StopIteration:
            raise InputError(
                f"fewer rows than its metadata says (row {self.pos})", source=self.path
            ) from None
        except (pa.ArrowException, OSError) as e:
            self.stream = None
            raise InputError(
                f"corrupt Parquet data after row {self.pos}: {_one_line(e)}", source=self.path
            ) from None

    def read(self, start: int, num_rows: int) -> list[SourceBatch]:
        group_start = int(self.group_starts[np.searchsorted(self.group_starts, start, side="right") - 1])
        if self.stream is None or start < self.pos or group_start > self.pos:
            self._seek(start)  # else the rows up to start are in this row group: decode and skip them
        out, end = [], start + num_rows
        while self.pos < end:
            b = self._next()
            lo, hi = max(start - self.pos, 0), min(end - self.pos, b.num_rows)
            if hi < b.num_rows:
                self.pending = b.slice(hi)
            if lo < hi:
                a = self.pos + lo
                out.append(
                    SourceBatch(
                        self.path, b.slice(lo, hi - lo), np.arange(a, a + hi - lo, dtype=np.int64), "row"
                    )
                )
            self.pos += hi
        return out


def _one_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
