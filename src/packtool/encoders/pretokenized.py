"""``pretokenized`` encoder: records that already hold ``input_ids`` (optionally ``labels``, ``loss_mask``,
``attention_mask``).

The columns are validated and cast to the packtool layout in Arrow, without a Python loop over tokens.
Missing ``labels`` follow the ``labels`` convention. ``loss_mask`` is carried as given when ``labels`` are
given too; without ``labels`` it marks, per input token, the tokens to learn (1) and, as in the fine-tuning
encoders (``packtool.encoders.masking``), decides both columns: labels are ``-100`` wherever no loss is
taken and the stored ``loss_mask`` is ``labels != -100`` (so, with ``shifted`` labels, shifted too).
With ``mask_labels``, given ``labels`` become ``-100`` wherever ``loss_mask`` is 0 (NeMo AutoModel's
``pack_dataset`` does this always). An ``attention_mask`` (a tokenizer's padding output) is honoured:
the tokens it marks 0 are padding, and are stripped from every column before anything else, never packed
as tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from packtool.arrays import large_lists, list_parts, np_view, ranges
from packtool.encoders.base import (
    IGNORE_INDEX,
    MASK,
    check_same_lengths,
    check_token_ids,
    encoded_batch,
    make_labels,
    to_token_lists,
)
from packtool.encoders.masking import loss_columns
from packtool.readers.base import SourceBatch


class PretokenizedEncoder:
    def __init__(
        self, labels: str = "shifted", vocab_size: int | None = None, mask_labels: bool = False
    ) -> None:
        self.labels, self.vocab_size, self.mask_labels = labels, vocab_size, mask_labels

    def __call__(self, batch: SourceBatch) -> pa.RecordBatch:
        rb = batch.batch
        if "input_ids" not in rb.schema.names:
            raise batch.error(
                0, "input_ids", f"missing field (record has: {', '.join(rb.schema.names)})", "missing_field"
            )
        input_ids = to_token_lists(rb.column("input_ids"), batch, "input_ids")
        keep = _attended(input_ids, batch) if "attention_mask" in rb.schema.names else None
        if keep is not None:  # padding the tokenizer added: not tokens of the sample
            input_ids = _kept(input_ids, keep)
        check_token_ids(input_ids, batch, vocab_size=self.vocab_size)
        if "labels" in rb.schema.names:
            labels = to_token_lists(rb.column("labels"), batch, "labels")
            labels = labels if keep is None else _kept(labels, keep)
            check_same_lengths(input_ids, labels, batch, "labels")
            check_token_ids(labels, batch, "labels", self.vocab_size)
        else:
            labels = None
        loss_mask = None
        if "loss_mask" in rb.schema.names:
            loss_mask = to_token_lists(rb.column("loss_mask"), batch, "loss_mask", MASK)
            loss_mask = loss_mask if keep is None else _kept(loss_mask, keep)
            check_same_lengths(input_ids, loss_mask, batch, "loss_mask")
            if labels is not None and self.mask_labels:  # -100 wherever the mask takes no loss
                offsets, given = list_parts(labels)
                values = np.where(list_parts(loss_mask)[1] != 0, given, IGNORE_INDEX).astype(np.int32)
                labels = large_lists(offsets, values, pa.int32())
            if labels is None:
                # the mask marks the tokens to learn (as prompt_completion/chat do): labels and loss_mask
                # follow the labels convention, with loss_mask == (labels != -100)
                labels, loss_mask = loss_columns(input_ids, np_view(loss_mask.values), self.labels)
        if labels is None:
            labels = make_labels(input_ids, self.labels)
        return encoded_batch(input_ids, labels, loss_mask)

    def identity(self) -> dict[str, Any]:
        return {"kind": "pretokenized", "name": None, "sha256": None, "vocab_size": self.vocab_size}


def _kept(col: pa.LargeListArray, keep: np.ndarray) -> pa.LargeListArray:
    """``col`` with only the values where ``keep`` (flat, aligned with ``col``'s values) is true.

    >>> ids = pa.array([[5, 6, 0], [7, 0]], type=pa.large_list(pa.int32()))
    >>> _kept(ids, np.array([1, 1, 0, 1, 0], dtype=bool)).to_pylist()
    [[5, 6], [7]]
    """
    off, values = list_parts(col)
    if len(keep) != len(values):  # a column of other lengths: check_same_lengths names it
        return col
    kept = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
    return large_lists(kept[off], values[keep], col.type.value_type)


def _attended(input_ids: pa.LargeListArray, batch: SourceBatch) -> np.ndarray | None:
    """Flat bool over ``input_ids``' values: the tokens ``attention_mask`` keeps (a record without one
    keeps all); None when no record has one."""
    col = batch.batch.column("attention_mask")
    valid = np.flatnonzero(np.asarray(col.is_valid()))
    if not len(valid):
        return None
    sub = batch.take(valid)
    attention = to_token_lists(sub.batch.column("attention_mask"), sub, "attention_mask", MASK)
    off, _ = list_parts(input_ids)
    check_same_lengths(input_ids.take(pa.array(valid)), attention, sub, "attention_mask")
    keep = np.ones(int(off[-1]), dtype=bool)
    keep[ranges(off[valid], np.diff(off)[valid])] = list_parts(attention)[1] != 0
    return keep
