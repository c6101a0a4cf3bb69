"""An image's size, its pixels decoded once to tell that they decode.

``image_size(source, name)`` opens the image with Pillow, reads its size from its header (PNG's IHDR,
JPEG's SOF marker, WebP's VP8 header, GIF's screen descriptor, BMP's info header), which is all the model's
processor needs to count an image's tokens (``packtool.vision.processor``), and then decodes its pixels as
the loader will (``Image.open`` and ``load``): an image whose header and end are whole but whose body is
not (a PNG's compressed data damaged, a text chunk too large to decompress, a JPEG cut short) is found
when it is packed, not when a training run reaches it. No check of a format's structure short of
decoding proves that its pixels decode (a PNG's ``IEND`` and chunk checksums say nothing of its
compressed stream), so every image is decoded, once; a JPEG at an eighth of its size (libjpeg's scaled
decoding reads every coded block, as a full decode does, and finds the same damage, for less work).

Every failure is an ``InputError`` naming the file (and the image, when a record holds several): a missing
or unreadable file, bytes that are no image Pillow knows, a header or a body cut short or damaged, a
zero-size image, and an image over Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``;
Pillow itself only warns up to twice that limit, packtool refuses it from the limit on), refused from its
header before anything is decoded.
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
    """An image's size in pixels, its format and its mode as Pillow names them (``PNG``, ``JPEG``,
    ``WEBP``, ...; ``RGB``, ``L``, ``RGBA``, ``P``, ...: what the loader's ``Image.open`` gives)."""

    height: int
    width: int
    format: str
    mode: str = "RGB"


def image_size(source: str | Path | bytes, name: str | None = None) -> ImageSize:
    """The size of an image file or of its encoded bytes, from its header, once its pixels decode.

    Args:
        source: a path, or the image's encoded bytes (as a record or a tar member holds them).
        name: how errors name the image (``"data/a.jsonl, row 3, image 1 (cat.png)"``); the path by default.

    Raises:
        InputError: one line naming ``name``: missing, unreadable, not an image, zero-size, or over Pillow's
        decompression-bomb limit, or its pixels do not decode (cut short or damaged).

    >>> buffer = io.BytesIO()
    >>> Image.new("RGB", (40, 30)).save(buffer, format="PNG")
    >>> image_size(buffer.getvalue(), "a.png")
    ImageSize(height=30, width=40, format='PNG', mode='RGB')
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
            with Image.open(stream, formats=_formats(stream)) as image:
                width, height = image.size
                kind, mode = image.format or "unknown", image.mode
                if width > 0 and height > 0:
                    _check_bomb(width, height, where)
                    if kind == "JPEG":  # scaled decoding: every coded block read, an eighth of the pixels
                        image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
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
    return ImageSize(height=height, width=width, format=kind, mode=mode)


# images this process decoded, by their bytes (the dict compares them whole: no digest to collide), so that
# an image many samples name is decoded once; small ones only, so the bytes held stay bounded
_DECODED: dict[bytes, ImageSize] = {}
_DECODED_ONE, _DECODED_ALL = 1 << 20, 32 << 20  # bytes: the most an image kept, and all of them
_decoded_bytes = [0]


def decoded_size(data: bytes, name: str | None = None) -> ImageSize:
    """``image_size(data, name)``, decoded once per process for the same bytes (images up to 1 MiB, the
    last 32 MiB of them: the ones a record set names again and again, as a captioning set's logos do).

    >>> buffer = io.BytesIO()
    >>> Image.new("RGB", (4, 3)).save(buffer, format="PNG")
    >>> decoded_size(buffer.getvalue()) == decoded_size(buffer.getvalue())
    True
    """
    size = _DECODED.get(data)
    if size is not None:
        return size
    size = image_size(data, name)
    if len(data) <= _DECODED_ONE:
        if _decoded_bytes[0] + len(data) > _DECODED_ALL:
            _DECODED.clear()
            _decoded_bytes[0] = 0
        _DECODED[data] = size
        _decoded_bytes[0] += len(data)
    return size


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
