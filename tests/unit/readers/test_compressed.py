"""Compressed JSON Lines, JSON and text inputs: the same records, with the same line numbers and errors,
as the plain file (``readers.compressed``)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from packtool.errors import ErrorSink, InputError
from packtool.readers.inputs import expand_inputs, read_inputs

ROWS = [{"text": f"sample number {i}", "id": i} for i in range(30)]
CODECS = {"gz": "gzip", "bz2": "bz2", "zst": "zstd"}


def compress(path, data: bytes, codec: str):
    with pa.output_stream(str(path), compression=CODECS[codec]) as out:
        out.write(data)
    return path


def records(path) -> list[tuple[int, str]]:
    """(line, text) of every record, read as ``pack`` reads (lazily: ranges are loaded here)."""
    out = []
    for b in read_inputs([str(path)], lazy=True):
        for batch in b.load(ErrorSink()) if hasattr(b, "load") else [b]:
            out += list(zip(batch.rows.tolist(), batch.batch.column("text").to_pylist(), strict=True))
    return out


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("kind", ["jsonl", "json", "txt"])
def test_compressed_input_reads_as_the_plain_file(tmp_path, codec, kind):
    if kind == "jsonl":
        data = (
            b"".join(json.dumps(r).encode() + b"\n" for r in ROWS[:10])
            + b"\n"
            + b"".join(json.dumps(r).encode() + b"\n" for r in ROWS[10:])
        )
    elif kind == "json":
        data = json.dumps(ROWS).encode()
    else:
        data = "".join(r["text"] + "\n" for r in ROWS).encode()
    plain = tmp_path / f"plain.{kind}"
    plain.write_bytes(data)
    packed = compress(tmp_path / f"in.{kind}.{codec}", data, codec)
    assert expand_inputs([str(packed)])[0][0] == ("text" if kind == "txt" else "jsonl")
    assert records(packed) == records(plain) and len(records(packed)) == len(ROWS)


def test_bad_line_of_a_compressed_file_is_named(tmp_path):
    data = b'{"text": "a"}\n{"text": "b"}\nnot json\n'
    path = compress(tmp_path / "in.jsonl.gz", data, "gz")
    with pytest.raises(InputError, match=r"in.jsonl.gz, line 3: malformed JSON"):
        records(path)


def test_damaged_stream_and_compressed_parquet_are_refused(tmp_path):
    data = b"".join(json.dumps(r).encode() + b"\n" for r in ROWS * 200)
    full = compress(tmp_path / "full.jsonl.zst", data, "zst").read_bytes()
    (tmp_path / "cut.jsonl.zst").write_bytes(full[: len(full) // 2])
    with pytest.raises(InputError, match="cut.jsonl.zst: cannot read"):
        records(tmp_path / "cut.jsonl.zst")
    (tmp_path / "x.parquet.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(InputError, match=r"unknown input format '.parquet.gz'"):
        expand_inputs([str(tmp_path / "x.parquet.gz")])
