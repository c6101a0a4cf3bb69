"""Vision-language inputs -> ``VisionSample``: a conversation whose image parts name their images.

Every input becomes the same thing: ``messages`` in the Hugging Face chat format, each ``content`` a list of
parts, ``{"type": "text", "text": ...}`` and ``{"type": "image"}`` in reading order, and ``images``, one
``ImageRef`` per image part, in that order. The model's chat template renders the image parts
(``packtool.vision.sequences``). Text-only samples have no image part and an empty ``images``.

Records (``sample_from_record``), told apart by their fields:

* LLaVA: ``conversations`` (``[{"from": "human" | "gpt" | "system", "value": ...}]``) whose values hold
  ``<image>`` placeholders, and ``image`` (a path or a list of paths, or absent). The placeholders and the
  images must be as many; a LLaVA record with one image and no placeholder is refused too (where the image
  goes is not known).
* chat: ``messages`` whose ``content`` is a string or a list of parts; an image part (``"type": "image"``)
  names its image under ``image``, ``path`` or ``url`` (a local path; a remote URL is refused, nothing is
  downloaded) as a string, or holds its bytes
  (``image``/``bytes``: bytes, or ``{"bytes": ..., "path": ...}`` as a ``datasets.Image`` column stores
  them); a part without one takes the next of the record's ``images`` list (TRL's layout).
* Hugging Face datasets (``packtool.vision.hf_samples``): records of either kind whose ``image``/``images``
  columns are ``datasets.Image`` features, read undecoded (``{"bytes", "path"}``).
* WebDataset captioning shards (Energon's ``CaptioningSample`` layout): per sample key one image member
  (``.jpg``, ``.jpeg``, ``.png``, ``.webp``) and a ``.txt`` caption or a ``.json`` with a ``caption``; the
  sample is a user turn holding the image and an assistant turn holding the caption.

Paths resolve against the directory of the input file that names them (absolute paths stay). Errors are
``InputError`` naming the file, the line or row, the field and the image.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtool.errors import ErrorSink, InputError
from packtool.vision.images import ImageSize, image_size

LLAVA_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}
PLACEHOLDER = "<image>"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")


@dataclass(frozen=True)
class ImageRef:
    """One image of a sample: a resolved path, or its encoded bytes (``data``); ``name`` for messages."""

    path: str | None = None
    data: bytes | None = None
    name: str = ""
    remote: bool = False  # an http(s):// or other URL: never fetched, refused when its size is asked

    def read_bytes(self) -> bytes:
        """The image's encoded bytes, unchanged."""
        return self.data if self.data is not None else Path(self.path).read_bytes()

    def size(self) -> ImageSize:
        """Its size from the header (``image_size``)."""
        if self.remote:
            raise InputError("a URL: packtool reads local files and bytes only, nothing is downloaded",
                             field="image", code="missing_image")  # fmt: skip
        return image_size(self.data if self.data is not None else self.path, self.name)


@dataclass
class VisionSample:
    """A conversation with its images. ``source``, ``row`` and ``row_kind`` locate it for errors."""

    messages: list[dict]
    images: list[ImageRef] = field(default_factory=list)
    source: str = ""
    row: int = 0
    row_kind: str = "row"

    def error(self, message: str, field: str | None = None, code: str = "invalid") -> InputError:
        """An ``InputError`` naming this sample's file, row and ``field``; ``code`` is the reason counted
        under ``--on-error skip``."""
        return InputError(
            message, source=self.source, row=self.row, field=field, row_kind=self.row_kind, code=code
        )

    def image_sizes(self) -> list[ImageSize]:
        """Each image's size, read from its header; a bad image's error names this sample and the image."""
        sizes = []
        for k, ref in enumerate(self.images):
            try:
                sizes.append(ref.size())
            except InputError as e:
                raise self.error(f"image {k} ({ref.name}): {e.reason}", "image", e.code) from None
        return sizes


def sample_from_record(record: dict, source: str, row: int, row_kind: str = "row") -> VisionSample:
    """A LLaVA or chat record (see the module docstring) as a ``VisionSample``; paths resolve against the
    directory of ``source``.

    >>> turns = [{"from": "human", "value": "<image>\\nWhat?"}, {"from": "gpt", "value": "A cat."}]
    >>> s = sample_from_record({"image": "a.png", "conversations": turns}, "data/x.jsonl", 1, "line")
    >>> s.messages[0]["content"], s.images[0].path
    ([{'type': 'image'}, {'type': 'text', 'text': '\\nWhat?'}], 'data/a.png')
    """
    sample = VisionSample([], [], source, row, row_kind)
    base = Path(source).parent
    if "conversations" in record:
        _llava(record, sample, base)
    elif "messages" in record:
        _chat(record, sample, base)
    else:
        raise sample.error("a record needs 'conversations' (LLaVA) or 'messages' (chat)")
    return sample


