"""Small helpers shared by several modules."""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


T = TypeVar("T")


def prefetch(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """Yield ``items`` in order while a background thread computes up to ``depth`` of them ahead.

    For a pipeline whose two halves leave the GIL to each other: e.g. the Parquet writer encodes and
    compresses row group ``i`` in Arrow's C++ (no GIL) while the thread gathers row group ``i + 1``'s tokens.
    An exception raised by ``items`` is raised here, at the item it replaced. When the consumer stops early
    (or fails), the thread is told to stop and is joined before this generator returns.

    >>> list(prefetch(iter(range(5)), depth=2))
    [0, 1, 2, 3, 4]
    """
    done = object()
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        slots.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put((done, None))
        except BaseException as e:  # handed to the consumer, raised there
            slots.put((done, e))

    thread = threading.Thread(target=produce, name="packtool-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = slots.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                slots.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)


_NUMPY_TYPES = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}


def np_view(arr: pa.Array) -> np.ndarray:
    """Zero-copy read-only NumPy view of a primitive Arrow array without nulls (slices respected).

    Unlike ``pa.Array.to_numpy`` it does not import pandas (~0.3 s and ~40 MB in every process).

    >>> np_view(pa.array([1, 2, 3], type=pa.int32()).slice(1)).tolist()
    [2, 3]
    """
    dtype = _NUMPY_TYPES.get(arr.type)
    if dtype is None or arr.null_count:
        return arr.to_numpy(zero_copy_only=False)
    if len(arr) == 0:
        return np.zeros(0, dtype=dtype)
    offset = arr.offset * np.dtype(dtype).itemsize
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=offset)


def list_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, values)`` of a list array: int64 offsets starting at 0 and the values they index.

    Works on slices (whose ``.values`` is the whole child array and whose offsets do not start at 0).

    >>> o, v = list_parts(pa.array([[1, 2], [3], [4, 5]]).slice(1))
    >>> o.tolist(), v.tolist()
    ([0, 1, 3], [3, 4, 5])
    """
    offsets = np_view(arr.offsets).astype(np.int64)
    if len(offsets) == 0:
        offsets = np.zeros(1, dtype=np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    return offsets - first, np_view(arr.values.slice(first, last - first))


_ARROW_TYPES = {np.dtype(v): k for k, v in _NUMPY_TYPES.items()}


def arrow_array(values: np.ndarray, type_: pa.DataType | None = None) -> pa.Array:
    """Arrow array over a 1-D NumPy array (zero-copy when it is contiguous and of ``type_``'s dtype).

    ``pa.array`` imports pandas on its first call (~0.4 s of CPU in every process that packs); this does
    not.

    >>> arrow_array(np.array([1, 2, 3]), pa.int32()).to_pylist()
    [1, 2, 3]
    """
    values = np.asarray(values)
    if type_ is None:
        type_ = _ARROW_TYPES[values.dtype]
    values = np.ascontiguousarray(values, dtype=_NUMPY_TYPES[type_])
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])


def large_lists(offsets: np.ndarray, values: np.ndarray, value_type: pa.DataType) -> pa.LargeListArray:
    """``large_list<value_type>`` from int64 ``(n + 1,)`` offsets and flat values, without pandas.

    >>> large_lists(np.array([0, 2, 3]), np.array([5, 6, 7]), pa.int32()).to_pylist()
    [[5, 6], [7]]
    """
    return pa.LargeListArray.from_arrays(arrow_array(offsets, pa.int64()), arrow_array(values, value_type))


def token_lists(ids: list[list[int]]) -> pa.LargeListArray:
    """``large_list<int32>`` from Python lists of token ids (a tokenizer's output), via NumPy.

    Faster than ``pa.array(ids, type=...)`` (no per-list type dispatch) and it does not import pandas.

    >>> token_lists([[1, 2], [], [3]]).to_pylist()
    [[1, 2], [], [3]]
    """
    import itertools

    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)), out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return large_lists(offsets, flat, pa.int32())
