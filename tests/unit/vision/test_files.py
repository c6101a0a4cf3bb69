"""An image file read as inputs are (``vision.files.read_image_file``): regular files only, never a wait
on a FIFO or an endless read of a device, a bounded size, and a stamp that tells a replaced file."""

from __future__ import annotations

import os

import pytest

from packtool.errors import InputError
from packtool.vision import files
from packtool.vision.files import FileStamp, image_digest, read_image_file
from tests.fixtures.s3 import s3, s3_server  # noqa: F401 - fixtures
from tests.fixtures.vision_inputs import read_samples, write_jsonl


def test_a_regular_file_is_read_whole_with_its_stamp(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(b"\x89PNG" * 100)
    data, stamp = read_image_file(str(path))
    assert data == path.read_bytes() and stamp == FileStamp.of(os.stat(path))
    assert image_digest(data) != image_digest(data[:-1])


@pytest.mark.parametrize(("make", "what"), [
    (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "is a character device, not a regular file"),
    (lambda p: p.mkdir(), "is a directory|Is a directory"),
    (lambda p: None, "No such file"),
])  # fmt: skip
def test_what_is_no_regular_file_is_refused_at_once(tmp_path, make, what):
    path = tmp_path / "a.png"
    make(path)
    with pytest.raises(InputError, match=what) as e:
        read_image_file(str(path), "a.png")
    assert e.value.field == "image" and e.value.source == "a.png"


def test_a_file_over_the_bound_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_IMAGE_BYTES", 100)
    path = tmp_path / "big.png"
    path.write_bytes(b"x" * 101)
    with pytest.raises(InputError, match="101 bytes, over the 100 an image may take") as e:
        read_image_file(str(path))
    assert e.value.code == "image_too_large"


def test_a_path_holding_a_nul_byte_is_a_bad_record_naming_it(tmp_path):
    """``os.open`` raises ValueError for it (exit 4 even under --on-error skip); it names no file."""
    rows = [{"image": "img/x\u0000.png", "conversations": [{"from": "human", "value": "<image> hi"},
                                                         {"from": "gpt", "value": "ok"}]}]  # fmt: skip
    (sample,) = read_samples([write_jsonl(tmp_path / "a.jsonl", rows)])
    with pytest.raises(InputError) as caught:
        sample.load_images()
    assert caught.value.code == "missing_image"
    assert "\0" not in str(caught.value)
    assert str(caught.value).endswith(
        "a.jsonl, line 1, field 'image': image 0 (img/x\\x00.png): its path holds a NUL byte, which no file "
        "name can"
    )


def test_an_image_object_in_a_store_is_read_with_its_stamp(s3, monkeypatch):
    """An image named by its URL, or beside an input in a store, is read from the store; its stamp
    changes when the object is rewritten; a missing or too large one is that record's bad input; a web
    URL is never fetched."""
    from packtool.vision.samples import sample_from_record

    url = s3.put("in/images/a.png", b"\x89PNG-bytes")
    data, stamp = read_image_file(url)
    assert data == b"\x89PNG-bytes" and stamp == FileStamp.of_path(url) and stamp.size == len(data)
    s3.put("in/images/a.png", b"\x89PNG-other")  # the same size, another ETag
    assert FileStamp.of_path(url) != stamp
    turns = [{"from": "human", "value": "<image> <image>"}, {"from": "gpt", "value": "x"}]
    sample = sample_from_record(
        {"image": ["images/a.png", f"{s3.url}/elsewhere/b.png"], "conversations": turns},
        f"{s3.url}/in/data.jsonl", 1, "line",
    )  # fmt: skip
    assert [i.path for i in sample.images] == [url, f"{s3.url}/elsewhere/b.png"]
    with pytest.raises(InputError, match="no such object"):
        read_image_file(f"{s3.url}/elsewhere/b.png")
    monkeypatch.setattr(files, "MAX_IMAGE_BYTES", 8)
    with pytest.raises(InputError, match="over the 8 an image may take"):
        read_image_file(url)
    one = [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "x"}]
    web = sample_from_record(
        {"image": "https://example.com/x.png", "conversations": one}, "d.jsonl", 1, "line"
    )
    assert web.images[0].remote  # a web URL is never fetched
