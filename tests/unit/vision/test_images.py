"""``image_size``: the size from the header in every format Pillow writes, and one-line errors naming the
image for each kind of bad image."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from PIL import Image

from packtool.errors import InputError
from packtool.vision.images import ImageSize, image_size


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
    assert image_size(data) == image_size(path) == ImageSize(height=45, width=123, format=fmt)


def test_the_header_alone_is_read(tmp_path):
    """A PNG cut after its header still has a size; decoding it finds the cut."""
    data = encoded(300, 200, "PNG")
    header_only = data[:100]
    assert image_size(header_only).width == 300
    with pytest.raises(InputError, match=r"^cut\.png, field 'image': broken image: "):
        image_size(header_only, "cut.png", decode=True)


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
