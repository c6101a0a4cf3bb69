"""The whole ``pack`` pipeline: determinism across --num-proc, the manifest, atomic output.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packtool.pipeline.encode import chunked
from packtool.readers.inputs import read_inputs
from tests.conftest import write_jsonl


def _pretokenized(tmp_path: Path, count: int = 500, seed: int = 0, max_len: int = 300) -> Path:
    rng = np.random.default_rng(seed)
    rows = [
        {"input_ids": rng.integers(0, 30000, size=n).tolist()} for n in rng.integers(1, max_len, size=count)
    ]
    return write_jsonl(tmp_path / "pre.jsonl", rows)


def test_chunks_have_exactly_chunk_size_records(tmp_path):
    src = _pretokenized(tmp_path, 103, max_len=5)
    sizes = [sum(b.num_rows for b in c) for c in chunked(read_inputs([str(src)]), 10)]
    assert sizes == [10] * 10 + [3]


def _greedy_chunks(sizes: list[int], most_rows: int, most_bytes: int) -> list[list[int]]:
    """The chunks ``chunked`` should make of records of ``sizes`` bytes: a record joins the chunk unless
    the chunk has ``most_rows`` records or the record would take it past ``most_bytes`` (a record
    larger than that alone in a chunk). Written record by record, as the reference."""
    chunks: list[list[int]] = [[]]
    for s in sizes:
        held = sum(chunks[-1])
        if chunks[-1] and (len(chunks[-1]) == most_rows or held + s > most_bytes):
            chunks.append([])
        chunks[-1].append(s)
    return [c for c in chunks if c]


def test_chunks_hold_at_most_chunk_bytes_of_input_wherever_the_pieces_end(tmp_path, monkeypatch):
    """Long documents: a chunk closes at chunk_size records or chunk_bytes of input, whichever comes
    first, so a worker holds a bounded amount of text; the boundaries depend on the records alone (the
    readers' pieces cut anywhere, the file scanned in blocks of any size)."""
    from packtool.readers import lines

    rng = np.random.default_rng(7)
    sizes = [int(n) for n in rng.integers(1, 5_000, size=300)] + [50_000] + [10] * 40
    src = tmp_path / "docs.txt"
    src.write_bytes(b"".join(b"x" * (n - 1) + b"\n" for n in sizes))  # a line of n bytes, newline included
    expected = _greedy_chunks(sizes, 64, 30_000)
    for block, piece in ((1 << 24, 4 << 20), (4096, 20_000), (777, 3_000)):
        monkeypatch.setattr(lines, "SCAN_BLOCK", block)
        monkeypatch.setattr(lines, "PIECE_BYTES", piece)
        pieces = list(read_inputs([str(src)], lazy=True))
        assert all(p.line_starts[-1] - p.line_starts[0] <= piece or p.num_rows == 1 for p in pieces)
        chunks = list(chunked(iter(pieces), 64, chunk_bytes=30_000))
        got = [[int(n) for b in c for n in np.diff(b.line_starts)] for c in chunks]
        assert got == expected, (block, piece)
