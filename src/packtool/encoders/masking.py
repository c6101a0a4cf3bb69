"""Loss masking for fine-tuning encoders: which tokens are trained -> ``labels`` and ``loss_mask``.

A fine-tuning encoder decides, per token, whether the token is *trained* (part of a response the model
should learn to produce). ``loss_columns`` turns that flat 0/1 array into the two output columns under the
``labels`` convention:

* ``shifted`` (default): ``labels[i]`` is the target of ``input_ids[i]``: ``input_ids[i + 1]`` when that
  token is trained, else ``-100``; the last token of every sample gets ``-100``, so no target crosses a
  sample boundary inside a pack.
* ``unshifted`` (Hugging Face style, the model shifts): ``labels[i] = input_ids[i]`` when token ``i`` is
  trained, else ``-100``.

In both, ``loss_mask == (labels != -100)``. ``apply_empty_loss`` then applies the ``empty_loss`` policy to
samples that have tokens but no trained one, and records how many there were in the record batch's schema
metadata (keys ``packtool.empty_loss_samples`` and ``packtool.empty_loss_tokens``), which the chunk writer
adds up into the manifest stats.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from packtool.arrays import arrow_array, large_lists, np_view
from packtool.encoders.base import IGNORE_INDEX, MASK, TOKENS, encoded_batch
from packtool.readers.base import SourceBatch

EMPTY_LOSS_META = b"packtool.empty_loss_samples"
EMPTY_LOSS_TOKENS_META = b"packtool.empty_loss_tokens"


def loss_columns(
    input_ids: pa.LargeListArray, trained: np.ndarray, convention: str = "shifted"
) -> tuple[pa.LargeListArray, pa.LargeListArray]:
    """``labels`` and ``loss_mask`` for ``input_ids`` given the flat per-token ``trained`` flags.

    Args:
        input_ids: ``large_list<int32>``, one list per sample.
        trained: ``(total_tokens,)`` bool/int8 aligned with ``input_ids.values``: 1 where the token is one
            the model should learn to produce.
        convention: ``shifted`` or ``unshifted`` (see the module docstring).

    Returns:
        ``labels`` (``large_list<int32>``) and ``loss_mask`` (``large_list<int8>``), same offsets.

    >>> ids = pa.array([[5, 6, 7, 8], [9, 10]], type=TOKENS)
    >>> lab, m = loss_columns(ids, np.array([0, 0, 1, 1, 0, 1]), "shifted")
    >>> lab.to_pylist(), m.to_pylist()
    ([[-100, 7, 8, -100], [10, -100]], [[0, 1, 1, 0], [1, 0]])
    >>> loss_columns(ids, np.array([0, 0, 1, 1, 0, 1]), "unshifted")[0].to_pylist()
    [[-100, -100, 7, 8], [-100, 10]]
    """
    offsets = np_view(input_ids.offsets)
    values = np_view(input_ids.values)
    base = int(offsets[0])
    values = values[base : int(offsets[-1])]
    trained = np.asarray(trained, dtype=bool)
    if len(trained) != len(values):
        raise ValueError(f"trained has {len(trained)} flags for {len(values)} tokens")
    if convention == "shifted":
        target = np.zeros(len(values), dtype=bool)
        target[:-1] = trained[1:]
        ends = offsets[1:][offsets[1:] > offsets[:-1]] - 1 - base
        target[ends] = False  # the next token belongs to the next sample
        labels = np.full(len(values), IGNORE_INDEX, dtype=np.int32)
        labels[:-1][target[:-1]] = values[1:][target[:-1]]
    else:
        target = trained
        labels = np.where(trained, values, IGNORE_INDEX).astype(np.int32)
    new_offsets = arrow_array(offsets - base, pa.int64())
    return (
        pa.LargeListArray.from_arrays(new_offsets, arrow_array(labels, pa.int32())),
        pa.LargeListArray.from_arrays(new_offsets, arrow_array(target, pa.int8())),
    )


def apply_empty_loss(
    batch: SourceBatch,
    input_ids: pa.LargeListArray,
    labels: pa.LargeListArray,
    loss_mask: pa.LargeListArray,
    policy: str,
    field: str | list[str],
) -> pa.RecordBatch:
    """The encoder's output batch after the ``empty_loss`` policy (``drop``, ``keep`` or ``error``).

    A sample *has empty loss* when it has tokens but ``loss_mask`` is 0 on all of them (nothing to learn).
    ``drop`` turns it into an empty sample (left out of the packs), ``keep`` packs it as is, ``error``
    raises ``InputError`` naming its file, row and ``field`` (one name, or one per record). The number of
    such samples is stored in the schema metadata under ``packtool.empty_loss_samples`` under every policy.
    """
    offsets = np_view(input_ids.offsets)
    lengths = np.diff(offsets)
    mask = np_view(loss_mask.values)[int(offsets[0]) : int(offsets[-1])]
    per_sample = np.add.reduceat(mask.astype(np.int64), offsets[:-1] - offsets[0]) if len(mask) else None
    if per_sample is None:
        empty = np.zeros(len(lengths), dtype=bool)
    else:
        per_sample = np.where(lengths > 0, per_sample, 0)  # reduceat repeats a value for empty slices
        empty = (lengths > 0) & (per_sample == 0)
    count = int(empty.sum())
    if count and policy == "error":
        i = int(np.flatnonzero(empty)[0])
        raise batch.error(
            i,
            field if isinstance(field, str) else field[i],
            "no token to learn from (every label is -100); set empty_loss to keep or drop",
        )
    if count and policy == "drop":
        keep = np.repeat(~empty, lengths)
        new_lengths = np.where(empty, 0, lengths)
        new_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(new_lengths, out=new_offsets[1:])
        off = arrow_array(new_offsets, pa.int64())

        def cut(col: pa.LargeListArray, type_: pa.DataType) -> pa.LargeListArray:
            flat = np_view(col.values)[int(offsets[0]) : int(offsets[-1])]
            return pa.LargeListArray.from_arrays(off, arrow_array(flat[keep], type_.value_type))

        input_ids, labels, loss_mask = cut(input_ids, TOKENS), cut(labels, TOKENS), cut(loss_mask, MASK)
    rb = encoded_batch(input_ids, labels, loss_mask)
    tokens = int(lengths[empty].sum())
    return rb.replace_schema_metadata(
        {EMPTY_LOSS_META: str(count).encode(), EMPTY_LOSS_TOKENS_META: str(tokens).encode()}
    )


def empty_loss_count(rb: pa.RecordBatch) -> tuple[int, int]:
    """How many samples of an encoded batch had nothing to learn, and their tokens (0, 0 when the encoder
    does not say)."""
    meta = rb.schema.metadata or {}
    return int(meta.get(EMPTY_LOSS_META, b"0")), int(meta.get(EMPTY_LOSS_TOKENS_META, b"0"))


def concat_lists(
    parts: list[pa.LargeListArray],
) -> tuple[pa.LargeListArray, np.ndarray]:
    """Row-wise concatenation of several list arrays, and which part each output token came from.

    Returns the concatenated ``large_list<int32>`` and a flat ``int8`` array (aligned with its values)
    holding the index of the part each token came from.

    >>> a = pa.array([[1, 2], [3]], type=TOKENS)
    >>> b = pa.array([[4], []], type=TOKENS)
    >>> ids, part = concat_lists([a, b])
    >>> ids.to_pylist(), part.tolist()
    ([[1, 2, 4], [3]], [0, 0, 1, 0])
    """
    offs = [np_view(p.offsets) - np_view(p.offsets)[0] for p in parts]
    lengths = np.stack([np.diff(o) for o in offs])  # (num_parts, num_rows)
    row_len = lengths.sum(axis=0)
    new_offsets = np.zeros(lengths.shape[1] + 1, dtype=np.int64)
    np.cumsum(row_len, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), dtype=np.int32)
    part_of = np.empty(int(new_offsets[-1]), dtype=np.int8)
    before = np.zeros(lengths.shape[1], dtype=np.int64)  # tokens of earlier parts in the same row
    for k, (p, o) in enumerate(zip(parts, offs, strict=True)):
        vals = np_view(p.values)[np_view(p.offsets)[0] :][: int(o[-1])]
        shift = np.repeat(new_offsets[:-1] + before - o[:-1], lengths[k])
        dest = np.arange(len(vals), dtype=np.int64) + shift
        out[dest] = vals
        part_of[dest] = k
        before += lengths[k]
    return large_lists(new_offsets, out, pa.int32()), part_of
