"""NumPy <-> Arrow without copies and without pandas, and vectorized index helpers.

``pa.array()`` and ``Array.to_numpy()`` import pandas on first use (a cost paid again in every process that
packs); these helpers build and view Arrow arrays from NumPy buffers directly.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa

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

    Unlike ``pa.Array.to_numpy`` it does not import pandas.

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

    ``pa.array`` imports pandas on its first call; this does not.

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


def bytes_array(values: list[bytes | str | None], type_: pa.DataType) -> pa.Array:
    """A string or binary array (``type_``: ``string``, ``binary``, their ``large_`` kinds) from Python
    ``str``, ``bytes`` or ``None`` (null), without pandas: one join of the bytes, offsets and validity
    through NumPy.

    >>> bytes_array(["a", None, "bc"], pa.string()).to_pylist()
    ['a', None, 'bc']
    """
    encoded = [v.encode() if isinstance(v, str) else v for v in values]
    n = len(encoded)
    large = pa.types.is_large_string(type_) or pa.types.is_large_binary(type_)
    offsets = np.zeros(n + 1, dtype=np.int64)
    sizes = np.fromiter((0 if v is None else len(v) for v in encoded), dtype=np.int64, count=n)
    np.cumsum(sizes, out=offsets[1:])
    if not large:
        if offsets[-1] > np.iinfo(np.int32).max:
            raise OverflowError(f"{offsets[-1]:,} bytes do not fit one {type_} array (2 GiB at most)")
        offsets = offsets.astype(np.int32)
    data = pa.py_buffer(b"".join(v for v in encoded if v is not None))
    validity, nulls = _validity(encoded)
    return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(offsets), data], null_count=nulls)


def int_array(values: list[int | None], type_: pa.DataType) -> pa.Array:
    """An integer array of ``type_`` from Python ints or ``None`` (null), without pandas.

    >>> int_array([3, None, 5], pa.int64()).to_pylist()
    [3, None, 5]
    """
    n = len(values)
    filled = np.fromiter((0 if v is None else v for v in values), dtype=_NUMPY_TYPES[type_], count=n)
    validity, nulls = _validity(values)
    return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(filled)], null_count=nulls)


def _validity(values: list) -> tuple[pa.Buffer | None, int]:
    """Arrow's validity bitmap of ``values`` (``None`` is null; no bitmap when none is) and the null count."""
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    nulls = len(values) - int(valid.sum())
    return (pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None), nulls


def array_lists(arrays: list[np.ndarray]) -> pa.LargeListArray:
    """``large_list<int32>`` of NumPy arrays of token ids (one list each), with one concatenation: no
    Python iteration over their values (``token_lists`` is for Python lists).

    >>> array_lists([np.array([1, 2]), np.zeros(0, int), np.array([3])]).to_pylist()
    [[1, 2], [], [3]]
    """
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays).astype(np.int32, copy=False) if arrays else np.zeros(0, dtype=np.int32)
    return large_lists(offsets, flat, pa.int32())


def token_lists(ids: list[list[int]]) -> pa.LargeListArray:
    """``large_list<int32>`` from Python lists of token ids (a tokenizer's output), via NumPy.

    Faster than ``pa.array(ids, type=...)`` (no per-list type dispatch) and it does not import pandas.

    >>> token_lists([[1, 2], [], [3]]).to_pylist()
    [[1, 2], [], [3]]
    """
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)), out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return large_lists(offsets, flat, pa.int32())


def concat_ragged(parts: list[np.ndarray], dtype) -> tuple[np.ndarray, np.ndarray]:
    """``parts`` (1-D arrays) as one flat array of ``dtype`` and its ``(len(parts) + 1,)`` int64 offsets
    (CSR), as ``PackArrays.from_parts`` and ``PackPlan`` take them.

    >>> flat, offsets = concat_ragged([np.array([1, 2]), np.array([], int), np.array([3])], np.int32)
    >>> flat.tolist(), offsets.tolist(), flat.dtype.name
    ([1, 2, 3], [0, 2, 2, 3], 'int32')
    """
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    flat = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
    return flat, offsets


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for every ``(s, l)``, vectorized.

    >>> ranges(np.array([10, 0]), np.array([2, 3])).tolist()
    [10, 11, 0, 1, 2]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths) + np.arange(
        ends[-1] if len(ends) else 0, dtype=np.int64
    )


def groups(keys: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``(key, positions)`` for each distinct value of ``keys``, in increasing key order; positions in order.

    >>> [(k, p.tolist()) for k, p in groups(np.array([2, 0, 2, 1]))]
    [(0, [1]), (1, [3]), (2, [0, 2])]
    """
    order = np.argsort(keys, kind="stable")
    parts = np.split(order, np.flatnonzero(np.diff(keys[order])) + 1) if len(order) else []
    return [(int(keys[g[0]]), g) for g in parts]
