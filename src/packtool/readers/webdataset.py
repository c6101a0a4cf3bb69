"""WebDataset tar shards -> ``SourceBatch``: one record per sample, one field per member extension.

A WebDataset shard is a plain tar whose consecutive members share a key: ``000123.jpg``, ``000123.txt``,
``000123.json`` make one sample (the key is the member's path up to the first dot of its last part, the
extension what follows, lowercased; webdataset's own rule). A record holds ``__key__`` and one field per
extension: the text extensions (``TEXT_EXTENSIONS``) as strings, every other one as bytes, unchanged
(an image stays its encoded bytes). Rows count samples from 0 in the shard's order (``row_kind``
``sample``). Energon's captioning layout (an image and a ``.txt`` or ``.json`` caption per key) is what
``--sample-format vision`` reads from it; ``--text-field txt`` packs a shard's texts.

**Lazy.** The driver reads the members' headers only (``tarfile`` seeks past their data) and hands out
``TarSamples``: a range of samples with each member's offset and size, which the process encoding them
reads (``load``). A member over ``MAX_MEMBER_BYTES`` is a bad record, not a read of that size.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch
from packtool.readers.decode import DECODED, REPLACED, decode_text, not_utf8
from packtool.storage.files import open_read

TEXT_EXTENSIONS = frozenset({"txt", "text", "json", "cls", "caption"})
MAX_MEMBER_BYTES = 1 << 30  # one member read whole at most (an image, a caption)
KEY = "__key__"

# one sample: its key and its members as (extension, data offset in the tar, size)
Members = tuple[str, tuple[tuple[str, int, int], ...]]


def read_webdataset(
    path: str,
    batch_rows: int = 1024,
    sink: ErrorSink | None = None,
    lazy: bool = False,
    decode: str = "strict",
) -> Iterator[SourceBatch | TarSamples]:
    """The samples of the tar shard ``path``, ``batch_rows`` a batch (``TarSamples`` with ``lazy``); a
    text member that is not UTF-8 is read by the ``decode`` policy (``readers.decode``)."""
    part: list[Members] = []
    first = 0
    for sample in _samples(path):
        part.append(sample)
        if len(part) == batch_rows:
            yield from _emit(TarSamples(path, part, first, decode=decode), sink, lazy)
            first, part = first + len(part), []
    if part:
        yield from _emit(TarSamples(path, part, first, decode=decode), sink, lazy)


def _emit(part: TarSamples, sink: ErrorSink | None, lazy: bool) -> Iterator[SourceBatch | TarSamples]:
    if lazy:
        yield part
    else:
        yield from part.load(sink)


def _samples(path: str) -> Iterator[Members]:
    """Each sample's key and members, in the shard's order, from the members' headers."""
    try:
        f = open_read(path)
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror or e}", source=path) from None
    try:
        tar = tarfile.open(fileobj=f, mode="r:")  # a compressed tar has no offsets to read members at
    except (tarfile.TarError, OSError) as e:
        f.close()
        raise InputError(f"not a readable uncompressed tar file: {e}", source=path) from None
    key, members = None, []
    with f, tar:
        try:
            for member in tar:
                if not member.isfile():
                    continue
                folder, _, base = member.name.rpartition("/")
                name, dot, ext = base.partition(".")
                if not dot:  # no extension: not part of a sample (webdataset skips it too)
                    continue
                member_key = f"{folder}/{name}" if folder else name
                if member_key != key and members:
                    yield key, tuple(members)
                    members = []
                key = member_key
                members.append((ext.lower(), member.offset_data, member.size))
        except tarfile.TarError as e:
            raise InputError(f"a damaged tar file: {e}", source=path) from None
    if members:
        yield key, tuple(members)


@dataclass
class TarSamples:
    """Samples ``first_row ..`` of the tar shard ``source``, not read yet: each one's key and members'
    offsets and sizes. It stands for a ``SourceBatch`` until ``load(sink)`` reads it. ``decode``: what a
    text member that is not UTF-8 is read as."""

    source: str
    samples: list[Members]
    first_row: int
    row_kind: str = "sample"
    decode: str = "strict"

    @property
    def num_rows(self) -> int:
        return len(self.samples)

    @property
    def schema(self) -> pa.Schema:
        """The fields the samples' extensions give (known without reading a member)."""
        extensions = sorted({ext for _, members in self.samples for ext, _, _ in members})
        return pa.schema([(KEY, pa.string())] + [(e, _type(e)) for e in extensions])

    @property
    def sizes(self) -> np.ndarray:
        """``(num_rows,)`` int64: each sample's bytes in the tar (what a chunk's size counts)."""
        return np.array([sum(size for _, _, size in members) for _, members in self.samples], dtype=np.int64)

    def slice(self, offset: int, length: int) -> TarSamples:
        part = self.samples[offset : offset + length]
        return TarSamples(self.source, part, self.first_row + offset, decode=self.decode)

    def load(self, sink: ErrorSink | None = None) -> list[SourceBatch]:
        """The samples as one batch: a member that is too large, or text that is not UTF-8 and that the
        ``decode`` policy does not read, makes its sample a bad record (``sink``)."""
        sink = sink or ErrorSink()
        schema = self.schema
        columns: dict[str, list] = {name: [] for name in schema.names}
        rows = []
        try:
            f = open_read(self.source)
        except OSError as e:
            raise InputError(f"cannot read: {e.strerror or e}", source=self.source) from None
        with f:
            for i, (key, members) in enumerate(self.samples):
                row = self.first_row + i
                try:
                    read = {ext: _member(f, ext, offset, size, self.decode) for ext, offset, size in members}
                except InputError as e:
                    bad = InputError(e.reason, source=self.source, row=row, field=e.field,
                                     row_kind=self.row_kind, code=e.code)  # fmt: skip
                    bad.hint = e.hint
                    sink.bad(bad)
                    continue
                record = {ext: value for ext, (value, _) in read.items()}
                replaced = [n for _, n in read.values() if n is not None]
                if replaced:  # a sample is one record, however many of its members were read so
                    sink.note(DECODED)
                    if sum(replaced):
                        sink.note(REPLACED, sum(replaced))
                rows.append(row)
                columns[KEY].append(key)
                for name in schema.names[1:]:
                    columns[name].append(record.get(name))
        if not rows:
            return []
        arrays = [pa.array(columns[f.name], type=f.type) for f in schema]
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        return [SourceBatch(self.source, batch, np.asarray(rows, dtype=np.int64), self.row_kind)]


def _type(extension: str) -> pa.DataType:
    return pa.large_string() if extension in TEXT_EXTENSIONS else pa.large_binary()


def _member(f, extension: str, offset: int, size: int, decode: str) -> tuple[str | bytes, int | None]:
    """A member's data: text for a text extension, else its bytes; and, for a text read by the ``decode``
    policy (not UTF-8), how many of its characters were replaced (else None)."""
    if size > MAX_MEMBER_BYTES:
        raise InputError(f"member .{extension} of {size:,} bytes is over {MAX_MEMBER_BYTES:,}",
                         field=extension, code="too_large")  # fmt: skip
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise InputError(f"member .{extension} is cut short", field=extension, code="bad_record")
    if extension not in TEXT_EXTENSIONS:
        return data, None
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        first = e
    try:
        return decode_text(data, decode)
    except UnicodeError as again:
        raise not_utf8(first, decode, again, field=extension) from None
