"""The encoder protocol: raw records in, token ids (and labels) out.

An encoder turns one ``SourceBatch`` into an Arrow record batch with, per record:

* ``input_ids``: ``large_list<int32>``, the sample's tokens;
* ``labels``: ``large_list<int32>``, same lengths as ``input_ids``; ``-100`` where no loss is taken;
* ``loss_mask`` (optional): ``large_list<int8>``, same lengths, 1 where the loss is taken;
* ``images`` (vision-language samples): ``large_list<IMAGE_STRUCT>``, the sample's images in order.

The output has exactly one row per input record, in order. A record that yields no tokens gets an empty
list; packtool counts it as empty and leaves it out of the packs.

A user's encoder is any callable ``encode(records: dict[str, list]) -> dict[str, list[list[int]]]`` that
returns at least ``input_ids``; it is named on the command line as ``--tokenizer module:callable``
(``module`` may be a dotted module or a ``path/to/file.py``). A class named this way is instantiated once
per process with the ``encoder_kwargs`` config mapping.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packtool.arrays import arrow_array, np_view
from packtool.errors import ConfigError, InputError, PacktoolError
from packtool.manifest import IGNORE_INDEX
from packtool.readers.base import SourceBatch

TOKENS = pa.large_list(pa.int32())
MASK = pa.large_list(pa.int8())

# one image of an encoded vision-language sample (the ``images`` column's items): its span of tokens in
# the sample, its size, its bytes' digest and name, and where the bytes are: a file (read again when its
# pack is written) with its stamp, or the bytes the record held
IMAGE_STRUCT = pa.struct(
    [
        ("offset", pa.int64()),  # where its span starts in the sample
        ("length", pa.int64()),  # its tokens
        ("height", pa.int32()),
        ("width", pa.int32()),
        ("digest", pa.binary(16)),  # XXH3-128 of its bytes
        ("name", pa.string()),  # as the record names it
        ("path", pa.string()),  # the file it was read from, or null: its bytes are ``data``
        ("data", pa.large_binary()),  # bytes the record held, or null: read again from ``path``
        ("file_size", pa.int64()),  # the file's stamp when it was read (null for bytes)
        ("mtime_ns", pa.int64()),
        ("ctime_ns", pa.int64()),
        ("inode", pa.int64()),
    ]
)
IMAGE_FILE_STAMP = ("file_size", "mtime_ns", "ctime_ns", "inode")


class Encoder(Protocol):
    """What packtool calls: ``encoder(batch) -> pa.RecordBatch`` (see module docstring)."""

    def __call__(self, batch: SourceBatch) -> pa.RecordBatch: ...

    def identity(self) -> dict[str, Any]:
        """Name, path and content hash of the tokenizer, for the manifest."""
        ...


def shifted_labels(input_ids: pa.LargeListArray) -> pa.LargeListArray:
    """Per-sample shifted labels: ``labels[i] = input_ids[i + 1]`` and ``-100`` on each sample's last token.

    No target crosses a sample boundary, so packing never lets sample k predict sample k+1.

    >>> shifted_labels(pa.array([[5, 6, 7], [8]], type=TOKENS)).to_pylist()
    [[6, 7, -100], [-100]]
    """
    offsets = np_view(input_ids.offsets)
    values = np_view(input_ids.values)
    labels = np.empty_like(values)
    labels[:-1] = values[1:]
    ends = offsets[1:][offsets[1:] > offsets[:-1]] - 1
    labels[ends] = IGNORE_INDEX
    return pa.LargeListArray.from_arrays(input_ids.offsets, arrow_array(labels, pa.int32()))


def make_labels(input_ids: pa.LargeListArray, convention: str) -> pa.LargeListArray:
    """Labels for ``input_ids`` under the ``labels`` convention (``shifted`` or ``unshifted``)."""
    if convention == "shifted":
        return shifted_labels(input_ids)
    return pa.LargeListArray.from_arrays(input_ids.offsets, input_ids.values)


def encoded_batch(input_ids: pa.Array, labels: pa.Array, loss_mask: pa.Array | None = None) -> pa.RecordBatch:
    cols = {"input_ids": input_ids, "labels": labels}
    if loss_mask is not None:
        cols["loss_mask"] = loss_mask
    return pa.record_batch(cols)


def to_token_lists(
    values: Any, batch: SourceBatch, field: str, type_: pa.DataType = TOKENS
) -> pa.LargeListArray:
    """Convert a column of integer lists (Arrow or Python) to ``large_list<int32>``, naming bad rows.

    With ``type_=MASK`` (a ``loss_mask``) every value must be 0 or 1 (booleans are accepted); any other
    value is a bad record (reason ``bad_loss_mask``).
    """
    is_mask = type_ == MASK
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        try:
            # the type is inferred, not asked for: asked for int64, Arrow truncates 1.7 to 1 without a word
            values = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            for i, v in enumerate(values):
                if not isinstance(v, list | tuple) or not all(
                    isinstance(x, int) and (is_mask or not isinstance(x, bool)) for x in v
                ):
                    raise batch.error(
                        i, field, f"expected a list of integers, got {str(v)[:40]!r}", "wrong_type"
                    ) from None
            raise
    if not (
        pa.types.is_list(values.type)
        or pa.types.is_large_list(values.type)
        or pa.types.is_fixed_size_list(values.type)
    ):
        raise batch.error(0, field, f"expected a list of integers, got {values.type}", "wrong_type")
    if values.null_count:
        i = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise batch.error(i, field, "missing field or null value", "missing_field")
    values = values.cast(pa.large_list(values.type.value_type))
    # Only this array's own values, offsets from 0: a column sliced at a chunk boundary still holds (and
    # .values returns) the whole reader batch's values, which must neither be checked nor copied here.
    off = np_view(values.offsets).astype(np.int64)
    flat = values.values.slice(int(off[0]), int(off[-1] - off[0]))
    offsets = off - off[0]

    def row_of(position: int) -> int:
        return int(np.searchsorted(offsets, position, side="right") - 1)

    if flat.null_count:
        bad = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
        raise batch.error(row_of(bad), field, "null inside the list", "null_value")
    if pa.types.is_null(flat.type):  # only empty lists (JSON []): empty samples
        flat = flat.cast(pa.int64())
    if is_mask and pa.types.is_boolean(flat.type):
        flat = flat.cast(pa.int8())
    if pa.types.is_floating(flat.type):
        # JSON rows like [1, 2.5] make the whole column float: name the row with a non-integer value
        f = np_view(flat)
        bad = np.flatnonzero((f != np.floor(f)) | (np.abs(f) >= 2**31))  # also NaN and inf
        if len(bad):
            raise batch.error(
                row_of(bad[0]), field, f"expected int32 integers, got {float(f[bad[0]])!r}", "wrong_type"
            )
        flat = flat.cast(pa.int64())
    if not pa.types.is_integer(flat.type):
        raise batch.error(row_of(0), field, f"expected integers, got {flat.type}", "wrong_type")
    lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    mm = pc.min_max(flat)
    if len(flat) and (mm["min"].as_py() < lo or mm["max"].as_py() > hi):
        arr = np_view(flat)
        bad = int(np.flatnonzero((arr < lo) | (arr > hi))[0])
        raise batch.error(row_of(bad), field, f"value {arr[bad]} does not fit in int32", "token_out_of_range")
    if is_mask and len(flat) and (mm["min"].as_py() < 0 or mm["max"].as_py() > 1):
        arr = np_view(flat)
        bad = int(np.flatnonzero((arr < 0) | (arr > 1))[0])
        raise batch.error(row_of(bad), field, f"expected 0 or 1, got {arr[bad]}", "bad_loss_mask")
    return pa.LargeListArray.from_arrays(arrow_array(offsets, pa.int64()), flat.cast(type_.value_type))


def check_same_lengths(a: pa.LargeListArray, b: pa.LargeListArray, batch: SourceBatch, field: str) -> None:
    la = np.diff(np_view(a.offsets))
    lb = np.diff(np_view(b.offsets))
    bad = np.flatnonzero(la != lb)
    if len(bad):
        i = int(bad[0])
        raise batch.error(i, field, f"has {lb[i]} values but input_ids has {la[i]}", "length_mismatch")


def check_token_ids(
    ids: pa.LargeListArray, batch: SourceBatch, field: str = "input_ids", vocab_size: int | None = None
) -> None:
    """Every value is a token id: >= 0 and, when known, < ``vocab_size``; ``labels`` may also be ``-100``
    (no loss), and nothing else: a label such as -5 would crash ``cross_entropy``. Else the error names
    the record and the field."""
    off = np_view(ids.offsets)
    flat = ids.values.slice(int(off[0]), int(off[-1] - off[0]))
    if len(flat) == 0:
        return
    allowed = IGNORE_INDEX if field == "labels" else None
    mm = pc.min_max(flat)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo >= 0 and (vocab_size is None or hi < vocab_size):
        return
    arr = np_view(flat)
    bad = (arr < 0) if vocab_size is None else ((arr < 0) | (arr >= vocab_size))
    if allowed is not None:
        bad &= arr != allowed
        if not bad.any():
            return
    pos = int(bad.argmax())
    row = int((off - off[0]).searchsorted(pos, side="right") - 1)
    if arr[pos] < 0:
        if field == "labels":
            what, code = "negative label other than -100", "negative_label"
        else:
            what, code = "negative token id", "negative_token_id"
    else:
        what, code = f"token id outside the vocabulary (size {vocab_size})", "token_out_of_vocab"
    raise batch.error(row, field, f"{what}: {int(arr[pos])}", code)


class FunctionEncoder:
    """Wraps a user's ``encode(records: dict[str, list]) -> dict`` callable into the Encoder protocol."""

    def __init__(self, fn: Any, spec: str, labels: str = "shifted") -> None:
        self.fn, self.spec, self.labels = fn, spec, labels

    def __call__(self, batch: SourceBatch) -> pa.RecordBatch:
        try:
            out = self.fn(batch.batch.to_pydict())
        except PacktoolError:
            raise
        except Exception as e:
            raise InputError(
                f"encoder {self.spec} failed on this batch: {type(e).__name__}: {e}",
                source=batch.source,
                row=int(batch.rows[0]),
                row_kind=batch.row_kind,
                code="encoder_failed",
            ) from e
        if not isinstance(out, dict) or "input_ids" not in out:
            raise ConfigError(f"encoder {self.spec} must return a dict with 'input_ids'")
        input_ids = to_token_lists(out["input_ids"], batch, "input_ids")
        if len(input_ids) != batch.num_rows:
            raise ConfigError(
                f"encoder {self.spec} returned {len(input_ids)} rows for {batch.num_rows} records"
            )
        check_token_ids(input_ids, batch)  # a custom encoder's ids are checked like a file's
        if out.get("labels") is not None:
            labels = to_token_lists(out["labels"], batch, "labels")
            check_same_lengths(input_ids, labels, batch, "labels")
            check_token_ids(labels, batch, "labels")
        else:
            labels = make_labels(input_ids, self.labels)
        loss_mask = None
        if out.get("loss_mask") is not None:
            loss_mask = to_token_lists(out["loss_mask"], batch, "loss_mask", MASK)
            check_same_lengths(input_ids, loss_mask, batch, "loss_mask")
        return encoded_batch(input_ids, labels, loss_mask)

    def identity(self) -> dict[str, Any]:
        return {"kind": "custom", "name": self.spec, "sha256": None}
