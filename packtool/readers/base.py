"""What every reader yields: ``SourceBatch``, a record batch that remembers where it came from."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from packtool.errors import InputError


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

    def where(self, i: int) -> str:
        """Human-readable location of record ``i`` of this batch, e.g. ``line 12``."""
        return f"{self.row_kind} {int(self.rows[i])}"

    def error(self, i: int, field: str | None, message: str) -> InputError:
        """An ``InputError`` naming this batch's source, record ``i`` and ``field``."""
        return InputError(
            message, source=self.source, row=int(self.rows[i]), field=field, row_kind=self.row_kind
        )


def batch_from_pylist(records: list[dict], source: str, rows: np.ndarray, row_kind: str) -> SourceBatch:
    """Columnarize ``records`` (dicts) into a SourceBatch, naming the first record with a mismatched type."""
    columns: dict[str, list] = {}
    n = len(records)
    for i, rec in enumerate(records):
        for key in rec:
            if key not in columns:
                columns[key] = [None] * n
        for key, value in rec.items():
            columns[key][i] = value
    arrays = {}
    for key, values in columns.items():
        try:
            arrays[key] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            i, message = _first_mismatch(values)
            raise _locate(source, rows, row_kind, i, key, message) from None
    return SourceBatch(source, pa.RecordBatch.from_pydict(arrays), rows, row_kind)


def _locate(source: str, rows: np.ndarray, row_kind: str, i: int, field: str, message: str) -> InputError:
    return InputError(message, source=source, row=int(rows[i]), field=field, row_kind=row_kind)


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        inner = {_kind(v) for v in value if v is not None}
        return "list of " + "/".join(sorted(inner)) if inner else "list"
    return type(value).__name__


def _first_mismatch(values: list) -> tuple[int, str]:
    """Index of the first value whose type differs from the first non-null value's type."""
    first = next((i for i, v in enumerate(values) if v is not None), 0)
    expected = _kind(values[first])
    for i, v in enumerate(values):
        if v is None:
            continue
        got = _kind(v)
        if got != expected and not (expected.startswith("list") and got == "list"):
            return i, f"expected {expected} (as in earlier rows), got {got}: {str(v)[:40]!r}"
    return first, f"values cannot be stored as one column ({expected})"


def iter_slices(batch: pa.RecordBatch, max_rows: int) -> Iterator[pa.RecordBatch]:
    for start in range(0, batch.num_rows, max_rows):
        yield batch.slice(start, max_rows)
