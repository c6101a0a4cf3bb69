"""``formats.parquet_page_headers``: page headers parsed from untrusted bytes, and the lengths of a column
chunk's values read before any page is decoded, for the codecs and page layouts packtool writes (and Arrow's
defaults), with every other one refused in a sentence."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.formats.parquet_page_headers import oversized_value, page_header, pages

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def images_file(path: Path, sizes: list[list[int]], **settings) -> Path:
    """A Parquet file of one ``images`` column (``list<struct<bytes, path>>``, as packtool writes it): a
    row per list of sizes, each image that many random bytes."""
    rows = [[{"bytes": os.urandom(s), "path": f"{k}.png"} for k, s in enumerate(row)] for row in sizes]
    table = pa.table({"images": pa.array(rows, pa.list_(IMAGE))})
    pq.write_table(table, path, **{"use_dictionary": False, "write_statistics": False, **settings})
    return path


def scan(path: Path, limit: int) -> tuple[int, int] | None:
    """``oversized_value`` of the images' bytes of row group 0 of ``path``."""
    col = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert col.path_in_schema == "images.list.element.bytes"
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    fd = os.open(path, os.O_RDONLY)
    try:
        return oversized_value(fd, start, start + col.total_compressed_size, col.compression, 2, limit)
    finally:
        os.close(fd)


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_the_first_value_over_the_limit_is_found_before_decoding(tmp_path, compression):
    path = images_file(
        tmp_path / "a.parquet", [[100, 300_000], [50_000, 2_000_000, 10]], compression=compression
    )
    assert scan(path, 1 << 20) == (3, 2_000_000)  # image 3 of the row group, in reading order
    assert scan(path, 4 << 20) is None


def test_pages_add_up_to_what_the_footer_declares(tmp_path):
    path = images_file(tmp_path / "a.parquet", [[700_000] * 3, [5] * 4], compression="zstd")
    col = pq.ParquetFile(path).metadata.row_group(0).column(0)
    fd = os.open(path, os.O_RDONLY)
    try:
        found = list(pages(fd, col.data_page_offset, col.data_page_offset + col.total_compressed_size))
    finally:
        os.close(fd)
    assert sum(h.size + h.uncompressed_size for _, h in found) == col.total_uncompressed_size
    assert sum(h.num_values for _, h in found) == 7


def test_a_large_page_that_cannot_be_measured_is_refused(tmp_path):
    path = images_file(tmp_path / "a.parquet", [[300_000] * 4], compression="snappy")
    with pytest.raises(ValueError, match="whose values cannot be measured before it is decoded"):
        scan(path, 1 << 20)


@pytest.mark.parametrize(
    "header, error",
    [
        (bytes([0x15, 0x00, 0x15]), IndexError),  # cut inside a field
        (bytes([0x15, 0x00, 0x15, 0x03, 0x15, 0x20, 0x00]), ValueError),  # uncompressed size -2
        (bytes([0x15, 0x00, 0x00]), ValueError),  # no sizes
        (bytes([0x15, 0x00]) + bytes([0x1C]) * 40, ValueError),  # structures nested 40 deep
        (bytes([0x15]) + bytes([0xFF]) * 11, ValueError),  # a varint past 64 bits
    ],
)
def test_a_damaged_header_raises_what_the_reader_reports(header, error):
    with pytest.raises(error):
        page_header(header)
