"""packtool.parquet_pages against Arrow's own read of the same row groups, on many layouts and fallbacks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool import parquet_pages
from packtool.loader import Unit, _ParquetFiles, read_parquet_unit
from packtool.parquet_pages import decode_hybrid, read_list_columns
from packtool.utils import list_parts


def lists(rng: np.random.Generator, rows: int, dtype, low: int, high: int, lengths=None) -> pa.Array:
    lengths = rng.integers(1, 300, rows) if lengths is None else np.asarray(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(low, high, int(offsets[-1])).astype(dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def table(seed: int = 0, rows: int = 300) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "input_ids": lists(rng, rows, np.int32, 0, 50_000, np.full(rows, 64)),
            "ragged": lists(rng, rows, np.int32, -(2**31), 2**31 - 1),
            "small": lists(rng, rows, np.int8, -128, 128),
            "wide": lists(rng, rows, np.int64, -(2**62), 2**62),
            "few": lists(rng, rows, np.int32, 0, 3),  # dictionary indices of 1-2 bits
            "floats": pa.ListArray.from_arrays(
                pa.array(np.arange(rows + 1, dtype=np.int32) * 2), pa.array(rng.random(2 * rows))
            ),
        }
    )


def compare(path: Path, names: list[str], fast_expected: bool = True) -> None:
    pf = pq.ParquetFile(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        for rg in range(pf.num_row_groups):
            got = read_list_columns(pf, fd, rg, names)
            if not fast_expected:
                assert got is None
                continue
            assert got is not None, f"row group {rg} fell back to Arrow"
            arrow = pf.read_row_group(rg, columns=names)
            for name in names:
                offsets, values = list_parts(arrow.column(name).combine_chunks())
                assert got[name][0].dtype == np.int64
                np.testing.assert_array_equal(got[name][0], offsets, err_msg=name)
                assert got[name][1].dtype == values.dtype, name
                np.testing.assert_array_equal(got[name][1], values, err_msg=name)
    finally:
        os.close(fd)


NAMES = ["input_ids", "ragged", "small", "wide", "few", "floats"]


@pytest.mark.parametrize("compression", ["zstd", "snappy", "none"])
@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
@pytest.mark.parametrize("dictionary", [False, True])
def test_equal_to_arrow_on_supported_layouts(tmp_path, compression, page_version, dictionary):
    path = tmp_path / "t.parquet"
    pq.write_table(
        table(),
        path,
        compression=compression,
        data_page_version=page_version,
        use_dictionary=dictionary,
        row_group_size=70,  # row groups of 70 and a last one of 20
        data_page_size=4096,  # many pages per column chunk, rows cut across pages
    )
    compare(path, NAMES)


def test_dictionary_indices_of_many_widths(tmp_path):
    rng = np.random.default_rng(3)
    cols = {f"card{c}": lists(rng, 200, np.int32, 0, c) for c in (1, 2, 5, 300, 5000, 70_000)}
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table(cols), path, use_dictionary=True, dictionary_pagesize_limit=1 << 24)
    md = pq.ParquetFile(path).metadata.row_group(0)
    assert any("RLE_DICTIONARY" in md.column(j).encodings for j in range(md.num_columns))
    compare(path, list(cols))


def test_packtool_shards_take_the_fast_path(tmp_path):
    from packtool.writers.packs import PackArrays
    from packtool.writers.parquet import write_parquet_shard

    rng = np.random.default_rng(0)
    k, n = 40, 256
    lens = [rng.integers(1, 100, 8) for _ in range(k)]
    seq_lens = np.concatenate([np.append(x, n - x.sum()) for x in lens]).astype(np.int32)
    sl_off = np.concatenate([[0], np.cumsum([len(x) + 1 for x in lens])]).astype(np.int64)
    packs = PackArrays(
        input_ids=rng.integers(0, 1000, (k, n)).astype(np.int32),
        labels=rng.integers(-100, 1000, (k, n)).astype(np.int32),
        position_ids=np.tile(np.arange(n, dtype=np.int32), (k, 1)),
        seq_lens=seq_lens,
        seq_lens_offsets=sl_off,
        loss_mask=rng.integers(0, 2, (k, n)).astype(np.int8),
        sample_index=np.arange(int(sl_off[-1]), dtype=np.int64),
        sample_index_offsets=sl_off,
        sample_offset=np.zeros(int(sl_off[-1]), dtype=np.int64),
    )
    path = tmp_path / "packs-000000.parquet"
    write_parquet_shard(path, packs, row_group_size=16, metadata={})
    compare(path, ["input_ids", "labels", "position_ids", "loss_mask", "seq_lens", "sample_index"])
    # the loader's unit reader gives the same arrays with and without the page decoder
    for part, size in enumerate([16, 16, 8]):
        fast = read_parquet_unit(_ParquetFiles(None), path, Unit(0, part, size), n, list(PACK_COLS))
        parquet_pages.FAST_PARQUET = False
        try:
            slow = read_parquet_unit(_ParquetFiles(None), path, Unit(0, part, size), n, list(PACK_COLS))
        finally:
            parquet_pages.FAST_PARQUET = True
        assert fast.keys() == slow.keys()
        for key in fast:
            assert fast[key].dtype == slow[key].dtype
            np.testing.assert_array_equal(fast[key], slow[key])
        np.testing.assert_array_equal(fast["loss_mask"], packs.loss_mask[part * 16 : part * 16 + size])


PACK_COLS = ("input_ids", "labels", "position_ids", "loss_mask", "seq_lens")


def nullable(rng) -> dict[str, pa.Array]:
    return {
        "null_values": pa.array([[1, None, 3], [4]], type=pa.list_(pa.int32())),
        "empty_list": pa.array([[1, 2], []], type=pa.list_(pa.int32())),
        "null_list": pa.array([[1, 2], None], type=pa.list_(pa.int32())),
        "flat": pa.array([1, 2], type=pa.int32()),
        "nested": pa.array([[[1], [2, 3]], [[4]]], type=pa.list_(pa.list_(pa.int32()))),
        "strings": pa.array([["a"], ["b", "c"]], type=pa.list_(pa.string())),
        "bools": pa.array([[True], [False, True]], type=pa.list_(pa.bool_())),
        "uint32": pa.array([[2**32 - 1], [0]], type=pa.list_(pa.uint32())),
    }


@pytest.mark.parametrize(
    "name", ["null_values", "empty_list", "null_list", "flat", "nested", "strings", "bools", "uint32"]
)
def test_other_shapes_fall_back_to_arrow(tmp_path, name):
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({name: nullable(None)[name]}), path)
    compare(path, [name], fast_expected=False)


@pytest.mark.parametrize("compression", ["gzip", "brotli", "lz4"])
def test_other_codecs_fall_back_to_arrow(tmp_path, compression):
    path = tmp_path / "c.parquet"
    pq.write_table(table(rows=50), path, compression=compression)
    compare(path, NAMES, fast_expected=False)


def test_other_encodings_fall_back_to_arrow(tmp_path):
    path = tmp_path / "e.parquet"
    pq.write_table(
        table(rows=50),
        path,
        use_dictionary=False,
        column_encoding={"ragged.list.element": "DELTA_BINARY_PACKED"},  # (the leaf path)
        data_page_version="2.0",
    )
    compare(path, ["input_ids"])  # the other columns still take the fast path
    compare(path, ["input_ids", "ragged"], fast_expected=False)


def test_switch_off_and_missing_columns_and_row_groups(tmp_path, monkeypatch):
    path = tmp_path / "s.parquet"
    pq.write_table(table(rows=20), path)
    pf, fd = pq.ParquetFile(path), os.open(path, os.O_RDONLY)
    try:
        assert read_list_columns(pf, fd, 0, ["input_ids"]) is not None
        assert read_list_columns(pf, fd, 0, ["no_such_column"]) is None
        assert read_list_columns(pf, fd, 1, ["input_ids"]) is None
        monkeypatch.setattr(parquet_pages, "FAST_PARQUET", False)
        assert read_list_columns(pf, fd, 0, ["input_ids"]) is None
    finally:
        os.close(fd)


def test_damaged_pages_fall_back_to_arrow_and_its_error(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(table(rows=50), path, compression="zstd")
    pf = pq.ParquetFile(path)
    col = pf.metadata.row_group(0).column(0)
    raw = bytearray(path.read_bytes())
    start = col.data_page_offset
    raw[start + 30 : start + 400] = bytes(370)  # inside the first page's compressed body
    path.write_bytes(bytes(raw))
    pf = pq.ParquetFile(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_list_columns(pf, fd, 0, ["input_ids"]) is None
    finally:
        os.close(fd)
    with pytest.raises((OSError, pa.ArrowException)):
        pf.read_row_group(0, columns=["input_ids"])


def test_decode_hybrid_runs():
    # RLE run of 5 x value 2 (header 5 << 1), then one bit-packed group of 8 1-bit... at width 2:
    # header (1 << 1) | 1, values 0,1,2,3,0,1,2,3 packed little-endian in 2 bytes
    stream = bytes([10, 2, 3, 0b11100100, 0b11100100])
    runs = decode_hybrid(memoryview(stream), 2, 11)  # the last group is padded: 11 of its 13 values
    assert runs.expand().tolist() == [2, 2, 2, 2, 2, 0, 1, 2, 3, 0, 1]
    assert runs.positions_of(2).tolist() == [0, 1, 2, 3, 4, 7]
    assert not runs.all_equal(2)
    assert decode_hybrid(memoryview(bytes([16, 1])), 1, 8).all_equal(1)
