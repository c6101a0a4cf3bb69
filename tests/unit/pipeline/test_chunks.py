"""Encoded chunks: the write step keeps a bounded number of chunks open, whatever the input size.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_chunk_arrays_are_written_as_np_save_writes_them(tmp_path):
    """write_chunk writes its parts one after the other under one header: the same bytes as np.save of
    their concatenation (so np.load and the store's own header parser read them)."""
    import numpy as np

    from packtool.pipeline.chunks import _save_parts

    for parts, dtype in (
        ([np.arange(5, dtype=np.int32), np.arange(3, dtype=np.int64)], np.int32),
        ([np.array([1, 0, 1], dtype=np.int8)], np.int8),
        ([], np.int64),
    ):
        _save_parts(tmp_path / "a.npy", parts, dtype)
        expected = np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)
        np.save(tmp_path / "b.npy", expected)
        assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()


def test_open_chunks_limit_raises_the_soft_open_file_limit_toward_the_hard_one():
    """Under a low soft limit (1024 is common) with room below the hard one, the store raises the soft limit
    toward what MAX_OPEN chunks need; under a low hard limit it keeps within it."""
    code = (
        "import resource; from packtool.pipeline.open_files import default_max_open, MAX_OPEN; "
        "n = default_max_open(); soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]; "
        "print(n, MAX_OPEN, soft)"
    )
    for limits, expect in (("ulimit -S -n 256 && ulimit -H -n 8192", "max"), ("ulimit -n 160", 32)):
        proc = subprocess.run(
            ["bash", "-c", f'{limits} && exec "$@"', "bash", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        assert proc.returncode == 0, proc.stderr
        n, max_open, soft = map(int, proc.stdout.split())
        if expect == "max":  # raised as far as the hard limit lets it
            assert soft == min(8192, 64 + 3 * max_open) and n == min(max_open, (soft - 64) // 3)
        else:
            assert n == expect and soft == 160  # (160 - 64) // 3 chunks, 3 descriptors each at most


def test_gathers_over_more_chunks_than_stay_open_reuse_the_open_ones(tmp_path):
    """With more chunks than ``max_open``, successive gathers that touch every chunk alternate direction:
    the second opens only the chunks the first did not leave open, and both copy the same tokens as a
    store that keeps every chunk open."""
    import numpy as np

    from packtool.pipeline.chunks import ChunkStore
    from tests.unit.test_properties import sample_tokens, write_store

    tokens = sample_tokens([3] * 12)  # 12 one-sample chunks
    small = write_store(tmp_path / "w", tokens, chunk_size=1, with_mask=False)
    small.max_open = 4
    whole = ChunkStore(small.work_dir, small.metas, max_open=64)
    opened = []
    mapped = ChunkStore._map
    small._map = lambda path: (opened.append(path.parent.name), mapped(small, path))[1]
    sample = np.arange(12)[::-1]  # every chunk, in pack order not chunk order
    start, length = np.zeros(12, dtype=np.int64), np.full(12, 3)
    dest = np.arange(12) * 3
    for gather in range(3):
        opened.clear()
        got = {"input_ids": np.zeros(36, np.int32), "labels": np.zeros(36, np.int32)}
        want = {k: v.copy() for k, v in got.items()}
        small.pieces_into(sample, start, length, dest, got)
        whole.pieces_into(sample, start, length, dest, want)
        assert all(np.array_equal(got[k], want[k]) for k in got)
        assert len(set(opened)) == (12 if gather == 0 else 12 - 4)


def test_samples_of_a_chunk_without_loss_mask_in_a_store_with_one(tmp_path):
    """A custom policy's samples (``ChunkStore.samples``) from a chunk without a loss_mask, in a store
    whose other chunks have one, are wholly trained (1s), as ``pieces_into`` copies them; it was a
    KeyError."""
    import numpy as np
    import pyarrow as pa

    from packtool.pipeline.chunks import ChunkStore, write_chunk
    from packtool.readers.base import SourceBatch

    metas = []
    for index, with_mask in enumerate((True, False)):
        rows = np.arange(2, dtype=np.int64)
        batch = SourceBatch("mem", pa.record_batch({"id": pa.array(rows)}), rows, "row")
        offsets = pa.array(np.array([0, 2, 5], dtype=np.int64))
        ids = pa.array(np.arange(5, dtype=np.int32) + 10 * index)
        cols = {"input_ids": pa.LargeListArray.from_arrays(offsets, ids)}
        cols["labels"] = cols["input_ids"]
        if with_mask:
            mask = pa.array(np.array([0, 1, 1, 0, 1], dtype=np.int8))
            cols["loss_mask"] = pa.LargeListArray.from_arrays(offsets, mask)
        metas.append(write_chunk(tmp_path, index, [batch], [pa.record_batch(cols)]))
    store = ChunkStore(tmp_path, metas)
    got = store.samples(np.array([1, 3]), np.array([3, 3]))
    assert [s["loss_mask"].tolist() for s in got] == [[1, 0, 1], [1, 1, 1]]
    pieces = store.pieces(np.array([1, 3]), np.zeros(2, dtype=np.int64), np.array([3, 3]))
    assert pieces["loss_mask"].tolist() == [1, 0, 1, 1, 1, 1]


def test_a_store_whose_caches_are_dropped_reads_the_same_again(tmp_path):
    """``drop_caches`` (the driver, once it has planned) unmaps every chunk and forgets what it read; the
    next reads open and read them again, with the same values."""
    import numpy as np

    from tests.unit.test_properties import sample_tokens, write_store

    store = write_store(tmp_path / "w", sample_tokens([3, 5, 2, 4]), chunk_size=2, with_mask=False)
    before = store.lengths(), [store.arrays(c)["input_ids"].copy() for c in range(len(store.metas))]
    assert store._open and store._offsets and store._headers
    store.drop_caches()
    assert not (store._open or store._maps or store._offsets or store._headers) and store._offsets_bytes == 0
    after = store.lengths(), [store.arrays(c)["input_ids"].copy() for c in range(len(store.metas))]
    assert np.array_equal(before[0], after[0]) and all(map(np.array_equal, before[1], after[1]))
