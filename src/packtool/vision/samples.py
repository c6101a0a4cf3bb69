"""Vision-language records -> ``VisionSample``: a conversation whose image parts name their images.

The readers (``packtool.readers``) give records of any input kind: JSON Lines and JSON (compressed too),
Parquet, ``save_to_disk`` datasets and ``hf:NAME``, WebDataset tar shards. Every record becomes the same
thing: ``messages`` in the Hugging Face chat format, each ``content`` a list of parts,
``{"type": "text", "text": ...}`` and ``{"type": "image"}`` in reading order, and ``images``, one
``ImageRef`` per image part, in that order. The model's chat template renders the image parts
(``packtool.vision.sequences``). Text-only samples have no image part and an empty ``images``.

Records (``sample_from_record``), told apart by their fields:

* LLaVA: ``conversations`` (``[{"from": "human" | "gpt" | "system", "value": ...}]``) whose values hold
  ``<image>`` placeholders, and ``image`` (a path or a list of paths, or absent). The placeholders and the
  images must be as many; a LLaVA record with one image and no placeholder is refused too (where the image
  goes is not known).
* chat: ``messages`` whose ``content`` is a string or a list of parts; an image part (``"type": "image"``)
  names its image under ``image``, ``path`` or ``url`` (a local path, or an object in a store:
  ``s3://``, ``gs://``, ...; a web URL, ``http(s)://``, is refused: nothing is downloaded from the web) as a
  string, or holds its bytes
  (``image``/``bytes``: bytes, or ``{"bytes": ..., "path": ...}`` as a ``datasets.Image`` column stores
  them); a part without one takes the next of the record's ``images`` list (TRL's layout).
* captioning (a WebDataset shard's sample in Energon's ``CaptioningSample`` layout): one image member
  (``jpg``, ``jpeg``, ``png``, ``webp``) and a ``txt`` caption or a ``json`` with a ``caption``; the sample
  is a user turn holding the image and an assistant turn holding the caption.

Interleaved image-text documents (``document_from_record``, ``--sample-format interleaved``: OBELICS's,
MINT-1T's and Energon's ``InterleavedSample`` layout) are no conversation: ``texts`` and ``images``, two
lists of one length where each position holds a text (a string) or an image (a path, bytes, or
``{"bytes", "path"}``), the other ``None``. The sample's ``document`` is that sequence, a ``None`` at each
image, and ``images`` its images in order; ``messages`` stays empty. A WebDataset shard's sample holds the
two lists in its ``json`` member, each image naming a member of the sample by what follows the key
(``{"texts": ["A cat:", null], "images": [null, "0.jpg"]}`` with the member ``KEY.0.jpg``).

Paths resolve against the directory of the input file that names them (absolute paths and URLs stay; an
input in a store resolves them against its folder there). An image is
read once, when its sample is encoded (``ImageRef.load``): its bytes, their digest and its size from its
header, its pixels decoded to tell that they decode (as the loader will). Errors are ``InputError``
naming the file, the line or row, the field and the image.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtool.conventions import MAX_IMAGE_BYTES
from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch, column_values
from packtool.storage.urls import is_url, join, parent, scheme
from packtool.vision.files import FileStamp, image_digest, read_image_file
from packtool.vision.images import ImageSize, decoded_size

LLAVA_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}
PLACEHOLDER = "<image>"
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # a captioning sample's image member


@dataclass(frozen=True)
class LoadedImage:
    """An image as read for its sample: its bytes' XXH3-128 ``digest``, its ``size`` from the header, and
    either the bytes the record held (``data``) or, for a file, its resolved ``path`` and ``stamp`` (its
    bytes are not kept: a chunk of samples holds no image file in memory)."""

    name: str
    data: bytes
    digest: bytes
    size: ImageSize
    path: str | None = None
    stamp: FileStamp | None = None


WEB = ("http", "https")  # URLs of the web: never fetched


@dataclass(frozen=True)
class ImageRef:
    """One image of a sample: a resolved path, or its encoded bytes (``data``); ``name`` for messages."""

    path: str | None = None
    data: bytes | None = None
    name: str = ""
    remote: bool = False  # a web URL (http(s)://): never fetched, refused when it is read

    def load(self) -> LoadedImage:
        """The image read once: a file as inputs are read (``images.read_image_file``: a regular file, of
        bounded size), its digest, and its size from its header once its pixels decode
        (``images.decoded_size``).

        >>> import io; from PIL import Image
        >>> buffer = io.BytesIO(); Image.new("RGB", (4, 3)).save(buffer, format="PNG")
        >>> loaded = ImageRef(data=buffer.getvalue(), name="a.png").load()
        >>> (loaded.size.height, loaded.size.width, len(loaded.digest))
        (3, 4, 16)
        """
        if self.remote:
            raise InputError("a web URL: packtool reads files, objects in a store and bytes, nothing is "
                             "downloaded from the web", field="image", code="missing_image")  # fmt: skip
        stamp = None
        if self.data is not None:
            data = self.data
            if len(data) > MAX_IMAGE_BYTES:
                raise InputError(f"{len(data):,} bytes, over the {MAX_IMAGE_BYTES:,} an image may take",
                                 field="image", code="image_too_large")  # fmt: skip
        else:
            data, stamp = read_image_file(self.path, self.name)
        size = decoded_size(data, self.name)  # its pixels decoded (once for the same bytes), as loaders do
        # a file's bytes are read again when its pack is written: only the bytes a record held are kept
        kept = data if self.path is None else b""
        return LoadedImage(self.name, kept, image_digest(data), size, self.path, stamp)


@dataclass
class VisionSample:
    """A conversation with its images, or an interleaved document (``document``: its texts in order, a
    ``None`` where each image stands; ``messages`` is then empty). ``source``, ``row`` and ``row_kind``
    locate it for errors; ``loaded``: its images once read (``load_images``)."""

    messages: list[dict]
    images: list[ImageRef] = field(default_factory=list)
    source: str = ""
    row: int = 0
    row_kind: str = "row"
    loaded: list[LoadedImage] | None = None
    document: list[str | None] | None = None

    def error(self, message: str, field: str | None = None, code: str = "invalid") -> InputError:
        """An ``InputError`` naming this sample's file, row and ``field``; ``code`` is the reason counted
        under ``--on-error skip``."""
        return InputError(
            message, source=self.source, row=self.row, field=field, row_kind=self.row_kind, code=code
        )

    def load_images(self) -> list[LoadedImage]:
        """Read every image once (``ImageRef.load``); a bad image's error names this sample and the image."""
        if self.loaded is None:
            loaded = []
            for k, ref in enumerate(self.images):
                try:
                    loaded.append(ref.load())
                except InputError as e:
                    raise self.error(f"image {k} ({ref.name}): {e.reason}", "image", e.code) from None
            self.loaded = loaded
        return self.loaded

    def image_sizes(self) -> list[ImageSize]:
        """Each image's size from its header (the images are read once, ``load_images``)."""
        return [image.size for image in self.load_images()]


