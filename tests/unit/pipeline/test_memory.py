"""The in-memory store of pretokenized Parquet input: when a run uses it, and that it holds what the
scratch chunks would (every gather, lookup and count the same).

(In-process tests; the CLI's, byte for byte against the scratch chunks and through a resume, are in
tests/e2e/test_memory_store.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from packtool.errors import ErrorSink
from packtool.options import PackOptions
from packtool.pipeline.chunks import ChunkStore
from packtool.pipeline.encode import encode_to_chunks
from packtool.pipeline.engines.local import LocalEngine
from packtool.pipeline.memory import (
    BYTES_PER_SAMPLE,
    MEMORY_STORE_ENV,
    MemoryStore,
    encode_in_memory,
    memory_limit,
    memory_store_bytes,
    use_memory_store,
)
from packtool.pipeline.run import start_run
from packtool.readers.inputs import read_inputs
from tests.conftest import write_jsonl


def _lists(offsets: np.ndarray, values: np.ndarray) -> pa.LargeListArray:
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))


def write_inputs(tmp: Path, seed: int = 0) -> list[str]:
    """Two Parquet files of pretokenized records, row groups of 23 rows: the first with a loss_mask and an
    attention_mask that pads some records, the second with neither; one record of the second is bad
    (labels of another length)."""
    rng = np.random.default_rng(seed)
    paths = []
    for part, count in enumerate((70, 90)):
        lengths = rng.integers(0, 40, count)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        ids = rng.integers(1, 500, int(offsets[-1])).astype(np.int32)
        cols = {"input_ids": _lists(offsets, ids), "labels": _lists(offsets, np.roll(ids, -1))}
        if part == 0:
            cols["loss_mask"] = _lists(offsets, rng.integers(0, 2, int(offsets[-1])).astype(np.int8))
            attend = np.ones(int(offsets[-1]), dtype=np.int8)
            attend[offsets[1:][lengths > 3][::3] - 1] = 0
            cols["attention_mask"] = _lists(offsets, attend)
        table = pa.table(cols)
        if part == 1:
            rows = table.to_pylist()
            rows[31]["labels"] = rows[31]["labels"] + [1]
            table = pa.Table.from_pylist(rows, schema=table.schema)
        path = tmp / f"in{part}.parquet"
        pq.write_table(table, path, row_group_size=23)
        paths.append(str(path))
    return paths


def _config(inputs: list[str], tmp: Path, **kw) -> PackOptions:
    values = {
        "inputs": inputs,
        "output": str(tmp / "out"),
        "packed_sequence_size": 64,
        "chunk_size": 50,  # chunks cut across row groups and files, and mix batches with and without a mask
        "on_error": "skip",
        "quiet": True,
        **kw,
    }
    return PackOptions.from_dict(values)


def _both(tmp: Path, config: PackOptions) -> tuple[ChunkStore, list[dict], MemoryStore, list[dict]]:
    spec, _ = start_run(config, "pretokenized")
    stores = []
    for name in ("disk", "memory"):
        work = tmp / name
        work.mkdir()
        batches = read_inputs(config.reading.inputs, sink=ErrorSink(config.running.on_error), lazy=True)
        if name == "disk":
            with LocalEngine(1) as engine:
                metas = encode_to_chunks(spec, config, batches, str(work), engine)
            stores += [ChunkStore(work, metas), metas]
        else:
            stores += list(encode_in_memory(spec, config, batches, str(work)))
    return tuple(stores)


def test_memory_store_holds_what_the_chunks_hold(tmp_path):
    config = _config(write_inputs(tmp_path), tmp_path)
    disk, disk_metas, mem, mem_metas = _both(tmp_path, config)
    assert not list((tmp_path / "memory").iterdir()), "nothing is written in memory"
    # the same chunks, counted the same (skipped records, empty-loss samples, rows covered)
    assert mem_metas == disk_metas
    assert mem.num_samples == disk.num_samples == 70 + 90 - 1
    assert mem.has_loss_mask and disk.has_loss_mask
    assert np.array_equal(mem.lengths(), disk.lengths())
    assert mem.samples_per_source() == disk.samples_per_source()
    # every sample, whole and in pieces, in a shuffled order: the same tokens, labels and masks
    rng = np.random.default_rng(1)
    lengths = disk.lengths()
    sample = rng.permutation(np.flatnonzero(lengths > 1))
    start = (lengths[sample] // 2).astype(np.int64)
    length = lengths[sample] - start
    got, want = mem.pieces(sample, start, length), disk.pieces(sample, start, length)
    assert got.keys() == want.keys() == {"input_ids", "labels", "loss_mask"}
    for key in got:
        assert np.array_equal(got[key], want[key]), key
    for i in (0, 60, 150):  # errors name the same file and row
        assert str(mem.locate(i, "input_ids", "m")) == str(disk.locate(i, "input_ids", "m"))
    assert [s["input_ids"].tolist() for s in mem.samples(sample[:5], lengths[sample[:5]])] == [
        s["input_ids"].tolist() for s in disk.samples(sample[:5], lengths[sample[:5]])
    ]


def test_memory_store_keeps_packs_of_a_custom_policy(tmp_path):
    config = _config(write_inputs(tmp_path), tmp_path)
    disk, _, mem, _ = _both(tmp_path, config)
    packs = [
        {
            "input_ids": np.array([5, 6, 7], dtype=np.int32),
            "labels": np.array([6, 7, -100], dtype=np.int32),
            "seq_lens": np.array([2, 1]),
            "origin": np.array([3, 9]),
        }
    ]
    first = disk.num_samples
    assert mem.append_packs(packs).tolist() == disk.append_packs(packs).tolist() == [first, first + 1]
    assert mem.num_samples == disk.num_samples
    assert mem.origin(np.array([0, first, first + 1])).tolist() == [0, 3, 9]
    new = np.array([first, first + 1])
    got, want = (
        mem.pieces(new, np.zeros(2), np.array([2, 1])),
        disk.pieces(new, np.zeros(2), np.array([2, 1])),
    )
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert got["input_ids"].tolist() == [5, 6, 7]
    assert mem.samples_per_source() == disk.samples_per_source()


def test_memory_store_bytes_from_the_footers(tmp_path):
    paths = write_inputs(tmp_path)
    config = _config(paths, tmp_path)
    need = memory_store_bytes(config, "pretokenized")
    # 9 bytes a token in the file with a loss_mask, 8 in the other, 20 a sample; tokens are the longest
    # token column's values (the bad record's labels are one longer), and an empty list takes a value's
    # place in the footer's count
    slots = []
    for p in paths:
        table = pq.read_table(p)
        counts = [pc.list_value_length(table.column(c)).to_numpy() for c in ("input_ids", "labels")]
        slots.append(max(int(np.maximum(c, 1).sum()) for c in counts))
    assert need == 9 * slots[0] + 8 * slots[1] + BYTES_PER_SAMPLE * (70 + 90)


def test_which_runs_hold_their_input_in_memory(tmp_path, monkeypatch):
    paths = write_inputs(tmp_path)
    config = _config(paths, tmp_path)
    monkeypatch.delenv(MEMORY_STORE_ENV, raising=False)
    assert memory_limit() > 0
    assert use_memory_store(config, "pretokenized")
    jsonl = write_jsonl(tmp_path / "a.jsonl", [{"input_ids": [1, 2]}])
    assert memory_store_bytes(_config([*paths, str(jsonl)], tmp_path), "pretokenized") is None
    assert memory_store_bytes(config, "text") is None
    assert memory_store_bytes(_config(paths, tmp_path, engine="ray"), "pretokenized") is None
    assert memory_store_bytes(_config(paths, tmp_path, tokenizer="mod:fn"), "pretokenized") is None
    need = memory_store_bytes(config, "pretokenized")
    monkeypatch.setenv(MEMORY_STORE_ENV, str(need))
    assert use_memory_store(config, "pretokenized")
    monkeypatch.setenv(MEMORY_STORE_ENV, str(need - 1))
    assert not use_memory_store(config, "pretokenized")
    monkeypatch.setenv(MEMORY_STORE_ENV, "0")
    assert not use_memory_store(config, "pretokenized")


@pytest.mark.parametrize("limit", [None, "0"])
def test_a_run_in_memory_writes_no_chunk(tmp_path, monkeypatch, limit):
    from packtool import run_pack

    if limit is None:
        monkeypatch.delenv(MEMORY_STORE_ENV, raising=False)
    else:
        monkeypatch.setenv(MEMORY_STORE_ENV, limit)
    # one process: a pool's workers would write the chunks where this test does not see them
    config = _config(write_inputs(tmp_path), tmp_path, long_samples="truncate", num_proc=1)
    written = []
    from packtool.pipeline import chunks

    real = chunks.write_chunk
    monkeypatch.setattr(
        "packtool.pipeline.encode.write_chunk", lambda *a, **k: written.append(a[1]) or real(*a, **k)
    )
    manifest = run_pack(config)
    assert (len(written) == 0) == (limit is None)
    assert manifest.stats.num_samples == 159 and manifest.stats.skipped_samples == 1
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["stats"] == manifest.stats.to_dict()


def test_the_limit_is_a_quarter_of_the_memory_and_half_of_what_is_available(monkeypatch):
    from packtool.pipeline import memory

    monkeypatch.delenv(MEMORY_STORE_ENV, raising=False)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    monkeypatch.setattr(memory, "_available_bytes", lambda: None)
    assert memory_limit() == physical // 4
    monkeypatch.setattr(memory, "_available_bytes", lambda: 1000)
    assert memory_limit() == 500
    monkeypatch.undo()
    monkeypatch.delenv(MEMORY_STORE_ENV, raising=False)
    assert 0 < memory._available_bytes() <= physical
