"""WebDataset tar shards as an input (``readers.webdataset``), and the any-JSON fields of records
(``readers.base.JSON_FIELDS``: a field that is a string in one record and a list in the next)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import batch_from_pylist, column_values
from packtool.readers.inputs import read_inputs


def tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


MEMBERS = [
    ("a/000.jpg", b"\xff\xd8jpeg"),
    ("a/000.txt", "un café".encode()),
    ("a/000.seg.png", b"\x89PNGseg"),
    ("a/001.png", b"\x89PNG"),
    ("a/001.json", b'{"caption": "x"}'),
    ("README", b"not part of a sample"),
    ("a/002.txt", b"\xff\xfe not utf-8"),
    ("a/003.txt", b"last"),
]


@pytest.mark.parametrize("lazy", [False, True])
def test_members_of_a_key_make_one_record(tmp_path, lazy):
    shard = tar(tmp_path / "s.tar", MEMBERS)
    sink = ErrorSink("skip")
    batches = [b for p in read_inputs([str(shard)], sink=sink, lazy=lazy) for b in p.load(sink)]
    rows = [r for b in batches for r in b.batch.to_pylist()]
    assert [r["__key__"] for r in rows] == ["a/000", "a/001", "a/003"]
    assert (
        rows[0]["jpg"] == b"\xff\xd8jpeg"
        and rows[0]["txt"] == "un café"
        and rows[0]["seg.png"] == b"\x89PNGseg"
    )
    assert rows[1]["json"] == '{"caption": "x"}' and rows[1]["jpg"] is None
    assert [int(r) for b in batches for r in b.rows] == [0, 1, 3] and batches[0].row_kind == "sample"
    assert (
        sink.counts == {"not_utf8": 1} and sink.entries[0]["row"] == 2 and sink.entries[0]["field"] == "txt"
    )


def test_a_compressed_or_damaged_tar_is_refused_in_one_line(tmp_path):
    shard = tar(tmp_path / "s.tar", MEMBERS)
    gz = tmp_path / "s.tar.gz"
    gz.write_bytes(__import__("gzip").compress(shard.read_bytes()))
    with pytest.raises(InputError, match="unknown input format '.tar.gz'"):
        list(read_inputs([str(gz)]))
    cut = tmp_path / "cut.tar"
    cut.write_bytes(shard.read_bytes()[:700])  # the first member's data cut short
    with pytest.raises(InputError, match="cut.tar"):
        list(read_inputs([str(cut)]))


def test_a_field_of_any_json_is_kept_when_its_records_differ_in_kind():
    records = [{"image": "a.png", "text": "x"}, {"image": ["b.png", "c.png"], "text": "y"}]
    b = batch_from_pylist(records, "in.jsonl", np.array([1, 2]), "line").batch
    assert column_values(b, "image") == ["a.png", ["b.png", "c.png"]]
    assert column_values(b, "text") == ["x", "y"]
    # a field that must be one kind (the text) is still refused, naming its line
    with pytest.raises(InputError, match="line 2, field 'text': expected str"):
        batch_from_pylist([{"text": "x"}, {"text": ["y"]}], "in.jsonl", np.array([1, 2]), "line")
