"""What a Parquet shard's row groups hold, digested when written and checked when each is read.

Page CRC-32s catch a damaged page, not a shard rewritten whole (two packs swapped, a row group of another
run's shard, each page with a CRC of its own). So the writer digests every column of every row group as
it writes it (``column_digest``: XXH3-64, about 30 GB/s here, over the column as Arrow holds it) and
stores the digests in the shard's own footer, under the key-value metadata ``packtool.content``
(``ContentRecord``); the shard's manifest entry records the digest of that record, ``content_digest``.
A reader checks, once per shard it opens, that the footer's record is the one the manifest names, then
every row group it decodes, column by column (only the columns it reads), against the record.

Editing the manifest's ``content_digest`` leaves it naming another record than the shard's. Rewriting the
shard with its metadata (Arrow reads the footer's key-value pairs into a table's schema metadata, and
writes them back) leaves its row groups with other digests than its record; without it, with no record,
which the manifest's ``content_digest`` names.

>>> import pyarrow as pa
>>> t = pa.table({"input_ids": pa.array([[1, 2], [3]], pa.list_(pa.int32()))})
>>> column_digest(t.column("input_ids")) == column_digest(pa.chunked_array([t.column(0).chunk(0)]))
True
>>> column_digest(t.column("input_ids")) == column_digest(t.column("input_ids").take([1, 0]))
False
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import xxhash

from packtool.arrays import np_view
from packtool.manifest import strict_json

CONTENT_KEY = b"packtool.content"  # the footer's key-value pair holding a shard's ContentRecord
DIGEST = "xxh3_64"  # what ContentRecord's digests are (a record names it: a reader refuses another)


def _offsets(array: pa.Array, width: int) -> np.ndarray:
    """The ``len(array) + 1`` offsets of a list, binary or string array (slices respected), as stored."""
    dtype = np.int32 if width == 4 else np.int64
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array) + 1, offset=array.offset * width)


def _update(h: xxhash.xxh3_64, array: pa.Array) -> None:
    """Feed ``array`` into ``h``: its validity where it has nulls, the lengths of a list (offsets from 0,
    int64) then its values, a binary's or string's lengths then its bytes, a struct's fields in order, a
    fixed-width array's values as their bytes."""
    t = array.type
    if array.null_count:
        h.update(np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8).tobytes())
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = _offsets(array, 8 if pa.types.is_large_list(t) else 4).astype(np.int64)
        h.update(memoryview(offsets - offsets[0]).cast("B"))
        _update(h, array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])))
    elif pa.types.is_struct(t):
        for child in array.flatten():
            _update(h, child)
    elif (
        pa.types.is_binary(t)
        or pa.types.is_string(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_large_string(t)
    ):
        large = pa.types.is_large_binary(t) or pa.types.is_large_string(t)
        offsets = _offsets(array, 8 if large else 4).astype(np.int64)
        h.update(memoryview(offsets - offsets[0]).cast("B"))
        data = array.buffers()[2]
        if data is not None:
            h.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
    else:
        h.update(memoryview(np.ascontiguousarray(np_view(array))).cast("B"))


def column_digest(column: pa.Array | pa.ChunkedArray) -> str:
    """16 hex digits: XXH3-64 of a column's content (one row group's), whatever its chunks, its slice and
    the width of its list offsets (``list`` or ``large_list``): what a reader gets back from the file."""
    h = xxhash.xxh3_64()
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if len(chunks) != 1:
        chunks = [pa.concat_arrays(chunks)] if chunks else []
    for chunk in chunks:
        _update(h, chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class ContentRecord:
    """A shard's ``packtool.content`` footer record: the ``columns`` it holds in order, and per row group
    the digest of each (``column_digest``), in that order.

    >>> r = ContentRecord(["input_ids"], [["00ff00ff00ff00ff"]])
    >>> ContentRecord.parse(r.to_bytes()) == r, len(record_digest(r.to_bytes()))
    (True, 32)
    """

    columns: list[str]
    row_groups: list[list[str]]

    def to_bytes(self) -> bytes:
        record = {"digest": DIGEST, "columns": self.columns, "row_groups": self.row_groups}
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes) -> ContentRecord:
        """The record stored as ``raw``; ``ValueError`` saying why when it is not one this packtool reads."""
        try:
            record = strict_json(raw)
        except ValueError as e:  # (nested past Python's recursion limit too: strict_json)
            why = f" ({e.msg})" if isinstance(e, json.JSONDecodeError) and e.msg == "nested too deep" else ""
            raise ValueError(f"its packtool.content record is not JSON{why}") from None
        if not isinstance(record, dict) or record.get("digest") != DIGEST:
            raise ValueError(f"its packtool.content record is not of {DIGEST} digests")
        columns, groups = record.get("columns"), record.get("row_groups")
        if not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)):
            raise ValueError("its packtool.content record lists no columns")
        if not (isinstance(groups, list) and all(_digests(g, len(columns)) for g in groups)):
            raise ValueError("its packtool.content record does not hold a digest per column and row group")
        return cls(columns, groups)

    def problem(self, table: pa.Table, row_group: int) -> str | None:
        """Which column of ``table`` (row group ``row_group``, any of the record's columns) does not hold
        what was written, as a sentence; None when each does."""
        if not 0 <= row_group < len(self.row_groups):
            return f"row group {row_group}: the shard's content record has none"
        digests = dict(zip(self.columns, self.row_groups[row_group], strict=True))
        for name in table.column_names:
            want = digests.get(name)
            if want is None:
                return f"row group {row_group}: column {name} has no digest in the shard's content record"
            if column_digest(table.column(name)) != want:
                return (
                    f"row group {row_group}, column {name}: not the content the run wrote (its digest "
                    "differs from the one written with it: the shard was rewritten or replaced)"
                )
        return None


def record_digest(raw: bytes) -> str:
    """32 hex digits, XXH3-128 of a content record as stored (``ContentRecord.to_bytes``): the manifest
    entry's ``content_digest``."""
    return xxhash.xxh3_128(raw).hexdigest()


def _digests(value: object, count: int) -> bool:
    return isinstance(value, list) and len(value) == count and all(isinstance(d, str) for d in value)


def table_digests(table: pa.Table, row_group_size: int) -> list[list[str]]:
    """The digests of every column of each row group of ``table`` as ``ParquetWriter.write_table(table,
    row_group_size=...)`` cuts it: ``row_group_size`` rows each, the last one the rest."""
    return [
        [column_digest(table.slice(a, row_group_size).column(i)) for i in range(table.num_columns)]
        for a in range(0, table.num_rows, row_group_size)
    ]
