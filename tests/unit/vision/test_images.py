"""``image_size``: the size from the header in every format Pillow writes, the pixels decoded to tell
that they decode, and one-line errors naming the image for each kind of bad image."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from PIL import Image

from packtool.errors import InputError
from packtool.vision.images import ImageSize, decoded_size, image_size
from tests.fixtures.vision_inputs import garbage_idat, huge_ztxt, scrambled_idat


def encoded(width: int, height: int, fmt: str, mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), 7).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("fmt", "mode"),
    [("PNG", "RGB"), ("PNG", "L"), ("PNG", "RGBA"), ("PNG", "P"), ("JPEG", "RGB"), ("JPEG", "L"),
     ("WEBP", "RGB"), ("WEBP", "RGBA"), ("GIF", "P"), ("BMP", "RGB"), ("TIFF", "RGB"),
     ("PPM", "RGB"), ("TGA", "RGB")],  # no magic of images.MAGIC: Pillow tries its plugins
)  # fmt: skip
def test_size_from_the_header_of_every_format(tmp_path, fmt, mode):
    data = encoded(123, 45, fmt, mode)
    path = tmp_path / f"a.{fmt.lower()}"
    path.write_bytes(data)
    assert image_size(data) == image_size(path) == ImageSize(height=45, width=123, format=fmt, mode=mode)


def noisy(width: int, height: int, fmt: str) -> bytes:
    """An image whose pixels do not compress to nothing, so that cutting its file cuts its pixel data."""
    return encoded_image(Image.effect_noise((width, height), 64).convert("RGB"), fmt)


def encoded_image(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_a_file_cut_short_is_refused_though_its_header_is_whole(fmt):
    """An interrupted download keeps its header: the size reads, the image does not (on 1777e60 it was
    taken, and its pack stored bytes that no loader could decode)."""
    data = noisy(300, 200, fmt)
    cut = data[: len(data) * 2 // 3]
    assert image_size(data).width == 300
    with pytest.raises(InputError, match=r"^cut\.img, field 'image': broken image: "):
        image_size(cut, "cut.img")


def test_a_jpeg_with_data_after_its_end_is_decoded_to_tell():
    """A motion photo appends a video after the JPEG's end of image marker: the end check cannot tell, the
    decode finds the image whole."""
    data = noisy(120, 80, "JPEG") + b"ftypmp42" + bytes(range(256)) * 8
    assert image_size(data) == ImageSize(height=80, width=120, format="JPEG")


BOMB_LIMIT = 10_000  # Image.MAX_IMAGE_PIXELS in these tests: Pillow warns over it, raises over twice it


BAD = [
    # what, the source, the message it must give
    ("missing file", lambda tmp: tmp / "nope.png", r"cannot read image: No such file"),
    ("a directory", lambda tmp: tmp, r"cannot read image"),
    ("not an image", lambda tmp: b"hello, world", r"not an image Pillow can read"),
    ("empty bytes", lambda tmp: b"", r"not an image Pillow can read"),
    ("header cut", lambda tmp: encoded(30, 20, "PNG")[:20], r"not an image Pillow can read|broken image"),
    ("jpeg header cut", lambda tmp: encoded(30, 20, "JPEG")[:40], r"not an image|broken image"),
    ("bomb, Pillow warns", lambda tmp: encoded(150, 100, "PNG"), r"decompression bomb: .*exceeds limit"),
    (
        "bomb, Pillow raises",
        lambda tmp: encoded(300, 100, "GIF", "P"),
        r"decompression bomb: .*exceeds limit",
    ),
]


@pytest.mark.parametrize(("what", "make", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_image_is_one_line_naming_it(tmp_path, monkeypatch, what, make, message):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", BOMB_LIMIT)
    with pytest.raises(InputError) as caught:
        image_size(make(tmp_path), "data/a.jsonl, row 3, image 1")
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("data/a.jsonl, row 3, image 1, field 'image': ")
    assert caught.value.field == "image"
    assert re.search(message, text), text


def test_a_zero_size_image_is_refused():
    # Pillow cannot write a 0 x N image, so patch the width in a PNG's IHDR (bytes 16-20) and its CRC
    import struct
    import zlib

    data = bytearray(encoded(5, 5, "PNG"))
    data[16:20] = struct.pack(">I", 0)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    # Pillow's plugins refuse a zero side themselves; image_size checks it too, for any plugin that would not
    with pytest.raises(InputError, match=r"^zero\.png, field 'image': not an image Pillow can read"):
        image_size(bytes(data), "zero.png")


def test_the_path_names_the_image_by_default(tmp_path):
    path = Path(tmp_path / "x.png")
    path.write_bytes(b"nope")
    with pytest.raises(InputError, match=rf"^{path}, field 'image'"):
        image_size(path)


UNDECODABLE = [garbage_idat, scrambled_idat, huge_ztxt]


@pytest.mark.parametrize("make", UNDECODABLE, ids=[m.__name__ for m in UNDECODABLE])
def test_an_image_whose_header_and_end_are_whole_is_decoded_to_tell(make):
    """A PNG's IEND says nothing of its compressed data: each of these was taken on its header and end (a
    bad image for the loader alone); decoding its pixels finds it."""
    data = make()
    with Image.open(io.BytesIO(data)) as image:
        assert image.size == (60, 40) and data.endswith(b"IEND\xaeB`\x82")
    with pytest.raises(InputError, match=r"^a\.png, field 'image': broken image: ") as caught:
        image_size(data, "a.png")
    assert caught.value.code == "bad_image"


def test_the_same_bytes_are_decoded_once_in_a_process(monkeypatch):
    """``decoded_size``: an image many samples name is decoded once; a bad one is refused every time."""
    data = encoded(30, 20, "PNG")
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    sizes = [decoded_size(data, f"img{i}") for i in range(3)]
    assert sizes == [ImageSize(20, 30, "PNG")] * 3 and len(opened) == 1
    for _ in range(2):
        with pytest.raises(InputError, match="broken image"):
            decoded_size(garbage_idat(), "bad.png")
