"""JSON Lines and JSON files -> ``SourceBatch`` stream.

A ``.jsonl`` file (or a ``.json`` file that does not start with ``[``) is read line by line, in batches;
a ``.json`` file holding one array of objects is read whole (JSON arrays cannot be streamed with the
standard library). Lines are 1-based in error messages; blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from packtool.errors import InputError
from packtool.readers.base import SourceBatch, batch_from_pylist


def read_jsonl(path: str, batch_rows: int = 2048) -> Iterator[SourceBatch]:
    """Yield batches of at most ``batch_rows`` records from a JSON Lines or JSON-array file."""
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    if head.startswith(b"["):
        yield from _read_json_array(path, batch_rows)
        return
    records: list[dict] = []
    lines: list[int] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(
                    f"not valid UTF-8 (byte {e.start})", source=path, row=lineno, row_kind="line"
                ) from None
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                raise InputError(
                    f"malformed JSON: {e.msg} (column {e.colno})", source=path, row=lineno, row_kind="line"
                ) from None
            if not isinstance(rec, dict):
                raise InputError(
                    f"expected a JSON object, got {type(rec).__name__}",
                    source=path,
                    row=lineno,
                    row_kind="line",
                )
            records.append(rec)
            lines.append(lineno)
            if len(records) >= batch_rows:
                yield batch_from_pylist(records, path, np.asarray(lines, dtype=np.int64), "line")
                records, lines = [], []
    if records:
        yield batch_from_pylist(records, path, np.asarray(lines, dtype=np.int64), "line")


def _read_json_array(path: str, batch_rows: int) -> Iterator[SourceBatch]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except UnicodeDecodeError as e:
        raise InputError(f"not valid UTF-8 (byte {e.start})", source=path) from None
    except json.JSONDecodeError as e:
        raise InputError(
            f"malformed JSON: {e.msg} (line {e.lineno}, column {e.colno})", source=path
        ) from None
    for i, rec in enumerate(data):
        if not isinstance(rec, dict):
            raise InputError(f"expected a JSON object, got {type(rec).__name__}", source=path, row=i)
    for start in range(0, len(data), batch_rows):
        chunk = data[start : start + batch_rows]
        yield batch_from_pylist(chunk, path, np.arange(start, start + len(chunk), dtype=np.int64), "row")
