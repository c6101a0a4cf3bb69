"""The pages of a Parquet column chunk, read from their headers without decoding them: so that an image
larger than any a shard may hold is refused before Arrow decodes (and allocates) it.

A footer says what a column chunk of a row group takes in all (``formats.parquet.footer_problem`` bounds
that), not what each of its values takes: five images may take 1 GiB between them, or one may. Arrow
decodes a page whole, into the size its header declares (``uncompressed_page_size``), so that is what a
page can cost; a page of the images' bytes that may hold an image over ``MAX_IMAGE_BYTES`` (its header
declares more) has its values' lengths read before any page is decoded (``oversized_value``): a
``PLAIN`` page holds each value as a 4-byte length and its bytes, after its levels. Only such pages are
read further than their header (none in a shard packtool writes, unless a row group's images take
256 MiB between them), and then streamed: an uncompressed page by its lengths alone, a zstd one
decompressed through a fixed-size buffer.

The headers are Thrift structures in the compact protocol (``PageHeader`` of parquet.thrift), parsed here
with bounds on every length and nesting depth: the file is untrusted.

>>> header = bytes([0x15, 0x00, 0x15, 0x90, 0x01, 0x15, 0x20, 0x2C, 0x15, 0x04, 0x15, 0x00, 0x00, 0x00])
>>> page_header(header)
PageHeader(type=0, uncompressed_size=72, compressed_size=16, encoding=0, num_values=2, size=14)
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

DATA_PAGE = 0  # parquet.thrift PageType.DATA_PAGE (v1: levels then values, compressed together)
PLAIN = 0  # Encoding.PLAIN: a BYTE_ARRAY value is a 4-byte little-endian length and its bytes
RLE = 3  # Encoding.RLE: levels prefixed by their 4-byte length (v1 pages)
MAX_HEADER_BYTES = 1 << 16  # a page header packtool writes takes a few dozen bytes
MAX_DEPTH = 16  # Thrift structures nested deeper than any PageHeader is are refused
READ_BLOCK = 1 << 20  # what a streamed page is read by


@dataclass(frozen=True)
class PageHeader:
    """What a page's header declares: its ``type`` (``DATA_PAGE``...), its body's ``uncompressed_size``
    and ``compressed_size``, its values' ``encoding`` and ``num_values`` (a v1 data page's; -1 for another
    page) and the header's own ``size`` in bytes."""

    type: int
    uncompressed_size: int
    compressed_size: int
    encoding: int
    num_values: int
    size: int


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        byte = buf[i]  # (IndexError past the end: the caller reads more or refuses)
        i += 1
        out |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return out, i
        shift += 7
        if shift > 63:
            raise ValueError("a Thrift varint longer than 64 bits")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _skip(buf: bytes, i: int, kind: int, depth: int, in_list: bool = False) -> int:
    """The position after a compact-protocol value of type ``kind`` at ``buf[i]``."""
    if depth > MAX_DEPTH:
        raise ValueError("Thrift structures nested too deep")
    if kind in (1, 2):  # a bool: in its field header, or one byte in a list
        return i + 1 if in_list else i
    if kind == 3:
        return i + 1
    if kind in (4, 5, 6):
        return _varint(buf, i)[1]
    if kind == 7:
        return i + 8
    if kind == 8:
        n, i = _varint(buf, i)
        return i + n
    if kind in (9, 10):
        head = buf[i]
        n, i = head >> 4, i + 1
        if n == 15:
            n, i = _varint(buf, i)
        for _ in range(n):
            i = _skip(buf, i, head & 0x0F, depth + 1, in_list=True)
        return i
    if kind == 11:
        n, i = _varint(buf, i)
        if n:
            types, i = buf[i], i + 1
            for _ in range(n):
                i = _skip(buf, _skip(buf, i, types >> 4, depth + 1, True), types & 0x0F, depth + 1, True)
        return i
    if kind == 12:
        return _struct(buf, i, depth + 1)[1]
    raise ValueError(f"a Thrift value of unknown type {kind}")


def _struct(buf: bytes, i: int, depth: int = 0) -> tuple[dict[int, int | dict], int]:
    """A compact-protocol structure at ``buf[i]``: its integer and structure fields by field id (others
    skipped), and the position after it."""
    fields: dict[int, int | dict] = {}
    field_id = 0
    while True:
        head = buf[i]
        i += 1
        if head == 0:
            return fields, i
        kind = head & 0x0F
        if head >> 4:
            field_id += head >> 4
        else:
            raw, i = _varint(buf, i)
            field_id = _zigzag(raw)
        if kind in (4, 5, 6):
            raw, i = _varint(buf, i)
            fields[field_id] = _zigzag(raw)
        elif kind == 12:
            if depth >= MAX_DEPTH:
                raise ValueError("Thrift structures nested too deep")
            fields[field_id], i = _struct(buf, i, depth + 1)
        else:
            i = _skip(buf, i, kind, depth)


