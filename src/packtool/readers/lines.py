"""Line ranges of a file: what the driver hands out for JSON Lines and ``.txt`` files.

The driver scans a file once for newlines (``line_ranges``: NumPy over 16 MiB blocks, nothing parsed or
decoded) and cuts it into ranges of whole lines; the process that encodes a range reads its bytes itself
(``read_span``) and splits them into the same lines, with the same 1-based line numbers, as reading the
whole file line by line would give (``split_lines``).

A range holds at most a number of lines and at most ``PIECE_BYTES`` of them (a longer line is a range
of its own), so that a file of long documents is handed out, read and reported to the progress bar in
pieces of a few MiB, as one of short lines is: where a range ends depends on the file alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from packtool.errors import InputError
from packtool.storage.files import open_read

SCAN_BLOCK = 1 << 24  # bytes scanned for newlines at a time
PIECE_BYTES = 4 << 20  # bytes of input a range (or a batch read by the driver) holds at most


def line_ranges(
    path: str, lines_per_piece: int, bytes_per_piece: int | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """``(first_line, line_starts)`` for consecutive ranges of ``lines_per_piece`` lines of ``path``, or
    fewer where they would span more than ``bytes_per_piece`` bytes (default ``PIECE_BYTES``; at least
    one line each); ``line_starts`` holds each line's byte offset, then where the range ends. A last line
    without a newline is a line; an empty file has none."""
    bytes_per_piece = bytes_per_piece or PIECE_BYTES
    pending = np.zeros(1, dtype=np.int64)  # line starts not handed out yet (the first one included)
    first_line, pos = 1, 0
    with open_read(path) as f:
        while block := f.read(SCAN_BLOCK):
            ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10) + (pos + 1)
            pos += len(block)
            pending = np.concatenate([pending, ends])
            cuts = _cuts(pending, lines_per_piece, bytes_per_piece, final=False)
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                yield first_line + a, pending[a : b + 1]
            first_line += cuts[-1]
            pending = pending[cuts[-1] :]
    if pending[-1] < pos:  # a last line without a newline
        pending = np.append(pending, pos)
    cuts = _cuts(pending, lines_per_piece, bytes_per_piece, final=True)
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        yield first_line + a, pending[a : b + 1]


def _cuts(starts: np.ndarray, most_lines: int, most_bytes: int, final: bool) -> list[int]:
    """Where ranges of the lines ``starts`` delimits end, from 0: ``[0, b1, b2, ...]``. Each range is
    the most lines, up to ``most_lines``, whose span is at most ``most_bytes`` (one line at least).
    Unless ``final``, a range is cut only where the lines after it could not change it (more lines are
    still to come), so the ranges depend on the file, not on how it was read.

    >>> _cuts(np.array([0, 10, 20, 30, 40, 50]), 2, 100, final=True)
    [0, 2, 4, 5]
    >>> _cuts(np.array([0, 10, 20, 300, 310]), 100, 25, final=False)
    [0, 2, 3]
    """
    last = len(starts) - 1  # lines whose end is known
    cuts, a = [0], 0
    while a < last:
        within = int(np.searchsorted(starts, starts[a] + most_bytes, side="right")) - 1
        b = max(a + 1, min(a + most_lines, within))
        if b > last or (not final and b == last and within >= last and a + most_lines > last):
            break  # the lines to come could still join this range
        cuts.append(b)
        a = b
    return cuts


def read_span(source: str, start: int, end: int, first_line: int) -> bytes:
    """Bytes ``start .. end - 1`` of ``source``; ``InputError`` if it cannot be read or is shorter now
    than when it was scanned (``first_line``: the range's first line, for the message)."""
    try:
        with open_read(source, block_size=max(end - start, 1 << 16)) as f:
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