def sample_from_record(record: dict, source: str, row: int, row_kind: str = "row") -> VisionSample:
    """A LLaVA, chat or captioning record (see the module docstring) as a ``VisionSample``; paths resolve
    against the directory of ``source``.

    >>> turns = [{"from": "human", "value": "<image>\\nWhat?"}, {"from": "gpt", "value": "A cat."}]
    >>> s = sample_from_record({"image": "a.png", "conversations": turns}, "data/x.jsonl", 1, "line")
    >>> s.messages[0]["content"], s.images[0].path
    ([{'type': 'image'}, {'type': 'text', 'text': '\\nWhat?'}], 'data/a.png')
    """
    sample = VisionSample([], [], source, row, row_kind)
    base = parent(source) if is_url(source) else str(Path(source).parent)
    if record.get("conversations") is not None:
        _llava(record, sample, base)
    elif record.get("messages") is not None:
        _chat(record, sample, base)
    elif any(record.get(ext) is not None for ext in IMAGE_EXTENSIONS):
        _captioning(record, sample)
    else:
        raise sample.error(
            "a record needs 'conversations' (LLaVA), 'messages' (chat), or an image and a caption "
            "(WebDataset captioning); interleaved documents ('texts' and 'images') are "
            "--sample-format interleaved"
        )
    return sample


