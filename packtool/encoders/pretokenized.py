"""``pretokenized`` encoder: records that already hold ``input_ids`` (optionally ``labels``, ``loss_mask``).

The columns are validated and cast to the packtool layout in Arrow, without a Python loop over tokens.
Missing ``labels`` follow the ``labels`` convention. ``loss_mask`` is carried as given when ``labels`` are
given too; without ``labels`` it marks, per input token, the tokens to learn (1) and, as in the fine-tuning
encoders (``packtool.encoders.masking``), decides both columns: labels are ``-100`` wherever no loss is
taken and the stored ``loss_mask`` is ``labels != -100`` (so, with ``shifted`` labels, shifted too).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from packtool.arrays import np_view
from packtool.encoders.base import (
    IGNORE_INDEX,
    MASK,
    check_same_lengths,
    encoded_batch,
    make_labels,
    to_token_lists,
)
from packtool.encoders.masking import loss_columns
from packtool.readers.base import SourceBatch


class PretokenizedEncoder:
    def __init__(self, labels: str = "shifted", vocab_size: int | None = None) -> None:
        self.labels, self.vocab_size = labels, vocab_size

    def __call__(self, batch: SourceBatch) -> pa.RecordBatch:
        rb = batch.batch
        if "input_ids" not in rb.schema.names:
            raise batch.error(
                0, "input_ids", f"missing field (record has: {', '.join(rb.schema.names)})", "missing_field"
            )
        input_ids = to_token_lists(rb.column("input_ids"), batch, "input_ids")
        self._check_ids(input_ids, batch)
        if "labels" in rb.schema.names:
            labels = to_token_lists(rb.column("labels"), batch, "labels")
            check_same_lengths(input_ids, labels, batch, "labels")
            self._check_ids(labels, batch, "labels")
        else:
            labels = None
        loss_mask = None
        if "loss_mask" in rb.schema.names:
            loss_mask = to_token_lists(rb.column("loss_mask"), batch, "loss_mask", MASK)
            check_same_lengths(input_ids, loss_mask, batch, "loss_mask")
            if labels is None:
                # the mask marks the tokens to learn (as prompt_completion/chat do): labels and loss_mask
                # follow the labels convention, with loss_mask == (labels != -100)
                labels, loss_mask = loss_columns(input_ids, np_view(loss_mask.values), self.labels)
        if labels is None:
            labels = make_labels(input_ids, self.labels)
        return encoded_batch(input_ids, labels, loss_mask)

    def _check_ids(self, ids: pa.LargeListArray, batch: SourceBatch, field: str = "input_ids") -> None:
        """Every value is a token id: >= 0 and, with a tokenizer, < its vocabulary size. ``labels`` may also
        be ``-100`` (no loss), and nothing else: a label such as -5 would crash ``cross_entropy``."""
        off = np_view(ids.offsets)
        flat = ids.values.slice(int(off[0]), int(off[-1] - off[0]))
        if len(flat) == 0:
            return
        allowed = IGNORE_INDEX if field == "labels" else None
        mm = pc.min_max(flat)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        limit = self.vocab_size
        if lo >= 0 and (limit is None or hi < limit):
            return
        arr = np_view(flat)
        bad = (arr < 0) if limit is None else ((arr < 0) | (arr >= limit))
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
            what, code = f"token id outside the vocabulary (size {limit})", "token_out_of_vocab"
        raise batch.error(row, field, f"{what}: {int(arr[pos])}", code)

    def identity(self) -> dict[str, Any]:
        return {"kind": "pretokenized", "name": None, "sha256": None, "vocab_size": self.vocab_size}