def page_header(buf: bytes) -> PageHeader:
    """The ``PageHeader`` at the start of ``buf``; ``IndexError`` when ``buf`` ends inside it,
    ``ValueError`` when it is not one (a size negative or missing)."""
    fields, size = _struct(buf, 0)
    v1 = fields.get(5) if isinstance(fields.get(5), dict) else {}
    numbers = [fields.get(k) for k in (1, 2, 3)]
    if not all(isinstance(n, int) for n in numbers) or min(numbers[1:]) < 0:  # type: ignore[type-var]
        raise ValueError("a page header without its type and sizes")
    return PageHeader(*numbers, v1.get(2, -1), v1.get(1, -1), size)  # type: ignore[arg-type]


def read_header(fd: int, at: int, end: int) -> PageHeader:
    """The header of the page at byte ``at`` of file ``fd`` (its column chunk ends at ``end``), read
    by a few hundred bytes first (``MAX_HEADER_BYTES`` at most); ``ValueError`` saying why it is not one."""
    for want in (256, MAX_HEADER_BYTES):
        buf = os.pread(fd, min(want, end - at), at)
        try:
            return page_header(buf)
        except IndexError:
            if len(buf) < want:
                break
    raise ValueError(f"no page header at byte {at:,} that ends inside its column chunk")


def pages(fd: int, start: int, end: int) -> Iterator[tuple[int, PageHeader]]:
    """``(offset of its body, header)`` of every page of the column chunk at bytes ``[start, end)`` of
    ``fd``; ``ValueError`` when a page runs past the chunk."""
    at = start
    while at < end:
        header = read_header(fd, at, end)
        body = at + header.size
        if body + header.compressed_size > end:
            raise ValueError(f"the page at byte {at:,} runs past its column chunk")
        yield body, header
        at = body + header.compressed_size


class _Range(io.RawIOBase):
    """Bytes ``[start, end)`` of file ``fd`` as a stream (read with ``os.pread``: the file's own position,
    Arrow's, is left alone)."""

    def __init__(self, fd: int, start: int, end: int) -> None:
        super().__init__()
        self.fd, self.at, self.end = fd, start, end

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = os.pread(self.fd, max(0, min(len(b), self.end - self.at)), self.at)
        b[: len(data)] = data
        self.at += len(data)
        return len(data)

    def skip(self, n: int) -> None:
        self.at += n


def _read(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise ValueError("a page ends inside a value")
    return data


def _skip_bytes(stream, n: int) -> None:
    if isinstance(stream, _Range):  # uncompressed: nothing to read
        if stream.at + n > stream.end:
            raise ValueError("a page ends inside a value")
        stream.skip(n)
        return
    while n > 0:
        n -= len(_read(stream, min(n, READ_BLOCK)))


def value_lengths(stream, levels: int) -> Iterator[int]:
    """The length of each ``PLAIN`` ``BYTE_ARRAY`` value of a v1 data page's body ``stream`` (read and
    skipped as it goes: never more than ``READ_BLOCK`` bytes held), after its ``levels`` runs of
    RLE-encoded levels (repetition, then definition: those the column has)."""
    for _ in range(levels):
        _skip_bytes(stream, struct.unpack("<I", _read(stream, 4))[0])
    while head := stream.read(4):
        if len(head) != 4:
            raise ValueError("a page ends inside a value's length")
        length = struct.unpack("<I", head)[0]
        yield length
        _skip_bytes(stream, length)


def oversized_value(
    fd: int, start: int, end: int, codec: str, levels: int, limit: int
) -> tuple[int, int] | None:
    """``(index, length)`` of the first value over ``limit`` bytes in the ``BYTE_ARRAY`` column chunk at
    ``[start, end)`` of ``fd`` (compressed with ``codec``: Arrow's name, ``ZSTD``...; ``levels``: how many
    kinds of levels its column has), or None when none is. Only a page whose header declares more than
    ``limit`` bytes is read past its header. ``ValueError`` when such a page cannot be read this way
    (what packtool writes can: v1 data pages, ``PLAIN``, zstd or uncompressed)."""
    index = 0
    for body, header in pages(fd, start, end):
        if header.uncompressed_size <= limit:
            index += max(header.num_values, 0)  # (levels count nulls too: only the index moves wrong)
            continue
        if header.type != DATA_PAGE or header.encoding != PLAIN or codec not in ("UNCOMPRESSED", "ZSTD"):
            raise ValueError(
                f"a page of {header.uncompressed_size:,} bytes (type {header.type}, encoding "
                f"{header.encoding}, {codec}) whose values cannot be measured before it is decoded"
            )
        raw = _Range(fd, body, body + header.compressed_size)
        stream = raw if codec == "UNCOMPRESSED" else pa.CompressedInputStream(pa.PythonFile(raw, "r"), "zstd")
        try:
            for length in value_lengths(stream, levels):
                if length > limit:
                    return index, length
                index += 1
        except (OSError, pa.ArrowException) as e:  # a zstd frame that does not decompress
            raise ValueError(f"a page that does not decompress ({e})") from None
    return None
