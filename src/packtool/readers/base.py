"""What every reader yields: ``SourceBatch``, a record batch that remembers where it came from."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from packtool.errors import ErrorSink, InputError

# packtool's own fields and the kind of value each must hold (see ``_kind``); a field of mixed types is
# otherwise blamed on the rows whose kind differs from most rows'.
_LIST_OF_NUMBERS = "list of number"
KNOWN_KINDS = {"input_ids": _LIST_OF_NUMBERS, "labels": _LIST_OF_NUMBERS, "loss_mask": _LIST_OF_NUMBERS}

# packtool's own fields whose values may be any JSON (conversations, content parts, an image or a list of
# images): in a batch where they cannot be one Arrow column (a string in one record, a list in the next, as
# LLaVA's ``image`` and chat ``content`` are), they are kept as each value's JSON text, in a field whose
# metadata says so (``JSON_METADATA``), and ``column_values`` reads them back.
JSON_FIELDS = frozenset({"messages", "conversations", "tools", "image", "images"})
JSON_METADATA = {b"packtool.value": b"json"}

# The fields the caller (the encoder) reads: a set of names, or a function of the fields a batch holds
# that returns one (called only when a field's values cannot be one column); None reads every field.
UsedFields = Collection[str] | Callable[[list[str]], Collection[str] | None] | None


def resolve_used(used_fields: UsedFields, names: list[str]) -> frozenset[str] | None:
    """The set of fields read among records holding ``names`` (None: all of them)."""
    if used_fields is not None and callable(used_fields):
        used_fields = used_fields(names)
    return None if used_fields is None else frozenset(used_fields)


@dataclass
class SourceBatch:
    """A batch of raw records from one source file, with their locations for error messages.

    Attributes:
        source: the file (or ``hf:NAME``) the records come from.
        batch: the records, one row each.
        rows: ``(num_rows,)`` int64, the location of each record in ``source``: a 1-based line number
            for line-based files (``row_kind == "line"``), else a 0-based row index.
        row_kind: ``"line"`` or ``"row"``.
    """

    source: str
    batch: pa.RecordBatch
    rows: np.ndarray
    row_kind: str = "row"

    @property
    def num_rows(self) -> int:
        return self.batch.num_rows

    @property
    def schema(self) -> pa.Schema:
        return self.batch.schema

    def slice(self, offset: int, length: int) -> SourceBatch:
        """Records ``offset .. offset + length - 1`` (zero-copy)."""
        return SourceBatch(
            self.source, self.batch.slice(offset, length), self.rows[offset : offset + length], self.row_kind
        )

    def __reduce__(self):
        # pyarrow pickles a slice with its parent's whole buffers: a JSON Lines chunk (slices of the
        # reader's blocks) would carry its neighbours' bytes to the workers. Only this batch's rows are sent.
        batch = self.batch
        if batch.num_rows and batch.get_total_buffer_size() > 1.25 * batch.nbytes:
            batch = pa.RecordBatch.from_arrays(
                [pa.concat_arrays([c]) for c in batch.columns], schema=batch.schema
            )
        return (SourceBatch, (self.source, batch, self.rows, self.row_kind))

    def load(self, sink: ErrorSink | None = None) -> list[SourceBatch]:
        """Itself (a range read lazily, ``ParquetRows``, ``JsonlLines``, ``TextLines``, ``TextFiles`` or
        ``HfRows``, answers the same call with the records it names; bad records met then go to ``sink``)."""
        return [self]

    def where(self, i: int) -> str:
        """Human-readable location of record ``i`` of this batch, e.g. ``line 12``."""
        return f"{self.row_kind} {int(self.rows[i])}"

    def error(self, i: int, field: str | None, message: str, code: str = "invalid") -> InputError:
        """An ``InputError`` naming this batch's source, record ``i`` and ``field``."""
        return InputError(
            message, source=self.source, row=int(self.rows[i]), field=field, row_kind=self.row_kind, code=code
        )

    def take(self, indices: np.ndarray | list[int]) -> SourceBatch:
        """The records at ``indices`` (in that order), keeping their locations."""
        idx = np.asarray(indices, dtype=np.int64)
        return SourceBatch(self.source, self.batch.take(pa.array(idx)), self.rows[idx], self.row_kind)


def batch_from_pylist(
    records: list[dict],
    source: str,
    rows: np.ndarray,
    row_kind: str,
    sink: ErrorSink | None = None,
    text_field: str = "text",
    used_fields: UsedFields = None,
) -> SourceBatch:
    """Columnarize ``records`` (dicts) into a SourceBatch.

    A record whose field has another type than the field's other rows (``text_field`` must be a string,
    ``input_ids``/``labels``/``loss_mask`` lists of integers; else the type most rows have, or when every
    row's is, the type of the rows before it), or holds text that is not valid Unicode, is handed to
    ``sink`` (``on_error=fail`` raises, naming its row and field; ``skip`` leaves it out). A field
    outside ``used_fields`` whose values cannot be one column is left out of the batch instead: it is never
    read.
    """
    while True:
        try:
            return _columnarize(records, source, rows, row_kind, text_field, used_fields)
        except InputError as e:
            (sink or ErrorSink()).bad(e)
            i = int(np.flatnonzero(rows == e.row)[0])
            records, rows = records[:i] + records[i + 1 :], np.delete(rows, i)