def document_from_record(record: dict, source: str, row: int, row_kind: str = "row") -> VisionSample:
    """An interleaved document (``texts`` and ``images``, or a WebDataset sample's ``json`` holding them:
    the module docstring) as a ``VisionSample``; paths resolve against the directory of ``source``.

    >>> s = document_from_record({"texts": ["A cat:", None, "!"], "images": [None, "a.png", None]},
    ...                          "data/x.jsonl", 1, "line")
    >>> s.document, s.images[0].path
    (['A cat:', None, '!'], 'data/a.png')
    """
    sample = VisionSample([], [], source, row, row_kind)
    base = parent(source) if is_url(source) else str(Path(source).parent)
    members = None
    texts, images = record.get("texts"), record.get("images")
    if texts is None and images is None and record.get("json") is not None:  # a WebDataset sample
        key = record.get("__key__", row)
        try:
            meta = json.loads(record["json"])
        except ValueError:
            raise sample.error(f"sample {key!r}: its .json is not JSON", "json") from None
        if not isinstance(meta, dict):
            raise sample.error(f"sample {key!r}: its .json is not an object with texts and images", "json")
        texts, images, members = meta.get("texts"), meta.get("images"), record
    if not isinstance(texts, list) or not isinstance(images, list):
        raise sample.error(
            "an interleaved document needs 'texts' and 'images', two lists of one length (a text or an "
            "image at each position, the other null)",
            "texts" if not isinstance(texts, list) else "images",
        )
    if len(texts) != len(images):
        raise sample.error(f"{len(texts)} texts for {len(images)} images: the lists must be as long",
                           "images", "image_count")  # fmt: skip
    document: list[str | None] = []
    for j, (text, image) in enumerate(zip(texts, images, strict=True)):
        if (text is None) == (image is None):
            what = "both a text and an image" if text is not None else "neither a text nor an image"
            raise sample.error(f"position {j} holds {what}: exactly one of the two must be null", "texts")
        if text is not None:
            if not isinstance(text, str):
                raise sample.error(f"position {j}: a text must be a string, got {type(text).__name__}",
                                   "texts")  # fmt: skip
            document.append(text)
            continue
        k = len(sample.images)
        if members is not None:
            ref = _member_image(members, image, k, sample)
        else:
            ref = _image_ref(image, base, f"image {k}")
        if ref is None:
            raise sample.error(f"position {j}: image {k} is not a path or image bytes: {str(image)[:60]!r}",
                               "images")  # fmt: skip
        sample.images.append(ref)
        document.append(None)
    sample.document = document
    return sample


def _member_image(record: dict, name: Any, k: int, sample: VisionSample) -> ImageRef:
    """Image ``k`` of a WebDataset sample: the member its ``json`` names by what follows the sample's key
    (``0.jpg`` for ``KEY.0.jpg``; the reader lowercases extensions)."""
    key = record.get("__key__", sample.row)
    data = record.get(name.lower()) if isinstance(name, str) else None
    if not isinstance(data, bytes | bytearray):
        raise sample.error(f"sample {key!r}: image {k} names member {name!r}, which the sample does not "
                           "have", "images", "missing_image")  # fmt: skip
    return ImageRef(data=bytes(data), name=f"{key}.{name}")


def batch_samples(
    batch: SourceBatch, fields: Collection[str], interleaved: bool = False
) -> list[VisionSample]:
    """The records of a reader's batch as ``VisionSample`` objects (``sample_from_record``, or
    ``document_from_record`` for ``interleaved`` documents), reading only ``fields``
    (``encoders.registry.VISION_FIELDS``; a WebDataset shard's interleaved samples: every member, as their
    ``json`` names their images); a record that is none raises, naming its row."""
    webdataset = interleaved and "__key__" in batch.schema.names
    names = [n for n in batch.schema.names if n in fields or webdataset]
    columns = {n: column_values(batch.batch, n) for n in names}
    make = document_from_record if interleaved else sample_from_record
    return [
        make({n: columns[n][i] for n in names}, batch.source, row, batch.row_kind)
        for i, row in enumerate(batch.rows.tolist())
    ]


def _image_ref(value: Any, base: str, name: str) -> ImageRef | None:
    """An image named by a path string, raw bytes, or a ``{"bytes", "path"}`` dict; ``None`` if no image."""
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return ImageRef(data=bytes(value["bytes"]), name=value.get("path") or name)
        value = value.get("path")
    if isinstance(value, bytes | bytearray):
        return ImageRef(data=bytes(value), name=name)
    if isinstance(value, str) and value:
        if "://" in value and not value.startswith("file://") and (not is_url(value) or scheme(value) in WEB):
            return ImageRef(path=value, name=value, remote=True)
        if is_url(value):  # an object in a store
            return ImageRef(path=value, name=value)
        path = value.removeprefix("file://")
        if Path(path).is_absolute():
            resolved = path
        else:  # beside the input that names it, on disk or in a store
            resolved = join(base, path) if is_url(base) else str(Path(base) / path)
        return ImageRef(path=resolved, name=value.replace("\0", "\\x00"))  # (a NUL on one error line)
    return None


