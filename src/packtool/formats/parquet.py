"""Parquet shards ``packs-NNNNNN.parquet``: zstd, one row per pack, row groups of ``row_group_size`` packs.

Every column is a list of its ``packtool.manifest.PACK_COLUMNS`` dtype (``list<int32>``; ``loss_mask``:
``list<int8>``, ``sample_index``/``sample_offset``: ``list<int64>``), what ``datasets``, NeMo and pandas
read as they are; which columns the shards hold is the manifest's ``columns`` (``packtool.layout``). The
file's key-value metadata ``packtool`` holds ``{"run_id", "shard", "first_pack", "packed_sequence_size"}``,
so a shard can be matched to its manifest.

A read unit is a row group: the loader decodes one at a time with Arrow.

A vision-language output (``Manifest.image_columns``) adds, per pack, ``images``
(``list<struct<bytes: binary, path: string>>``: each image's encoded bytes as read and its name, the
struct ``datasets.Image`` stores) and the per-image ``list<int32>`` columns (``image_sample``,
``image_offset``, ``image_length``, ``image_height``, ``image_width``); the schema then carries the
``huggingface`` features metadata (``hf_features``), so that ``datasets`` types ``images`` as images.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtool.arrays import arrow_array, list_parts
from packtool.fileio import written_whole
from packtool.formats.base import (
    ProblemSink,
    ShardChecker,
    ShardMeta,
    ShardMismatch,
    ShardReader,
    ShardWriter,
    UnitReader,
    shard_meta_problems,
)
from packtool.formats.options import OutputOptions
from packtool.manifest import COLUMNS, IMAGE_COLUMNS, SHARD_FORMAT_VERSION, Manifest, ShardEntry
from packtool.packs import PackArrays
from packtool.schema import IMAGES
from packtool.threads import prefetch

METADATA_KEY = b"packtool"
# tokens gathered into packs at once when writing (whole row groups): fewer, larger gathers visit each
# chunk fewer times, while a block's arrays stay small (docs/performance.md has the measurements)
GATHER_TOKENS = 1 << 20


@dataclass(frozen=True)
class ParquetFields:
    """A Parquet shard entry's own fields (``ShardEntry.fields``): ``row_groups``, the packs of each row
    group (the loader's read units), and ``row_group_offsets``, the byte offset of each, then the end;
    a vision-language shard's ``image_bytes``, what its ``images`` bytes take uncompressed (the bound
    ``footer_problem`` holds the column to). Any may be absent (``None``); any other field there is not
    this format's and is left alone.

    >>> ParquetFields.of(ShardEntry("p", 0, 3, 9, 10, "ab", fields={"row_groups": [2, 1], "x": 1}))
    ParquetFields(row_groups=[2, 1], row_group_offsets=None, image_bytes=None)
    """

    row_groups: list[int] | None = None
    row_group_offsets: list[int] | None = None
    image_bytes: int | None = None

    @classmethod
    def of(cls, entry: ShardEntry) -> ParquetFields:
        f = entry.fields
        return cls(f.get("row_groups"), f.get("row_group_offsets"), f.get("image_bytes"))

    def to_dict(self) -> dict[str, Any]:
        images = {} if self.image_bytes is None else {"image_bytes": self.image_bytes}
        return {"row_groups": self.row_groups, "row_group_offsets": self.row_group_offsets, **images}


# --- writing -------------------------------------------------------------------------------------------
def _list(values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType) -> pa.Array:
    if offsets[-1] < np.iinfo(np.int32).max:
        return pa.ListArray.from_arrays(arrow_array(offsets, pa.int32()), arrow_array(values, value_type))
    return pa.LargeListArray.from_arrays(arrow_array(offsets, pa.int64()), arrow_array(values, value_type))


_ARROW = {
    np.dtype(np.int8): pa.int8(),
    np.dtype(np.uint8): pa.uint8(),
    np.dtype(np.int32): pa.int32(),
    np.dtype(np.int64): pa.int64(),
}


IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # datasets.Image's storage
IMAGE_BYTES_PATH = f"{IMAGES}.list.element.bytes"  # the column chunk of the images' bytes


def packs_table(packs: PackArrays) -> pa.Table:
    """The packs as one Arrow table in the stored column order (one row per pack): every column held,
    ``images`` before the per-image columns when the packs have images."""
    cols = {}
    for name in packs.present():
        if name == IMAGE_COLUMNS[1] and packs.images is not None:
            offsets = arrow_array(packs.image_sample_offsets, pa.int32())
            cols[IMAGES] = pa.ListArray.from_arrays(offsets, packs.images.cast(IMAGE))
        values, offsets = packs.parts(name)
        cols[name] = _list(values, offsets, _ARROW[COLUMNS[name].dtype])
    table = pa.table(cols)
    return table if packs.images is None else table.replace_schema_metadata(hf_features(table.schema))


def hf_features(schema: pa.Schema) -> dict[bytes, bytes]:
    """The ``huggingface`` schema metadata of a table of packs (what ``datasets.Features.arrow_schema``
    writes): every column a list of its value type, ``images`` a list of ``Image``, so that
    ``datasets.load_dataset`` decodes the images.

    >>> hf_features(pa.schema([("input_ids", pa.list_(pa.int32()))]))[b"huggingface"][:40]
    b'{"info": {"features": {"input_ids": {"fe'
    """
    features = {}
    for f in schema:
        if f.name == IMAGES:
            inner = {"decode": True, "_type": "Image"}
        else:
            inner = {"dtype": str(f.type.value_type), "_type": "Value"}
        features[f.name] = {"feature": inner, "_type": "List"}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def write_parquet_shard(
    path: str | Path, packs: PackArrays | Iterable[PackArrays], *, row_group_size: int, metadata: dict
) -> dict:
    """Write ``packs`` to ``path``, whole or not at all (``written_whole``); return its row groups.

    ``packs`` is one ``PackArrays`` or an iterable of them (e.g. a few row groups each, built lazily so that
    a whole shard is never held in memory).
    """
    path = Path(path)
    blocks = [packs] if isinstance(packs, PackArrays) else packs
    with written_whole(path) as tmp:
        writer = None
        try:
            # the next block's tokens are gathered (NumPy, mostly holding the GIL) while Arrow encodes and
            # compresses this one (C++, without it)
            for table in prefetch(packs_table(block) for block in blocks):
                own = {METADATA_KEY: json.dumps(metadata, sort_keys=True).encode()}
                table = table.replace_schema_metadata({**(table.schema.metadata or {}), **own})
                if writer is None:
                    writer = pq.ParquetWriter(
                        tmp,
                        table.schema,
                        compression="zstd",
                        use_dictionary=False,
                        write_statistics=False,
                        store_schema=True,
                        write_page_checksum=True,  # CRC-32 per page: readers check what they decode
                    )
                writer.write_table(table.cast(writer.schema), row_group_size=row_group_size)
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise ValueError("write_parquet_shard: no packs to write")
    md = pq.ParquetFile(path).metadata
    groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    return ParquetFields(groups, row_group_offsets(md), image_bytes(md)).to_dict()


def image_bytes(md: pq.FileMetaData) -> int | None:
    """What the ``images`` column's bytes take uncompressed in the file (its row groups' largest), or None
    for a shard without images."""
    sizes = [
        rg.column(j).total_uncompressed_size
        for rg in (md.row_group(i) for i in range(md.num_row_groups))
        for j in range(rg.num_columns)
        if rg.column(j).path_in_schema == IMAGE_BYTES_PATH
    ]
    return max(sizes) if sizes else None


def row_group_offsets(md: pq.FileMetaData) -> list[int]:
    """Byte offset where each row group's first page starts, then where the last row group ends
    (``num_row_groups + 1`` values, the same convention as a tar shard's ``.tar.idx``)."""
    out: list[int] = []
    end = 4  # after the leading "PAR1" magic
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        cols = [rg.column(j) for j in range(rg.num_columns)]
        start = min(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in cols)
        out.append(int(start))
        end = int(start + sum(c.total_compressed_size for c in cols))
    return out + [end]


class ParquetWriter(ShardWriter):
    """Writes ``packs-NNNNNN.parquet``: row groups of ``row_group_size`` packs, gathered a block of whole
    row groups at a time (``block_packs``)."""

    suffix = ".parquet"

    def block_packs(self, options: OutputOptions, packed_sequence_size: int) -> int:
        rg = options.parquet.row_group_size
        return max(rg, GATHER_TOKENS // packed_sequence_size // rg * rg)

    def write(
        self, path: Path, blocks: Iterable[PackArrays], meta: ShardMeta, options: OutputOptions
    ) -> dict:
        metadata = {
            "run_id": meta.run_id,
            "packed_sequence_size": meta.packed_sequence_size,
            "format_version": SHARD_FORMAT_VERSION,
            "first_pack": meta.first_pack,
            "shard": meta.shard,
        }
        return write_parquet_shard(
            path, blocks, row_group_size=options.parquet.row_group_size, metadata=metadata
        )


# --- reading -------------------------------------------------------------------------------------------
def shard_metadata(pf: pq.ParquetFile) -> dict | None:
    """The ``packtool`` key-value metadata of an open shard (None if it has none or it does not parse)."""
    raw = (pf.schema_arrow.metadata or {}).get(METADATA_KEY)
    try:
        meta = json.loads(raw) if raw else None
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def _column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    col = table.column(name)
    # a row group read is one chunk: combine_chunks would copy it anyway
    return list_parts(col.chunk(0) if col.num_chunks == 1 else col.combine_chunks())


def table_packs(table: pa.Table, n: int) -> PackArrays:
    """The packs of a table (a row group) as ``PackArrays`` of NumPy views, without a loop over packs.

    Raises ``ValueError`` if a fixed-width column does not hold its width (``N`` for a per-token one) in
    every row, or the per-piece columns disagree on a pack's piece count.
    """
    parts = {}
    for name in table.column_names:
        if name in COLUMNS:
            offsets, values = _column(table, name)
            parts[name] = (values, offsets)
    packs = PackArrays.from_parts(parts, n)
    if IMAGES in table.column_names:
        with_images(packs, table)
    return packs


def with_images(packs: PackArrays, table: pa.Table) -> PackArrays:
    """``packs`` (read from ``table``) with the table's ``images`` column as ``packs.images``; ``ValueError``
    when it is not ``list<struct<bytes, path>>`` or does not hold one image per ``image_*`` value."""
    column = table.column(IMAGES)
    images = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if not (pa.types.is_list(images.type) and images.type.value_type.equals(IMAGE)):
        raise ValueError(f"column '{IMAGES}' is {images.type}, not {pa.list_(IMAGE)}")
    offsets = np.asarray(images.offsets, dtype=np.int64)
    counted = packs.image_sample_offsets
    if counted is not None and not np.array_equal(offsets - offsets[0], counted):
        raise ValueError(f"column '{IMAGES}' does not hold one value per image in every row")
    packs.images = images.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    packs.image_sample_offsets = offsets - offsets[0]
    return packs


class ParquetUnitReader(UnitReader):
    """Row groups of an output's Parquet shards; the last few files stay open."""

    def __init__(
        self, directory: Path, manifest: Manifest, keep_open: int = 8, verify_checksums: bool = True
    ) -> None:
        self.directory, self.manifest, self.keep_open = Path(directory), manifest, keep_open
        self.verify_checksums = verify_checksums  # pages' CRC-32, checked by Arrow as it decodes them
        self.files: OrderedDict[int, pq.ParquetFile] = OrderedDict()

    def _file(self, shard: int) -> pq.ParquetFile:
        if shard in self.files:
            self.files.move_to_end(shard)
            return self.files[shard]
        path = self.directory / self.manifest.shards[shard].path
        pf = pq.ParquetFile(path, page_checksum_verification=self.verify_checksums)
        meta = shard_metadata(pf)
        if meta is not None and meta.get("run_id") != self.manifest.run_id:
            pf.close()
            raise ShardMismatch(
                f"shard of run {meta.get('run_id')}, the manifest is run {self.manifest.run_id}"
            )
        first = sum(e.num_packs for e in self.manifest.shards[:shard])
        for key, want in (("shard", shard), ("first_pack", first)):
            if meta is not None and meta.get(key, want) != want:  # a shard list duplicated or reordered
                pf.close()
                raise ShardMismatch(f"the shard's own {key} is {meta.get(key)}, the manifest's {want}")
        entry = self.manifest.shards[shard]
        if (problem := footer_problem(pf.metadata, entry, self.manifest.packed_sequence_size)) is not None:
            pf.close()
            raise ShardMismatch(problem)
        self.files[shard] = pf
        while len(self.files) > self.keep_open:
            self.files.popitem(last=False)[1].close()
        return pf

    def read_stored(self, shard: int, part: int, columns: list[str]) -> PackArrays:
        entry = self.manifest.shards[shard]
        want = [c for c in [*self.manifest.columns, *(self.manifest.image_columns or ())] if c in columns]
        table = self._file(shard).read_row_group(part, columns=want, use_threads=False)
        expected = (ParquetFields.of(entry).row_groups or [entry.num_packs])[part]
        if table.num_rows != expected:
            raise ShardMismatch(f"{table.num_rows} packs, the manifest says {expected}")
        return table_packs(table, self.manifest.packed_sequence_size)

    def close(self) -> None:
        for pf in self.files.values():
            pf.close()
        self.files.clear()


def footer_problem(md: pq.FileMetaData, entry: ShardEntry, n: int, exact: bool = True) -> str | None:
    """What the footer ``md`` declares beyond what shard ``entry`` of packs of ``n`` tokens may hold, or
    None: checked before any page is decoded, so that a small file declaring billions of values cannot
    make a reader allocate them. Its rows must be the entry's packs (row group by row group when the entry
    lists them); no column chunk may declare more than ``rows * (n + 1)`` values (the most a column holds:
    a token column ``n`` a pack, the piece columns at most ``n + 1``) or more than 16 bytes a value
    uncompressed (8 for the widest dtype, the rest for levels and page headers), plus 64 KiB; the images'
    bytes of a vision-language shard may take the ``image_bytes`` its entry records more. With
    ``exact=False`` (``verify``, which reports the counts itself) fewer rows than the entry's pass."""
    groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    if sum(groups) > entry.num_packs or (exact and sum(groups) != entry.num_packs):
        return f"its footer declares {sum(groups):,} packs, the manifest {entry.num_packs:,}"
    recorded = ParquetFields.of(entry).row_groups
    if exact and recorded is not None and groups != list(recorded):
        return f"its footer declares row groups {groups}, the manifest {recorded}"
    images = ParquetFields.of(entry).image_bytes or 0
    for i, rows in enumerate(groups):
        rg = md.row_group(i)
        most = rows * (n + 1)
        for j in range(rg.num_columns):
            col = rg.column(j)
            extra = images if col.path_in_schema == IMAGE_BYTES_PATH else 0
            if col.num_values > most or col.total_uncompressed_size > 16 * most + (1 << 16) + extra:
                return (
                    f"row group {i}, column {col.path_in_schema}: its footer declares {col.num_values:,} "
                    f"values ({col.total_uncompressed_size:,} bytes), more than {rows:,} packs of {n} hold"
                )
    return None


class ParquetReader(ShardReader):
    """Reads Parquet shards: a read unit is a row group (``ParquetFields.row_groups``)."""

    unit_kind = "row group"

    def units(self, entry: ShardEntry) -> list[int]:
        return list(ParquetFields.of(entry).row_groups or [entry.num_packs])

    def entry_fields(self, entry: ShardEntry) -> ParquetFields:
        return ParquetFields.of(entry)

    def open_reader(
        self, directory: Path, manifest: Manifest, verify_checksums: bool = True
    ) -> ParquetUnitReader:
        return ParquetUnitReader(directory, manifest, verify_checksums=verify_checksums)

    def read_stored_pack(
        self, path: Path, entry: ShardEntry, row: int, manifest: Manifest
    ) -> PackArrays | None:
        row_groups = ParquetFields.of(entry).row_groups
        if not row_groups:
            return None
        bounds = np.cumsum([0, *row_groups])
        rg = int(np.searchsorted(bounds, row, side="right") - 1)
        try:
            pf = pq.ParquetFile(path, page_checksum_verification=True)
            if footer_problem(pf.metadata, entry, manifest.packed_sequence_size) is not None:
                return None  # read in order, where check says what is wrong
            table = pf.read_row_group(rg).slice(row - int(bounds[rg]), 1)
            return table_packs(table, manifest.packed_sequence_size)
        except (pa.ArrowException, OSError, ValueError, KeyError):  # damaged, or not the manifest's
            return None

    def summary(self, path: Path) -> dict[str, Any]:
        pf = pq.ParquetFile(path)
        md = pf.metadata
        meta = shard_metadata(pf) or {}
        return {
            "run_id": meta.get("run_id"),
            "shard": meta.get("shard"),
            "num_packs": md.num_rows,
            "row_groups": [md.row_group(i).num_rows for i in range(md.num_row_groups)],
        }


# --- checking ------------------------------------------------------------------------------------------
def _rows_of(
    offsets: np.ndarray, want: np.ndarray, what: str, first: int, name: str, col: str, report: ProblemSink
) -> bool:
    """Whether every row of a list column holds ``want`` values (an int, or one per row); the rows that
    do not are reported (``what``: what the expected count is)."""
    lens = np.diff(offsets)
    bad = np.flatnonzero(lens != want)
    expected = np.broadcast_to(want, lens.shape)
    problems = ((f"has {lens[i]} values, expected {what} {expected[i]}", first + int(i)) for i in bad)
    report.add_many("length", len(bad), problems, shard=name, field=col)
    return not len(bad)


class ParquetChecker(ShardChecker):
    """``verify``'s checks of a Parquet shard: its footer before any page, then every row group's lists."""

    def check(
        self, path: Path, entry: ShardEntry, manifest: Manifest, report: ProblemSink, index: int, base: int
    ) -> Iterator[tuple[int, PackArrays]]:
        name, n = entry.path, manifest.packed_sequence_size
        try:
            pf = pq.ParquetFile(path, page_checksum_verification=True)
            md = pf.metadata
        except Exception as e:  # any parse failure of a damaged file
            report.add("parse", f"does not parse as Parquet: {str(e).splitlines()[0]}", shard=name)
            return
        shard_meta_problems(shard_metadata(pf), manifest, index, report, name)
        if (problem := footer_problem(md, entry, n, exact=False)) is not None:  # nothing decoded past N
            report.add("size", problem, shard=name, field="num_packs")
            return
        if md.num_rows != entry.num_packs:
            report.add(
                "num_packs",
                f"holds {md.num_rows} packs, manifest says {entry.num_packs}",
                shard=name,
                field="num_packs",
            )
        groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        recorded = ParquetFields.of(entry).row_groups
        if recorded is not None and groups != recorded:
            report.add(
                "index",
                f"row groups {groups} differ from the manifest's index {recorded} (stale index)",
                shard=name,
                field="row_groups",
            )
        need = [
            c for c in [*manifest.columns, *(manifest.image_columns or ())] if c not in pf.schema_arrow.names
        ]
        if need:
            report.add("columns", f"missing column(s) {', '.join(need)}", shard=name)
            return
        first = 0
        for rg, rows in enumerate(groups):
            try:
                table = pf.read_row_group(rg)
            except Exception as e:
                message = f"row group {rg} does not parse: {str(e).splitlines()[0]}"
                report.add("parse", message, shard=name, pack=base + first)
                first += rows
                continue
            parts = {c: _column(table, c)[::-1] for c in table.column_names if c in COLUMNS}
            sound, at = True, base + first
            for col, (_, offsets) in parts.items():
                column = COLUMNS[col]
                if (width := column.width(n)) is not None:
                    what = "packed_sequence_size" if column.per == "token" else "ceil(N / 8) ="
                    sound &= _rows_of(offsets, width, what, at, name, col, report)
                elif column.per == "piece" and col != "sample_index" and "sample_index" in parts:
                    pieces = np.diff(parts["sample_index"][1])  # as many values as sample_index entries
                    sound &= _rows_of(offsets, pieces, "one per sample_index entry:", at, name, col, report)
            if sound:
                # every stored column as stored: sample_offset says where each piece starts in its sample
                # (bfd shuffles packs, so pack order does not say)
                packs = PackArrays.from_parts(parts, n)
                if IMAGES in table.column_names:
                    try:
                        with_images(packs, table)
                    except ValueError as e:
                        report.add("images", str(e), shard=name, pack=at, field=IMAGES)
                yield first, packs
            first += rows