def _image_ref(value: Any, base: Path, name: str) -> ImageRef | None:
    """An image named by a path string, raw bytes, or a ``{"bytes", "path"}`` dict; ``None`` if no image."""
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return ImageRef(data=bytes(value["bytes"]), name=value.get("path") or name)
        value = value.get("path")
    if isinstance(value, bytes | bytearray):
        return ImageRef(data=bytes(value), name=name)
    if isinstance(value, str) and value:
        if "://" in value and not value.startswith("file://"):
            return ImageRef(path=value, name=value, remote=True)
        path = value.removeprefix("file://")
        resolved = str(base / path) if not Path(path).is_absolute() else path
        return ImageRef(path=resolved, name=value)
    return None


def _llava(record: dict, sample: VisionSample, base: Path) -> None:
    images = record.get("image", record.get("images"))
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


def _chat(record: dict, sample: VisionSample, base: Path) -> None:
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


def read_json_samples(path: str | Path, sink: ErrorSink | None = None) -> Iterator[VisionSample]:
    """The samples of a JSON Lines file (rows named by line, from 1) or a JSON array (rows from 0). A bad
    record goes to ``sink`` (``--on-error``: raise, or count it and go on); without one it raises."""
    source = str(path)
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"malformed JSON: {e}", source=source) from None
        for i, record in enumerate(records):
            yield from _or_sink(sink, _record, record, source, i, "row")
        return
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            error = InputError(
                f"malformed JSON: {e.msg}", source=source, row=i, row_kind="line", code="malformed_json"
            )
            report(sink, error)
            continue
        yield from _or_sink(sink, _record, record, source, i, "line")


def _or_sink(sink: ErrorSink | None, make: Callable[..., VisionSample], *args: Any) -> Iterator[VisionSample]:
    """``make(*args)``'s sample, or nothing when it raised an ``InputError`` that ``sink`` counts."""
    try:
        yield make(*args)
    except InputError as e:
        report(sink, e)


def report(sink: ErrorSink | None, error: InputError) -> None:
    """Raise ``error``, or, with a sink, hand it over (``ErrorSink.bad``: raise or count)."""
    if sink is None:
        raise error
    sink.bad(error)


def _record(record: Any, source: str, row: int, row_kind: str) -> VisionSample:
    if not isinstance(record, dict):
        raise InputError("a record must be a JSON object", source=source, row=row, row_kind=row_kind)
    return sample_from_record(record, source, row, row_kind)


def read_webdataset_samples(shard: str | Path, sink: ErrorSink | None = None) -> Iterator[VisionSample]:
    """The captioning samples of a WebDataset tar shard: members grouped by key (the name up to the first
    dot of its last path part), one image and a ``.txt`` or ``.json`` caption each. Rows count samples
    from 0 in the shard's order. A bad sample goes to ``sink`` (see ``read_json_samples``)."""
    source = str(shard)
    with tarfile.open(shard) as tar:
        key, group, row = None, {}, 0
        for member in tar:
            if not member.isfile():
                continue
            folder, _, base = member.name.rpartition("/")
            name, _, ext = base.partition(".")
            member_key = f"{folder}/{name}" if folder else name
            if member_key != key and group:
                yield from _or_sink(sink, _captioning, group, key, source, row)
                row, group = row + 1, {}
            key = member_key
            group["." + ext.lower()] = tar.extractfile(member).read()
        if group:
            yield from _or_sink(sink, _captioning, group, key, source, row)


def _captioning(group: dict[str, bytes], key: str, source: str, row: int) -> VisionSample:
    sample = VisionSample([], [], source, row, "sample")
    images = [ext for ext in group if ext in IMAGE_EXTENSIONS]
    if len(images) != 1:
        raise sample.error(
            f"sample {key!r} has {len(images)} image members (one of {IMAGE_EXTENSIONS})", "image"
        )
    if ".txt" in group:
        caption = group[".txt"].decode("utf-8")
    elif ".json" in group:
        meta = json.loads(group[".json"])
        caption = meta.get("caption") if isinstance(meta, dict) else None
        if not isinstance(caption, str):
            raise sample.error(f"sample {key!r}: its .json has no string 'caption'", "json")
    else:
        raise sample.error(f"sample {key!r} has no .txt or .json caption", "txt")
    sample.images.append(ImageRef(data=group[images[0]], name=f"{key}{images[0]}"))
    sample.messages = [
        {"role": "user", "content": [{"type": "image"}]},
        {"role": "assistant", "content": [{"type": "text", "text": caption}]},
    ]
    return sample