def _llava(record: dict, sample: VisionSample, base: str) -> None:
    images = record.get("image") if record.get("image") is not None else record.get("images")
    images = [] if images is None else images if isinstance(images, list) else [images]
    for k, value in enumerate(images):
        ref = _image_ref(value, base, f"image {k}")
        if ref is None:
            raise sample.error(f"image {k} is not a path or image bytes: {str(value)[:60]!r}", "image")
        sample.images.append(ref)
    turns = record["conversations"]
    if not isinstance(turns, list):
        raise sample.error("must be a list of {from, value} turns", "conversations")
    placeholders = 0
    for j, turn in enumerate(turns):
        role = LLAVA_ROLES.get(turn.get("from")) if isinstance(turn, dict) else None
        value = turn.get("value") if isinstance(turn, dict) else None
        if role is None or not isinstance(value, str):
            raise sample.error(
                f"turn {j} needs 'from' (human, gpt, system) and a string 'value'", "conversations"
            )
        parts: list[dict] = []
        for i, text in enumerate(value.split(PLACEHOLDER)):
            if i:
                parts.append({"type": "image"})
                placeholders += 1
            if text:
                parts.append({"type": "text", "text": text})
        sample.messages.append({"role": role, "content": parts})
    if placeholders != len(sample.images):
        raise sample.error(
            f"{placeholders} {PLACEHOLDER} placeholder(s) for {len(sample.images)} image(s)",
            "conversations",
            "image_count",
        )


def _chat(record: dict, sample: VisionSample, base: str) -> None:
    messages = record["messages"]
    if not isinstance(messages, list):
        raise sample.error("must be a list of {role, content} messages", "messages")
    listed = record.get("images") or []
    listed = listed if isinstance(listed, list) else [listed]
    taken = 0
    for j, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise sample.error(f"message {j} needs a 'role'", "messages")
        content = message.get("content")
        if isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            parts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                elif kind == "image":
                    k = len(sample.images)
                    value = next(
                        (part[key] for key in ("image", "path", "url", "bytes") if part.get(key)), None
                    )
                    ref = _image_ref(value, base, f"image {k}")
                    if ref is None and taken < len(listed):
                        ref = _image_ref(listed[taken], base, f"image {k}")
                        taken += 1
                    if ref is None:
                        raise sample.error(
                            f"message {j}: image {k} names no image (image, path, url)", "messages"
                        )
                    sample.images.append(ref)
                    parts.append({"type": "image"})
                else:
                    raise sample.error(f"message {j}: a content part of type {kind!r}", "messages")
        else:
            raise sample.error(f"message {j}: content must be a string or a list of parts", "messages")
        sample.messages.append({"role": message["role"], "content": parts})
    if taken != len(listed):
        message = f"{len(listed)} image(s) listed for {taken} image part(s) without one"
        raise sample.error(message, "images", "image_count")


def _captioning(record: dict, sample: VisionSample) -> None:
    images = [ext for ext in IMAGE_EXTENSIONS if record.get(ext) is not None]
    key = record.get("__key__", sample.row)
    if len(images) != 1:
        raise sample.error(f"sample {key!r} has {len(images)} image members ({', '.join(images)})", "image")
    if record.get("txt") is not None:
        caption = record["txt"]
    elif record.get("json") is not None:
        try:
            meta = json.loads(record["json"])
        except ValueError:
            raise sample.error(f"sample {key!r}: its .json is not JSON", "json") from None
        caption = meta.get("caption") if isinstance(meta, dict) else None
        if not isinstance(caption, str):
            raise sample.error(f"sample {key!r}: its .json has no string 'caption'", "json")
    else:
        raise sample.error(f"sample {key!r} has no .txt or .json caption", "txt")
    sample.images.append(ImageRef(data=bytes(record[images[0]]), name=f"{key}.{images[0]}"))
    sample.messages = [
        {"role": "user", "content": [{"type": "image"}]},
        {"role": "assistant", "content": [{"type": "text", "text": caption}]},
    ]


def report(sink: ErrorSink | None, error: InputError) -> None:
    """Raise ``error``, or, with a sink, hand it over (``ErrorSink.bad``: raise or count)."""
    if sink is None:
        raise error
    sink.bad(error)
