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

from packtool.arrays import np_view
from packtool.encoders.base import (
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
    def __init__(self, labels: str = "shifted", vocab_size: int | None = None) -> None:
        self.labels, self.vocab_size = labels, vocab_size

    def __call__(self, batch: SourceBatch) -> pa.RecordBatch:
        rb = batch.batch
        if "input_ids" not in rb.schema.names:
            raise batch.error(
                0, "input_ids", f"missing field (record has: {', '.join(rb.schema.names)})", "missing_field"
            )
        input_ids = to_token_lists(rb.column("input_ids"), batch, "input_ids")
        check_token_ids(input_ids, batch, vocab_size=self.vocab_size)
        if "labels" in rb.schema.names:
            labels = to_token_lists(rb.column("labels"), batch, "labels")
            check_same_lengths(input_ids, labels, batch, "labels")
            check_token_ids(labels, batch, "labels", self.vocab_size)
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

    def identity(self) -> dict[str, Any]:
        return {"kind": "pretokenized", "name": None, "sha256": None, "vocab_size": self.vocab_size}
