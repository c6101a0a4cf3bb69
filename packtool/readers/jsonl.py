"""JSON Lines and JSON files -> ``SourceBatch`` stream.

A ``.jsonl`` file (or a ``.json`` file that does not start with ``[``) is read line by line, in batches;
a ``.json`` file holding one array of objects is read whole (JSON arrays cannot be streamed with the
standard library). Lines are 1-based in error messages; blank lines are skipped. A bad line (not UTF-8,
malformed JSON, not an object, a field of the wrong type) goes to the ``ErrorSink``: it stops the run
(``on_error=fail``) or is left out and counted (``skip``). A JSON array that does not parse stops the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch, batch_from_pylist


def read_jsonl(
    path: str, batch_rows: int = 2048, sink: ErrorSink | None = None, text_field: str = "text"
) -> Iterator[SourceBatch]:
    """Yield batches of at most ``batch_rows`` records from a JSON Lines or JSON-array file."""
    sink = sink or ErrorSink()
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    if head.startswith(b"["):
        yield from _read_json_array(path, batch_rows, sink, text_field)
        return
    records: list[dict] = []
    lines: list[int] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                sink.bad(_line_error(f"not valid UTF-8 (byte {e.start})", path, lineno, "not_utf8"))
                continue
            except json.JSONDecodeError as e:
                sink.bad(
                    _line_error(f"malformed JSON: {e.msg} (column {e.colno})", path, lineno, "malformed_json")
                )
                continue
            if not isinstance(rec, dict):
                sink.bad(
                    _line_error(
                        f"expected a JSON object, got {type(rec).__name__}", path, lineno, "not_object"
                    )
                )
                continue
            records.append(rec)
            lines.append(lineno)
            if len(records) >= batch_rows:
                yield batch_from_pylist(
                    records, path, np.asarray(lines, dtype=np.int64), "line", sink, text_field
                )
                records, lines = [], []
    if records:
        yield batch_from_pylist(records, path, np.asarray(lines, dtype=np.int64), "line", sink, text_field)


def _line_error(message: str, path: str, lineno: int, code: str) -> InputError:
    return InputError(message, source=path, row=lineno, row_kind="line", code=code)


def _read_json_array(path: str, batch_rows: int, sink: ErrorSink, text_field: str) -> Iterator[SourceBatch]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except UnicodeDecodeError as e:
        raise InputError(f"not valid UTF-8 (byte {e.start})", source=path, code="not_utf8") from None
    except json.JSONDecodeError as e:
        raise InputError(
            f"malformed JSON: {e.msg} (line {e.lineno}, column {e.colno})", source=path, code="malformed_json"
        ) from None
    if not isinstance(data, list):
        raise InputError(f"expected a JSON array of objects, got {type(data).__name__}", source=path)
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
        yield batch_from_pylist(
            [data[i] for i in idx], path, np.asarray(idx, dtype=np.int64), "row", sink, text_field
        )
