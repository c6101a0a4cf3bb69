"""Line ranges of a file: what the driver hands out for JSON Lines and ``.txt`` files.

The driver scans a file once for newlines (``line_ranges``: NumPy over 16 MiB blocks, nothing parsed or
decoded) and cuts it into ranges of whole lines; the process that encodes a range reads its bytes itself
(``read_span``) and splits them into the same lines, with the same 1-based line numbers, as reading the
whole file line by line would give (``split_lines``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from packtool.errors import InputError

SCAN_BLOCK = 1 << 24  # bytes scanned for newlines at a time


def line_ranges(path: str, lines_per_piece: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(first_line, line_starts)`` for consecutive ranges of ``lines_per_piece`` lines of ``path`` (the
    last range may be shorter); ``line_starts`` holds each line's byte offset, then where the range ends.
    A last line without a newline is a line; an empty file has none."""
    pending = [np.zeros(1, dtype=np.int64)]  # line starts not handed out yet (the first one included)
    count, first_line, pos = 0, 1, 0  # count: lines in pending whose end is known
    with open(path, "rb") as f:
        while block := f.read(SCAN_BLOCK):
            ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10) + (pos + 1)
            pos += len(block)
            pending.append(ends)
            count += len(ends)
            if count >= lines_per_piece:
                starts = np.concatenate(pending)
                full = count // lines_per_piece * lines_per_piece
                for a in range(0, full, lines_per_piece):
                    yield first_line + a, starts[a : a + lines_per_piece + 1]
                first_line += full
                pending, count = [starts[full:]], count - full
    starts = np.concatenate(pending)
    if starts[-1] < pos:  # a last line without a newline
        starts = np.append(starts, pos)
    if len(starts) > 1:
        yield first_line, starts


def read_span(source: str, start: int, end: int, first_line: int) -> bytes:
    """Bytes ``start .. end - 1`` of ``source``; ``InputError`` if it cannot be read or is shorter now
    than when it was scanned (``first_line``: the range's first line, for the message)."""
    try:
        with open(source, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror or e}", source=source) from None
    if len(data) != end - start:
        raise InputError(f"file changed while being read (line {first_line})", source=source)
    return data


def split_lines(data: bytes) -> list[bytes]:
    """Whole lines as ``data.split(b"\\n")`` gives them, without the empty piece after a final newline
    (each line without its newline).

    >>> split_lines(b"a\\n\\nb\\n"), split_lines(b"a\\nb")
    ([b'a', b'', b'b'], [b'a', b'b'])
    """
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return lines
