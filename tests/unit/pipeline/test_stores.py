"""The store a pack run keeps its encoded samples in, chosen once (``open_store``): both give the driver
the same chunks through the same protocol, and a resumed run on scratch chunks keeps the finished ones.

(Byte-for-byte shards of the two stores, through the CLI and a resume: tests/e2e/test_memory_store.py.)"""

from __future__ import annotations

import numpy as np

from packtool.errors import ErrorSink
from packtool.pipeline.engines.local import LocalEngine
from packtool.pipeline.memory import MEMORY_STORE_ENV
from packtool.pipeline.run import start_run
from packtool.pipeline.stores import InMemory, ScratchChunks, open_store
from packtool.readers.inputs import read_inputs
from tests.unit.pipeline.test_memory import _config, write_inputs


def _encoded(config, work, engine, monkeypatch, resumed=False, limit=None):
    """The store ``open_store`` picks under the memory ``limit`` (bytes; None: this machine's), encoded;
    and the ``(chunk index, encoded now)`` it reported, in order."""
    if limit is None:
        monkeypatch.delenv(MEMORY_STORE_ENV, raising=False)
    else:
        monkeypatch.setenv(MEMORY_STORE_ENV, limit)
    store = open_store(
        start_run(config, "pretokenized")[0], config, "pretokenized", str(work), engine, resumed
    )
    seen = []
    batches = read_inputs(config.reading.inputs, sink=ErrorSink(config.running.on_error), lazy=True)
    store.encode(batches, lambda meta, new: seen.append((meta["index"], new)))
    return store, seen


def test_both_stores_give_the_driver_the_same_chunks(tmp_path, monkeypatch):
    config = _config(write_inputs(tmp_path), tmp_path)
    (tmp_path / "mem").mkdir()
    (tmp_path / "disk").mkdir()
    with LocalEngine(1) as engine:
        mem, mem_seen = _encoded(config, tmp_path / "mem", engine, monkeypatch)
        disk, disk_seen = _encoded(config, tmp_path / "disk", engine, monkeypatch, limit="0")
    assert isinstance(mem, InMemory) and isinstance(disk, ScratchChunks)
    assert mem_seen == disk_seen == [(0, True), (1, True), (2, True), (3, True)]
    assert mem.metas == disk.metas
    assert np.array_equal(mem.chunks.lengths(), disk.chunks.lengths())
    assert mem.chunks.samples_per_source() == disk.chunks.samples_per_source()
    assert (
        mem.resumed_note("1 of 2 shards") == "resumed: 1 of 2 shards (the input was read into memory again)"
    )


def test_scratch_chunks_resumed_keep_the_finished_chunks(tmp_path, monkeypatch):
    config = _config(write_inputs(tmp_path), tmp_path)
    with LocalEngine(1) as engine:
        first, _ = _encoded(config, tmp_path, engine, monkeypatch, limit="0")
        (tmp_path / "chunk-000002" / "meta.json").unlink()  # as if killed before chunk 2 was finished
        again, seen = _encoded(config, tmp_path, engine, monkeypatch, resumed=True, limit="0")
    assert sorted(seen) == [(0, False), (1, False), (2, True), (3, False)]
    assert again.metas == first.metas
    assert again.resumed_note("0 of 2 shards") == "resumed: 3 of 4 chunks and 0 of 2 shards"
