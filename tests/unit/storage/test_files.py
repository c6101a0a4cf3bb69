"""storage.files against a real S3-protocol server (tests/fixtures/s3.py): the calls local files get."""

from __future__ import annotations

import pytest

from packtool.errors import InputError
from packtool.storage import files
from tests.fixtures.s3 import s3, s3_server  # noqa: F401 - fixtures


def test_stat_open_and_ranges(s3):
    url = s3.put("in/a.jsonl", b"0123456789")
    st = files.stat(url)
    assert (st.size, st.kind, st.is_file) == (10, "file", True)
    with files.open_read(url) as f:
        f.seek(3)
        assert f.read(4) == b"3456"
    assert files.is_dir(f"{s3.url}/in") and not files.is_dir(url)
    assert files.exists(url) and not files.exists(f"{s3.url}/in/nope")
    with pytest.raises(FileNotFoundError):
        files.stat(f"{s3.url}/in/nope")


def test_a_rewritten_object_has_another_stamp(s3):
    url = s3.put("a.txt", b"first")
    before = files.stat(url).stamp
    s3.put("a.txt", b"other")  # the same size
    assert files.stat(url).stamp != before


def test_listing_is_in_tree_order_and_leaves_hidden_out(s3):
    for key in ["d/b.txt", "d/a/z.txt", "d/a.txt", "d/.hidden/x.txt", "d/.h.txt"]:
        s3.put(key, b"x")
    got = files.list_prefix(f"{s3.url}/d")
    assert got.files == [f"{s3.url}/d/{k}" for k in ("a/z.txt", "a.txt", "b.txt")]
    assert got.hidden == [".h.txt", ".hidden/x.txt"]
    assert files.file_sizes(got.files).tolist() == [1, 1, 1]


def test_glob_with_any_depth(s3):
    for key in ["g/a.jsonl", "g/x/b.jsonl", "g/x/y/c.jsonl", "g/x/c.txt"]:
        s3.put(key, b"{}")
    assert files.glob_urls(f"{s3.url}/g/**/*.jsonl") == [
        f"{s3.url}/g/a.jsonl",
        f"{s3.url}/g/x/b.jsonl",
        f"{s3.url}/g/x/y/c.jsonl",
    ]


def test_read_bytes_is_bounded(s3):
    url = s3.put("big.json", b"x" * 100)
    assert files.read_bytes(url, 100) == b"x" * 100
    with pytest.raises(InputError, match="larger than 99 bytes"):
        files.read_bytes(url, 99)
