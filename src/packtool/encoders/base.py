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

import hashlib
import json
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packtool.arrays import arrow_array, large_lists, list_parts, np_view
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
        ("block_start", pa.int64()),  # its block in the sample: every token the processor wrote for it
        ("block_end", pa.int64()),
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


def add_special(ids: pa.LargeListArray, bos: int | None, eos: int | None) -> pa.LargeListArray:
    """Prepend ``bos`` and/or append ``eos`` to every non-empty list, vectorized.

    >>> add_special(pa.array([[5, 6], []], type=pa.large_list(pa.int32())), 1, 2).to_pylist()
    [[1, 5, 6, 2], []]
    """
    if bos is None and eos is None:
        return ids
    offsets, values = list_parts(ids)
    lengths = np.diff(offsets)
    nonempty = (lengths > 0).astype(np.int64)
    extra = nonempty * ((bos is not None) + (eos is not None))
    new_offsets = np.zeros(len(offsets), dtype=np.int64)
    np.cumsum(lengths + extra, out=new_offsets[1:])
    out = np.empty(new_offsets[-1], dtype=np.int32)
    # destination of every original token: its own index shifted by the specials added before it
    shift = np.repeat(new_offsets[:-1] - offsets[:-1] + (nonempty if bos is not None else 0), lengths)
    out[np.arange(len(values)) + shift] = values
    starts = new_offsets[:-1][lengths > 0]
    if bos is not None:
        out[starts] = bos
    if eos is not None:
        out[new_offsets[1:][lengths > 0] - 1] = eos
    return large_lists(new_offsets, out, pa.int32())


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
    """Wraps a user's ``encode(records: dict[str, list]) -> dict`` callable into the Encoder protocol, with
    ``bos_id`` / ``eos_id`` (``special_ids``) added around every sample's ``input_ids`` when given.

    Its identity names the code, not only the spec: ``source_sha256`` (of the module file the spec names)
    and, once the run's first records are known, ``probe`` (a digest of what it makes of them), so that an
    encoder edited between a run and its resume, or one reading a changed vocabulary file, is a new run.
    A ``vocab_size`` the callable declares bounds its ids and is recorded.
    """

    def __init__(
        self,
        fn: Any,
        spec: str,
        labels: str = "shifted",
        bos_id: int | None = None,
        eos_id: int | None = None,
        source_sha256: str | None = None,
    ) -> None:
        self.fn, self.spec, self.labels = fn, spec, labels
        self.bos_id, self.eos_id = bos_id, eos_id
        self.source_sha256 = source_sha256
        self.vocab_size = declared_vocab_size(fn)

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
        check_token_ids(input_ids, batch, vocab_size=self.vocab_size)  # checked like a file's ids
        added = [f"--add-{k}" for k, i in (("bos", self.bos_id), ("eos", self.eos_id)) if i is not None]
        given = [k for k in ("labels", "loss_mask") if out.get(k) is not None]
        if added and given:
            raise ConfigError(
                f"{' and '.join(added)}: encoder {self.spec} returns its own {' and '.join(given)}, which "
                "cannot say whether the added token is trained: add it in the encoder, or return only "
                "input_ids"
            )
        input_ids = add_special(input_ids, self.bos_id, self.eos_id)
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
        ident: dict[str, Any] = {"kind": "custom", "name": self.spec, "sha256": self.source_sha256}
        if self.vocab_size is not None:
            ident["vocab_size"] = self.vocab_size
        for kind, token_id in (("bos", self.bos_id), ("eos", self.eos_id)):
            if token_id is not None:
                ident[f"{kind}_token_id"] = token_id
        return ident

    def probe(self, batches: list[SourceBatch]) -> str:
        """sha256 of what this encoder makes of ``batches`` (a run's first few records), or of the kind of
        error it raises on them: the same code and data files give the same digest.

        >>> def encode(records): return {"input_ids": [[len(t)] for t in records["text"]]}
        >>> def lower(records): return {"input_ids": [[len(t.lower()) + 1] for t in records["text"]]}
        >>> rec = SourceBatch("x", pa.record_batch({"text": ["Ab"]}), np.array([1]))
        >>> a = FunctionEncoder(encode, "m:encode").probe([rec])
        >>> same, edited = FunctionEncoder(encode, "m:encode"), FunctionEncoder(lower, "m:encode")
        >>> a == same.probe([rec]), a == edited.probe([rec])
        (True, False)
        """
        h = hashlib.sha256()
        for batch in batches:
            try:
                out = self(batch)
            except Exception as e:  # (the run meets it again, and says so, when it encodes these records)
                h.update(f"{type(e).__name__}: {getattr(e, 'code', '')}".encode())
                continue
            for name in out.schema.names:
                h.update(name.encode() + json.dumps(out.column(name).to_pylist()).encode())
        return h.hexdigest()


def declared_vocab_size(encoder: Any) -> int | None:
    """The ``vocab_size`` a custom encoder declares (an attribute of the callable), if a positive int."""
    vocab = getattr(encoder, "vocab_size", None)
    ok = isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0
    return vocab if ok else None


def special_ids(
    encoder: Any, spec: str, add: bool, kind: str, token: str | None, token_id: int | None
) -> int | None:
    """The ``kind`` (``bos`` / ``eos``) id ``--add-{kind}`` adds around a custom encoder's samples (None
    without ``add``): ``--{kind}-token-id`` (``token_id``); else ``--{kind}-token`` (``token``) through the
    encoder's ``token_to_id(text)``; else what the encoder declares, its ``{kind}_token_id`` attribute (a
    function's, e.g. ``encode.eos_token_id = enc.eot_token`` for a tiktoken encoding, or an instance's). An
    id outside ``[0, vocab_size)`` (when the encoder declares ``vocab_size``), or none found, is
    ``ConfigError`` in one line: nothing is added silently, and nothing recorded as added is missing.

    >>> def encode(records): return {"input_ids": [[5, 6] for _ in records["text"]]}
    >>> encode.eos_token_id = 2
    >>> special_ids(encode, "m:encode", True, "eos", None, None)
    2
    >>> special_ids(encode, "m:encode", True, "eos", None, 7)
    7
    """
    if not add:
        return None
    flag = f"--add-{kind}"
    if token_id is None and token is not None:
        to_id = getattr(encoder, "token_to_id", None)
        if not callable(to_id):
            raise ConfigError(
                f"--{kind}-token {token}: encoder {spec} has no token_to_id(text) to find its id; give "
                f"--{kind}-token-id ID"
            )
        token_id = to_id(token)
        if token_id is None:
            raise ConfigError(f"--{kind}-token {token}: encoder {spec}'s token_to_id knows no such token")
        flag = f"--{kind}-token {token}"
    elif token_id is None:
        token_id = getattr(encoder, f"{kind}_token_id", None)
        if token_id is None:
            raise ConfigError(
                f"{flag}: encoder {spec} declares no {kind.upper()} id (an attribute {kind}_token_id on it); "
                f"give --{kind}-token-id ID, the id your tokenizer gives its {kind.upper()} token"
            )
        flag = f"{flag}: encoder {spec}'s {kind}_token_id"
    vocab = declared_vocab_size(encoder)
    ok = (
        isinstance(token_id, int)
        and not isinstance(token_id, bool)
        and 0 <= token_id <= np.iinfo(np.int32).max
    )
    if not ok or (vocab is not None and token_id >= vocab):
        where = f" (its vocab_size is {vocab:,})" if vocab is not None else ""
        raise ConfigError(f"{flag}: {token_id!r} is not a token id of encoder {spec}{where}")
    return int(token_id)
