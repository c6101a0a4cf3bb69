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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtool.arrays import arrow_array, list_parts
from packtool.fileio import written_whole
from packtool.formats.base import (
    MAX_IMAGE_BYTES,
    UNIT_ERRORS,
    ShardMeta,
    ShardMismatch,
    ShardReader,
    ShardWriter,
    UnitReader,
    output_root,
    oversized_image,
    refuse_oversized_images,
)
from packtool.formats.options import OutputOptions
from packtool.formats.parquet_content import CONTENT_KEY, ContentRecord, record_digest, table_digests
from packtool.formats.parquet_page_headers import oversized_value
from packtool.manifest import (
    COLUMNS,
    CONTENT_DIGEST_MINOR,
    IMAGE_COLUMNS,
    SHARD_FORMAT_VERSION,
    Manifest,
    ShardEntry,
    strict_json,
)
from packtool.packs import PackArrays
from packtool.safepath import open_output_file
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
    a vision-language shard's ``image_bytes``, what its ``images`` bytes take uncompressed in its largest
    row group (the bound ``footer_problem`` holds the column to: the footer's own figure); and
    ``content_digest``, the digest of the shard's footer record of its row groups' digests
    (``parquet_content``; format 5.2 / 6.1 on). Any may be absent (``None``); any other field there is not
    this format's and is left alone.

    >>> ParquetFields.of(ShardEntry("p", 0, 3, 9, 10, "ab", fields={"row_groups": [2, 1], "x": 1}))
    ParquetFields(row_groups=[2, 1], row_group_offsets=None, image_bytes=None, content_digest=None)
    """

    row_groups: list[int] | None = None
    row_group_offsets: list[int] | None = None
    image_bytes: int | None = None
    content_digest: str | None = None

    @classmethod
    def of(cls, entry: ShardEntry) -> ParquetFields:
        f = entry.fields
        return cls(
            f.get("row_groups"), f.get("row_group_offsets"), f.get("image_bytes"), f.get("content_digest")
        )

    def to_dict(self) -> dict[str, Any]:
        images = {} if self.image_bytes is None else {"image_bytes": self.image_bytes}
        content = {} if self.content_digest is None else {"content_digest": self.content_digest}
        return {
            "row_groups": self.row_groups,
            "row_group_offsets": self.row_group_offsets,
            **images,
            **content,
        }


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
    refuse_oversized_images(packs.images)
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
    digests: list[list[str]] = []  # of each row group's columns (parquet_content), as written
    cut: list[int] = []  # the packs of each row group digested
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
                table = table.cast(writer.schema)
                digests.extend(table_digests(table, row_group_size))
                cut.extend(
                    min(row_group_size, table.num_rows - a) for a in range(0, table.num_rows, row_group_size)
                )
                writer.write_table(table, row_group_size=row_group_size)
            if writer is not None:
                record = ContentRecord(writer.schema.names, digests)
                writer.add_key_value_metadata({CONTENT_KEY: record.to_bytes()})
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise ValueError("write_parquet_shard: no packs to write")
    md = pq.ParquetFile(path).metadata
    groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    assert groups == cut, (groups, cut)  # Arrow cut the row groups where they were digested
    return ParquetFields(
        groups, row_group_offsets(md), image_bytes(md), record_digest(record.to_bytes())
    ).to_dict()


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
        meta = strict_json(raw) if raw else None
    except ValueError:  # (one nested past Python's recursion limit too)
        return None
    return meta if isinstance(meta, dict) else None


def column_parts(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
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
            offsets, values = column_parts(table, name)
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
    if (found := oversized_image(packs.images)) is not None:
        raise ValueError(
            f"column '{IMAGES}': image {found[0]} takes {found[2]:,} bytes, over {MAX_IMAGE_BYTES:,}"
        )
    return packs


@dataclass
class OpenShard:
    """A Parquet shard of an output open for reading (``open_shard``): the file, Arrow's reader of it and
    its content record (``None`` for a shard written before content digests, or read without checks)."""

    file: BinaryIO
    parquet: pq.ParquetFile
    content: ContentRecord | None

    def read(self, row_group: int, columns: list[str] | None = None) -> pa.Table:
        """Row group ``row_group`` (``columns`` of it, all by default), checked against the content record:
        ``ShardMismatch`` naming the row group and column that is not what was written."""
        table = self.parquet.read_row_group(row_group, columns=columns, use_threads=False)
        if self.content is not None and (problem := self.content.problem(table, row_group)) is not None:
            raise ShardMismatch(problem)
        return table

    def close(self) -> None:
        self.parquet.close()
        self.file.close()


def open_shard(directory: Path, manifest: Manifest, shard: int, verify_checksums: bool = True) -> OpenShard:
    """Shard ``shard`` of the output ``directory`` open, once it is known to be the manifest's: a regular
    file inside the directory (``safepath.open_output_file``, as it is opened), of this run, at its place
    in the shard list, with a footer that declares no more than the manifest's packs hold
    (``footer_problem``), no image over ``MAX_IMAGE_BYTES`` (``image_cells_problem``: before any page is
    decoded) and, with ``verify_checksums``, the content record the manifest's
    ``content_digest`` names (``content_record``; each row group read is then checked against it, as
    Arrow checks each page's CRC-32). Raises ``ShardMismatch`` (or ``InputError`` for the file) saying
    what is wrong."""
    entry = manifest.shards[shard]
    f = open_output_file(directory, entry.path)
    try:
        pf = pq.ParquetFile(f, page_checksum_verification=verify_checksums)
    except BaseException:
        f.close()
        raise
    try:
        meta = shard_metadata(pf)
        if meta is not None and meta.get("run_id") != manifest.run_id:
            raise ShardMismatch(f"shard of run {meta.get('run_id')}, the manifest is run {manifest.run_id}")
        first = sum(e.num_packs for e in manifest.shards[:shard])
        for key, want in (("shard", shard), ("first_pack", first)):
            if meta is not None and meta.get(key, want) != want:  # a shard list duplicated or reordered
                raise ShardMismatch(f"the shard's own {key} is {meta.get(key)}, the manifest's {want}")
        if (problem := footer_problem(pf.metadata, entry, manifest.packed_sequence_size)) is not None:
            raise ShardMismatch(problem)
        if manifest.image_columns is not None and (problem := image_cells_problem(f.fileno(), pf)):
            raise ShardMismatch(problem)
        record = content_record(pf.metadata, entry, manifest) if verify_checksums else None
    except BaseException:
        pf.close()
        f.close()
        raise
    return OpenShard(f, pf, record)


def content_record(md: pq.FileMetaData, entry: ShardEntry, manifest: Manifest) -> ContentRecord | None:
    """The content record in a shard's footer (``parquet_content``), once it is the one the manifest entry's
    ``content_digest`` names; None for a shard of an output written before content digests (its manifest
    says an older format and records none). ``ShardMismatch`` when the two do not go together: one
    without the other, or another record than the one named."""
    raw = (md.metadata or {}).get(CONTENT_KEY)
    named = ParquetFields.of(entry).content_digest
    if named is None and (raw is not None or content_required(manifest)):
        written = f", which format_version {manifest.version} writes" if content_required(manifest) else ""
        carried = ", though the shard carries a content record" if raw is not None else ""
        raise ShardMismatch(
            f"the manifest records no content_digest for it{written}{carried} (an edited manifest)"
        )
    if named is None:
        return None  # an output written before content digests
    if raw is None:
        raise ShardMismatch(
            "it carries no content record of its row groups, the manifest's content_digest names one "
            "(a shard rewritten or replaced)"
        )
    if record_digest(raw) != named:
        raise ShardMismatch(
            "its content record is not the one the manifest's content_digest names (a shard rewritten or "
            "replaced, or an edited manifest)"
        )
    try:
        record = ContentRecord.parse(raw)
    except ValueError as e:
        raise ShardMismatch(str(e)) from None
    if len(record.row_groups) != md.num_row_groups:
        raise ShardMismatch(
            f"its content record digests {len(record.row_groups)} row groups, its footer declares "
            f"{md.num_row_groups}"
        )
    return record


def content_required(manifest: Manifest) -> bool:
    """Whether every Parquet shard entry of ``manifest`` records a ``content_digest`` (its format_version:
    5.2 or 6.1 on, ``manifest.CONTENT_DIGEST_MINOR``)."""
    major, minor = manifest.format_version, manifest.format_minor
    if major in CONTENT_DIGEST_MINOR:
        return minor >= CONTENT_DIGEST_MINOR[major]
    return major > max(CONTENT_DIGEST_MINOR)


class ParquetUnitReader(UnitReader):
    """Row groups of an output's Parquet shards (``open_shard``); the last few files stay open."""

    def __init__(
        self, directory: Path, manifest: Manifest, keep_open: int = 8, verify_checksums: bool = True
    ) -> None:
        self.directory, self.manifest, self.keep_open = Path(directory), manifest, keep_open
        self.verify_checksums = verify_checksums  # pages' CRC-32s and the row groups' content digests
        self.files: OrderedDict[int, OpenShard] = OrderedDict()

    def _file(self, shard: int) -> OpenShard:
        if shard in self.files:
            self.files.move_to_end(shard)
            return self.files[shard]
        self.files[shard] = open_shard(self.directory, self.manifest, shard, self.verify_checksums)
        while len(self.files) > self.keep_open:
            self.files.popitem(last=False)[1].close()
        return self.files[shard]

    def read_stored(self, shard: int, part: int, columns: list[str]) -> PackArrays:
        entry = self.manifest.shards[shard]
        want = [c for c in [*self.manifest.columns, *(self.manifest.image_columns or ())] if c in columns]
        table = self._file(shard).read(part, want)
        expected = (ParquetFields.of(entry).row_groups or [entry.num_packs])[part]
        if table.num_rows != expected:
            raise ShardMismatch(f"{table.num_rows} packs, the manifest says {expected}")
        return table_packs(table, self.manifest.packed_sequence_size)

    def close(self) -> None:
        for shard in self.files.values():
            shard.close()
        self.files.clear()


def footer_problem(md: pq.FileMetaData, entry: ShardEntry, n: int, exact: bool = True) -> str | None:
    """What the footer ``md`` declares beyond what shard ``entry`` of packs of ``n`` tokens may hold, or
    None: checked before any page is decoded, so that a small file declaring billions of values cannot
    make a reader allocate them. Its rows must be the entry's packs (row group by row group when the entry
    lists them); no column chunk may declare more than ``rows * (n + 1)`` values (the most a column holds:
    a token column ``n`` a pack, the piece columns at most ``n + 1``) or more than 16 bytes a value
    uncompressed (8 for the widest dtype, the rest for levels and page headers), plus 64 KiB. The images'
    bytes of a vision-language shard may take more: the ``image_bytes`` its entry records, and no more than
    ``MAX_IMAGE_BYTES`` an image (a value of the column); that figure must be the footer's own
    (``image_bytes_problem``). With ``exact=False`` (``verify``, which reports the counts and the figure
    itself) fewer rows than the entry's pass, and another figure."""
    groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    if sum(groups) > entry.num_packs or (exact and sum(groups) != entry.num_packs):
        return f"its footer declares {sum(groups):,} packs, the manifest {entry.num_packs:,}"
    recorded = ParquetFields.of(entry).row_groups
    if exact and recorded is not None and groups != list(recorded):
        return f"its footer declares row groups {groups}, the manifest {recorded}"
    images = ParquetFields.of(entry).image_bytes
    for i, rows in enumerate(groups):
        rg = md.row_group(i)
        most = rows * (n + 1)
        for j in range(rg.num_columns):
            col = rg.column(j)
            extra = 0
            if col.path_in_schema == IMAGE_BYTES_PATH:  # its values are images: each at most MAX_IMAGE_BYTES
                extra = min(images or 0, col.num_values * (MAX_IMAGE_BYTES + 4))
            if col.num_values > most or col.total_uncompressed_size > 16 * most + (1 << 16) + extra:
                return (
                    f"row group {i}, column {col.path_in_schema}: its footer declares {col.num_values:,} "
                    f"values ({col.total_uncompressed_size:,} bytes), more than {rows:,} packs of {n} hold"
                )
    return image_bytes_problem(md, entry) if exact else None


def image_cells_problem(fd: int, pf: pq.ParquetFile) -> str | None:
    """The first image of the open shard ``pf`` (file descriptor ``fd``) over ``MAX_IMAGE_BYTES``, as a
    sentence naming its row group, or a page of its images that cannot be measured; None when none is.
    Read from the pages' headers and the values' lengths, before any page is decoded
    (``parquet_page_headers.oversized_value``): the footer bounds what a row group's images take between them,
    not what one takes."""
    md = pf.metadata
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        for j in range(rg.num_columns):
            col = rg.column(j)
            if col.path_in_schema != IMAGE_BYTES_PATH:
                continue
            column = pf.schema.column(j)
            levels = (column.max_repetition_level > 0) + (column.max_definition_level > 0)
            start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
            where = f"row group {i}, column {IMAGE_BYTES_PATH}"
            try:
                found = oversized_value(
                    fd, start, start + col.total_compressed_size, col.compression, levels, MAX_IMAGE_BYTES
                )
            except (ValueError, OSError) as e:
                return f"{where}: {e}"
            if found is not None:
                return (
                    f"{where}: image {found[0]} takes {found[1]:,} bytes, over the {MAX_IMAGE_BYTES:,} an "
                    "image may take (read before any page is decoded)"
                )
    return None


def image_bytes_problem(md: pq.FileMetaData, entry: ShardEntry) -> str | None:
    """Why the entry's ``image_bytes`` is not its footer's own figure (``image_bytes``: an edited manifest,
    or a shard written again), or None."""
    recorded, found = ParquetFields.of(entry).image_bytes, image_bytes(md)
    if recorded is None or recorded == found:
        return None
    return f"its footer's images take {found or 0:,} bytes, the manifest's image_bytes says {recorded:,}"


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
        """Pack ``row`` of the shard, its row group read and checked as readers read it (``open_shard``);
        None when it cannot be (then read in order, ``ParquetChecker.check`` says why)."""
        row_groups = ParquetFields.of(entry).row_groups
        if not row_groups:
            return None
        bounds = np.cumsum([0, *row_groups])
        rg = int(np.searchsorted(bounds, row, side="right") - 1)
        shard = next(i for i, e in enumerate(manifest.shards) if e is entry)
        try:
            opened = open_shard(output_root(path, entry), manifest, shard)
        except UNIT_ERRORS:  # not the manifest's shard, or damaged
            return None
        try:
            table = opened.read(rg).slice(row - int(bounds[rg]), 1)
            return table_packs(table, manifest.packed_sequence_size)
        except UNIT_ERRORS:
            return None
        finally:
            opened.close()

    def summary(self, path: Path) -> dict[str, Any]:
        with open_output_file(path.parent, path.name) as f, pq.ParquetFile(f) as pf:
            md = pf.metadata
            meta = shard_metadata(pf) or {}
            content = (md.metadata or {}).get(CONTENT_KEY)
            return {
                "run_id": meta.get("run_id"),
                "shard": meta.get("shard"),
                "num_packs": md.num_rows,
                "row_groups": [md.row_group(i).num_rows for i in range(md.num_row_groups)],
                **({} if content is None else {"content_digest": record_digest(content)}),
            }