def _columnarize(
    records: list[dict],
    source: str,
    rows: np.ndarray,
    row_kind: str,
    text_field: str,
    used_fields: UsedFields,
) -> SourceBatch:
    columns: dict[str, list] = {}
    n = len(records)
    for i, rec in enumerate(records):
        for key in rec:
            if key not in columns:
                columns[key] = [None] * n
        for key, value in rec.items():
            columns[key][i] = value
    arrays = {}
    as_json = set()  # JSON_FIELDS kept as JSON text
    unresolved = object()
    used = unresolved  # resolved at the first field whose values cannot be one column
    for key, values in columns.items():
        try:
            arrays[key] = pa.array(values)
            continue
        except (UnicodeEncodeError, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            bad_unicode = isinstance(e, UnicodeEncodeError)
        if used is unresolved:
            used = resolve_used(used_fields, list(columns))
        if used is not None and key not in used:
            continue  # never read: left out rather than stop the run or skip records over it
        if key in JSON_FIELDS and not bad_unicode:  # any JSON: each value as its JSON text
            arrays[key] = pa.array([None if v is None else json.dumps(v) for v in values], pa.large_string())
            as_json.add(key)
            continue
        if bad_unicode:
            i = next(i for i, v in enumerate(values) if not _valid_unicode(v))
            raise _locate(
                source, rows, row_kind, i, key, "not valid Unicode (a lone surrogate escape)", "not_utf8"
            )
        expected = "str" if key == text_field else KNOWN_KINDS.get(key)
        i, message = _first_mismatch(values, expected)
        if i is None:  # every value has the same kind, e.g. lists of dicts holding different types
            i = _first_unstorable(values)
            message = (
                f"{_kind(values[i])} holding other types than the earlier rows' (they cannot be one "
                f"column): {str(values[i])[:40]!r}"
            )
        raise _locate(source, rows, row_kind, i, key, message, "wrong_type")
    fields = [
        pa.field(k, a.type, metadata=JSON_METADATA if k in as_json else None) for k, a in arrays.items()
    ]
    batch = pa.RecordBatch.from_arrays(list(arrays.values()), schema=pa.schema(fields))
    return SourceBatch(source, batch, rows, row_kind)


def column_values(batch: pa.RecordBatch, name: str) -> list:
    """Field ``name`` of every record as Python values: a field kept as JSON text (``JSON_FIELDS``) parsed
    back, any other converted by Arrow.

    >>> b = batch_from_pylist([{"image": "a.png"}, {"image": ["b.png", "c.png"]}], "x.jsonl",
    ...                       np.array([1, 2]), "line").batch
    >>> b.schema.field("image").type, column_values(b, "image")
    (DataType(large_string), ['a.png', ['b.png', 'c.png']])
    """
    field = batch.schema.field(name)
    values = batch.column(name).to_pylist()
    if field.metadata and field.metadata.get(b"packtool.value") == b"json":
        return [None if v is None else json.loads(v) for v in values]
    return values


def _locate(
    source: str, rows: np.ndarray, row_kind: str, i: int, field: str, message: str, code: str
) -> InputError:
    return InputError(message, source=source, row=int(rows[i]), field=field, row_kind=row_kind, code=code)


def _valid_unicode(value: object) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, list):
        return all(_valid_unicode(v) for v in value)
    if isinstance(value, dict):
        return all(_valid_unicode(k) and _valid_unicode(v) for k, v in value.items())
    return True


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return "integer beyond int64"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        inner = {_kind(v) for v in value if v is not None}
        return "list of " + "/".join(sorted(inner)) if inner else "list"
    return type(value).__name__


def _first_mismatch(values: list, expected: str | None = None) -> tuple[int | None, str]:
    """Index of the first value whose type differs from ``expected`` (default: the most common type)."""
    kinds = [None if v is None else _kind(v) for v in values]
    present = [k for k in kinds if k is not None]
    if expected is None:
        # the kind most rows have; a tie goes to the kind seen first
        expected = max(dict.fromkeys(present), key=present.count) if present else "null"
    for i, got in enumerate(kinds):
        if got is None:
            continue
        if got != expected and not (expected.startswith("list") and got == "list"):
            return i, f"expected {expected}, got {got}: {str(values[i])[:40]!r}"
    return None, f"values cannot be stored as one column ({expected})"


def _first_unstorable(values: list) -> int:
    """Index of the first value that cannot share one column with the values before it (the values as a
    whole cannot be one column; a prefix that cannot stays so when longer: binary search)."""
    lo, hi = 0, len(values)  # values[:lo] is one column (or empty), values[:hi] is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pa.array(values[:mid])
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            hi = mid
        else:
            lo = mid
    return hi - 1
