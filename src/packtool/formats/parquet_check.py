"""``verify``'s checks of a Parquet shard (``ParquetChecker``): its footer before any page is decoded, its
metadata and content record against the manifest, then every row group: its content digests, and its lists'
lengths (what ``PackArrays`` needs to hold them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from packtool.formats.base import ProblemSink, ShardChecker, ShardMismatch, shard_meta_problems
from packtool.formats.parquet import (
    ParquetFields,
    column_parts,
    content_record,
    footer_problem,
    image_bytes_problem,
    image_cells_problem,
    shard_metadata,
    with_images,
)
from packtool.manifest import COLUMNS, Manifest, ShardEntry
from packtool.packs import PackArrays
from packtool.schema import IMAGES


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
        shard_meta_problems(shard_metadata(pf), manifest, index, report, name, base)
        if (problem := footer_problem(md, entry, n, exact=False)) is not None:  # nothing decoded past N
            report.add("size", problem, shard=name, field="num_packs")
            return
        if (problem := image_bytes_problem(md, entry)) is not None:  # (the bound above is the entry's)
            report.add("image_bytes", problem, shard=name, field="image_bytes")
        if manifest.image_columns is not None:  # each image measured before any page is decoded
            with open(path, "rb") as f:
                problem = image_cells_problem(f.fileno(), pf)
            if problem is not None:
                report.add("images", problem, shard=name, field=IMAGES)
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
        try:
            content = content_record(md, entry, manifest)
        except ShardMismatch as e:  # its row groups cannot be told to be the run's (their packs are checked)
            report.add("content", str(e), shard=name, field="content_digest")
            content = None
        first = 0
        for rg, rows in enumerate(groups):
            try:
                table = pf.read_row_group(rg)
            except Exception as e:
                message = f"row group {rg} does not parse: {str(e).splitlines()[0]}"
                report.add("parse", message, shard=name, pack=base + first)
                first += rows
                continue
            if content is not None and (problem := content.problem(table, rg)) is not None:
                # (its packs are still checked, and yielded: what else is wrong with them is said too)
                report.add("content", problem, shard=name, pack=base + first)
            parts = {c: column_parts(table, c)[::-1] for c in table.column_names if c in COLUMNS}
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
