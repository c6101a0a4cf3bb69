"""Decode the list columns of a Parquet row group from its data pages, without Arrow's record assembly.

Why: for packtool's ``list<int32>`` columns of ``N`` values per row, ``ParquetFile.read_row_group``
spends most of its time turning repetition/definition levels into list offsets value by value (on
packs of N=4096, ~13 ms of a ~16 ms row group read; the zstd decompression is ~2 ms), and the loader
reads nothing else. Here each page is decompressed with Arrow's codec, its values are viewed as a NumPy
array (PLAIN) or looked up in the dictionary (RLE_DICTIONARY), and the levels are read run by run: a row
starts at every repetition level 0, and every definition level must be the maximum (no nulls, no empty
lists), which is all packtool writes.

``read_list_columns`` returns ``None`` whenever the row group holds anything else (another encoding or
codec, nulls, empty lists, nesting, encryption, a page it cannot parse, counts that do not add up), and
the caller reads it with Arrow instead, which also gives the canonical error for a damaged file. Set
``FAST_PARQUET = False`` to always use Arrow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FAST_PARQUET = True
"""Decode pages here when the layout allows; ``False`` makes ``read_list_columns`` always return None."""

CODECS = {"UNCOMPRESSED": None, "ZSTD": "zstd", "SNAPPY": "snappy"}  # Parquet codec -> Arrow codec name
PHYSICAL = {
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FLOAT": np.dtype("<f4"),
    "DOUBLE": np.dtype("<f8"),
}

# page types and encodings of parquet.thrift
DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY = 0, 2, 3, 8


class Unsupported(Exception):
    """The row group holds something this decoder does not handle: read it with Arrow."""


# --- Thrift compact protocol (only what page headers need) -----------------------------------------
def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if pos >= len(buf):
            raise Unsupported("truncated varint")
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7
        if shift > 63:
            raise Unsupported("varint too long")


def _zigzag(v: int) -> int:
    return (v >> 1) ^ -(v & 1)


def _value(buf: memoryview, pos: int, kind: int) -> tuple[object, int]:
    """One compact-protocol value of type ``kind`` at ``pos``: (value, next position)."""
    if kind in (1, 2):  # boolean inside a struct: the type is the value
        return kind == 1, pos
    if kind == 3:
        return buf[pos], pos + 1
    if kind in (4, 5, 6):
        v, pos = _varint(buf, pos)
        return _zigzag(v), pos
    if kind == 7:
        return None, pos + 8
    if kind == 8:
        size, pos = _varint(buf, pos)
        return bytes(buf[pos : pos + size]), pos + size
    if kind in (9, 10):
        head = buf[pos]
        pos += 1
        size, elem = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        items = []
        for _ in range(size):
            if elem in (1, 2):  # booleans in a list take one byte each
                items.append(buf[pos] == 1)
                pos += 1
            else:
                v, pos = _value(buf, pos, elem)
                items.append(v)
        return items, pos
    if kind == 11:
        size, pos = _varint(buf, pos)
        if size:
            kinds = buf[pos]
            pos += 1
            for _ in range(size):
                _, pos = _value(buf, pos, kinds >> 4)
                _, pos = _value(buf, pos, kinds & 0x0F)
        return None, pos
    if kind == 12:
        return _struct(buf, pos)
    raise Unsupported(f"thrift type {kind}")


def _struct(buf: memoryview, pos: int) -> tuple[dict[int, object], int]:
    """A compact-protocol struct at ``pos`` as ``{field id: value}`` (nested structs as dicts)."""
    out: dict[int, object] = {}
    fid = 0
    while True:
        if pos >= len(buf):
            raise Unsupported("truncated page header")
        head = buf[pos]
        pos += 1
        if head == 0:
            return out, pos
        delta, kind = head >> 4, head & 0x0F
        if delta:
            fid += delta
        else:
            v, pos = _varint(buf, pos)
            fid = _zigzag(v)
        out[fid], pos = _value(buf, pos, kind)


# --- RLE / bit-packed hybrid ------------------------------------------------------------------------
def _unpack_bits(data: np.ndarray, width: int) -> np.ndarray:
    """Little-endian bit-packed unsigned integers of ``width`` bits, int64."""
    if width == 0:
        return np.zeros(len(data) * 8, dtype=np.int64)
    bits = np.unpackbits(data, bitorder="little").reshape(-1, width).astype(np.int64)
    return bits @ (np.int64(1) << np.arange(width, dtype=np.int64))


@dataclass
class Runs:
    """``count`` values decoded from an RLE/bit-packed hybrid stream, kept as runs.

    RLE runs: ``rle_start``, ``rle_count``, ``rle_value`` (positions in the page's value order). The
    bit-packed values, expanded: ``bp_pos`` (positions) and ``bp_value``.
    """

    count: int
    rle_start: np.ndarray
    rle_count: np.ndarray
    rle_value: np.ndarray
    bp_pos: np.ndarray
    bp_value: np.ndarray

    def all_equal(self, value: int) -> bool:
        return bool((self.rle_value == value).all() and (self.bp_value == value).all())

    def positions_of(self, value: int) -> np.ndarray:
        """Sorted positions whose value is ``value`` (int64)."""
        pick = self.rle_value == value
        starts, counts = self.rle_start[pick], self.rle_count[pick]
        if counts.sum() > 0:
            rle = np.repeat(starts - np.cumsum(np.concatenate([[0], counts[:-1]])), counts)
            rle += np.arange(int(counts.sum()))
        else:
            rle = np.empty(0, dtype=np.int64)
        return np.sort(np.concatenate([rle, self.bp_pos[self.bp_value == value]]))

    def expand(self) -> np.ndarray:
        """All ``count`` values in order (int64)."""
        out = np.empty(self.count, dtype=np.int64)
        total = int(self.rle_count.sum())
        first = np.cumsum(self.rle_count) - self.rle_count
        out[np.repeat(self.rle_start - first, self.rle_count) + np.arange(total)] = np.repeat(
            self.rle_value, self.rle_count
        )
        out[self.bp_pos] = self.bp_value
        return out


def decode_hybrid(buf: memoryview, width: int, count: int) -> Runs:
    """Decode ``count`` values of bit width ``width`` from the hybrid stream filling ``buf``."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    vbytes = (width + 7) // 8
    rs, rc, rv = [], [], []
    bp_chunks: list[tuple[int, int, int, int]] = []  # (position, values, byte start, byte end)
    pos = done = 0
    while done < count:
        header, pos = _varint(buf, pos)
        if header & 1:
            groups = header >> 1
            n, nbytes = groups * 8, groups * width
            if pos + nbytes > len(buf) or groups == 0:
                raise Unsupported("bad bit-packed run")
            bp_chunks.append((done, n, pos, pos + nbytes))
            pos += nbytes
        else:
            n = header >> 1
            if pos + vbytes > len(buf) or n == 0:
                raise Unsupported("bad RLE run")
            rs.append(done)
            rc.append(min(n, count - done))
            rv.append(int.from_bytes(buf[pos : pos + vbytes], "little"))
            pos += vbytes
        done += n
    if bp_chunks:
        at, counts = np.array([c[:2] for c in bp_chunks], dtype=np.int64).T
        if width:
            bp_value = _unpack_bits(np.concatenate([arr[a:b] for _, _, a, b in bp_chunks]), width)
        else:
            bp_value = np.zeros(int(counts.sum()), dtype=np.int64)
        first = np.cumsum(counts) - counts  # where each chunk's values start in bp_value
        bp_pos = np.repeat(at - first, counts) + np.arange(int(counts.sum()))
        keep = bp_pos < count  # the last group is padded to 8 values
        bp_pos, bp_value = bp_pos[keep], bp_value[keep]
    else:
        bp_pos = bp_value = np.empty(0, dtype=np.int64)
    return Runs(
        count,
        np.array(rs, dtype=np.int64),
        np.array(rc, dtype=np.int64),
        np.array(rv, dtype=np.int64),
        bp_pos,
        bp_value,
    )


_LEVELS_CACHE: dict[tuple[bytes, int, int], Runs] = {}
LEVELS_CACHE_SIZE = 256
"""Decoded level streams kept, keyed by their bytes: pages of the same layout (every page of packtool's
fixed-length rows) repeat the same few streams, so each is parsed run by run once per process."""


def decode_levels(buf: memoryview, width: int, count: int) -> Runs:
    """``decode_hybrid`` through a small cache keyed by the stream's bytes (streams up to 4 KiB)."""
    if len(buf) > 4096:
        return decode_hybrid(buf, width, count)
    key = (bytes(buf), width, count)
    runs = _LEVELS_CACHE.get(key)
    if runs is None:
        runs = decode_hybrid(buf, width, count)
        if len(_LEVELS_CACHE) >= LEVELS_CACHE_SIZE:
            _LEVELS_CACHE.pop(next(iter(_LEVELS_CACHE)))
        _LEVELS_CACHE[key] = runs
    return runs


def _length_prefixed(buf: memoryview, pos: int) -> tuple[memoryview, int]:
    if pos + 4 > len(buf):
        raise Unsupported("truncated levels")
    size = int.from_bytes(buf[pos : pos + 4], "little")
    if pos + 4 + size > len(buf):
        raise Unsupported("truncated levels")
    return buf[pos + 4 : pos + 4 + size], pos + 4 + size


# --- one column chunk --------------------------------------------------------------------------------
def _decompress(codec: pa.Codec | None, data: memoryview, size: int) -> memoryview:
    if codec is None:
        if len(data) != size:
            raise Unsupported("uncompressed page size mismatch")
        return data
    try:
        out = codec.decompress(data, decompressed_size=size)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise Unsupported(f"decompress: {e}") from None
    return memoryview(out).cast("B")  # (an Arrow buffer exports signed bytes)


def _plain(data: memoryview, dtype: np.dtype, count: int) -> np.ndarray:
    if len(data) < count * dtype.itemsize:
        raise Unsupported("page holds fewer values than it says")
    return np.frombuffer(data, dtype=dtype, count=count)


def _bit_width(max_level: int) -> int:
    return int(max_level).bit_length()


def decode_list_chunk(
    chunk: memoryview, codec_name: str, physical: str, max_def: int, max_rep: int, num_values: int
) -> tuple[np.ndarray, np.ndarray]:
    """One column chunk of a ``list<primitive>`` column: ``(row_starts, values)``.

    ``row_starts``: positions (in value order) where a row starts; ``values``: the physical values.
    Raises ``Unsupported`` for anything but non-null values in non-empty lists.
    """
    if codec_name not in CODECS:
        raise Unsupported(f"codec {codec_name}")
    if physical not in PHYSICAL or max_rep != 1 or max_def < 1:
        raise Unsupported(f"column {physical} def {max_def} rep {max_rep}")
    codec = pa.Codec(CODECS[codec_name]) if CODECS[codec_name] else None
    dtype = PHYSICAL[physical]
    rep_width, def_width = _bit_width(max_rep), _bit_width(max_def)
    dictionary = None
    pieces, starts = [], []
    seen = 0
    pos = 0
    while seen < num_values:
        header, pos = _struct(chunk, pos)
        ptype, usize, csize = header.get(1), header.get(2), header.get(3)
        if not isinstance(usize, int) or not isinstance(csize, int) or csize < 0 or pos + csize > len(chunk):
            raise Unsupported("bad page header")
        body = chunk[pos : pos + csize]
        pos += csize
        if ptype == DICTIONARY_PAGE:
            dh = header.get(7) or {}
            if dh.get(2) not in (PLAIN, PLAIN_DICTIONARY) or dictionary is not None:
                raise Unsupported("dictionary page")
            dictionary = _plain(_decompress(codec, body, usize), dtype, dh.get(1, 0)).copy()
            continue
        if ptype == DATA_PAGE:
            dh = header.get(5) or {}
            count, encoding = dh.get(1), dh.get(2)
            if dh.get(3) != RLE or dh.get(4) != RLE:
                raise Unsupported("level encoding")
            page = _decompress(codec, body, usize)
            rep_bytes, p = _length_prefixed(page, 0)
            def_bytes, p = _length_prefixed(page, p)
            values_bytes = page[p:]
        elif ptype == DATA_PAGE_V2:
            dh = header.get(8) or {}
            count, encoding = dh.get(1), dh.get(4)
            def_len, rep_len = dh.get(5, 0), dh.get(6, 0)
            if not 0 <= rep_len + def_len <= min(usize, csize):
                raise Unsupported("bad v2 level lengths")
            rep_bytes, def_bytes = body[:rep_len], body[rep_len : rep_len + def_len]
            rest = body[rep_len + def_len :]
            if dh.get(7, True):
                values_bytes = _decompress(codec, rest, usize - rep_len - def_len)
            else:
                values_bytes = rest
        else:
            raise Unsupported(f"page type {ptype}")
        if not isinstance(count, int) or count <= 0 or seen + count > num_values:
            raise Unsupported("bad page value count")
        if not decode_levels(def_bytes, def_width, count).all_equal(max_def):
            raise Unsupported("nulls or empty lists")
        starts.append(decode_levels(rep_bytes, rep_width, count).positions_of(0) + seen)
        if encoding == PLAIN:
            pieces.append(_plain(values_bytes, dtype, count))
        elif encoding in (PLAIN_DICTIONARY, RLE_DICTIONARY) and dictionary is not None and len(values_bytes):
            width = values_bytes[0]
            if width > 32:
                raise Unsupported("dictionary index width")
            idx = decode_hybrid(values_bytes[1:], width, count).expand()
            if len(idx) and (idx.min() < 0 or idx.max() >= len(dictionary)):
                raise Unsupported("dictionary index out of range")
            pieces.append(dictionary[idx])
        else:
            raise Unsupported(f"encoding {encoding}")
        seen += count
    values = pieces[0] if len(pieces) == 1 else np.concatenate(pieces) if pieces else np.empty(0, dtype)
    return np.concatenate(starts) if starts else np.empty(0, dtype=np.int64), values


# --- a row group -------------------------------------------------------------------------------------
def _leaf_columns(pf: pq.ParquetFile) -> dict[str, int]:
    """Top-level field name -> its one leaf column index (fields with several leaves are left out)."""
    schema = pf.metadata.schema
    leaves: dict[str, list[int]] = {}
    for j in range(len(schema)):
        leaves.setdefault(schema.column(j).path.split(".")[0], []).append(j)
    return {name: js[0] for name, js in leaves.items() if len(js) == 1}


def read_list_columns(
    pf: pq.ParquetFile, fd: int, row_group: int, names: list[str]
) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """List columns ``names`` of row group ``row_group`` as ``{name: (offsets, values)}``, or None.

    ``pf`` gives the metadata, ``fd`` an open descriptor of the same file (read with ``os.pread``).
    ``offsets``: int64 ``(k + 1,)`` from 0; ``values``: the Arrow list's value type as a NumPy dtype (what
    ``utils.list_parts`` of Arrow's read gives). None when ``FAST_PARQUET`` is off or the row group holds
    anything ``decode_list_chunk`` does not handle: read it with Arrow then.
    """
    if not FAST_PARQUET:
        return None
    try:
        return _read(pf, fd, row_group, names)
    except Unsupported:
        return None


def _read(pf: pq.ParquetFile, fd: int, row_group: int, names: list[str]) -> dict:
    md = pf.metadata
    if not 0 <= row_group < md.num_row_groups:
        raise Unsupported("no such row group")
    rg = md.row_group(row_group)
    k = rg.num_rows
    leaf = _leaf_columns(pf)
    arrow_schema = pf.schema_arrow
    out = {}
    for name in names:
        if name not in leaf or arrow_schema.get_field_index(name) < 0:
            raise Unsupported(f"column {name}")
        atype = arrow_schema.field(name).type
        if not (pa.types.is_list(atype) or pa.types.is_large_list(atype)):
            raise Unsupported(f"{name} is not a list")
        vtype = atype.value_type
        if not (pa.types.is_integer(vtype) or pa.types.is_floating(vtype)) or pa.types.is_float16(vtype):
            raise Unsupported(f"{name} value type {vtype}")
        j = leaf[name]
        col, desc = rg.column(j), md.schema.column(j)
        if col.file_path:
            raise Unsupported("column chunk in another file")
        start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
        size = col.total_compressed_size
        if start is None or start < 0 or size <= 0:
            raise Unsupported("column chunk offsets")
        raw = os.pread(fd, size, start)
        if len(raw) != size:
            raise Unsupported("column chunk past the end of the file")
        row_starts, values = decode_list_chunk(
            memoryview(raw),
            col.compression,
            col.physical_type,
            desc.max_definition_level,
            desc.max_repetition_level,
            col.num_values,
        )
        if len(row_starts) != k or (k and row_starts[0] != 0) or len(values) != col.num_values:
            raise Unsupported("rows do not add up")
        offsets = np.empty(k + 1, dtype=np.int64)
        offsets[:k], offsets[k] = row_starts, len(values)
        target = np.dtype(vtype.to_pandas_dtype())
        if target != values.dtype:
            cast = values.astype(target)
            if not np.array_equal(cast, values):  # Arrow refuses values out of the logical type's range
                raise Unsupported(f"{name} values out of range of {vtype}")
            values = cast
        out[name] = (offsets, values)
    return out
