"""``packtool.encoders.masking``: trained flags -> labels/loss_mask, the empty-loss policy, concat_lists."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from packtool.encoders.base import TOKENS
from packtool.encoders.masking import apply_empty_loss, concat_lists, empty_loss_count, loss_columns
from packtool.errors import InputError
from packtool.readers.base import batch_from_pylist

X = -100


def test_loss_columns_shifted_never_crosses_samples():
    # every token trained: each sample's last label is still -100 (its target would be the next sample)
    ids = pa.array([[1, 2, 3], [], [4], [5, 6]], type=TOKENS)
    labels, mask = loss_columns(ids, np.ones(6), "shifted")
    assert labels.to_pylist() == [[2, 3, X], [], [X], [6, X]]
    assert mask.to_pylist() == [[1, 1, 0], [], [0], [1, 0]]
    assert mask.type == pa.large_list(pa.int8()) and labels.type == TOKENS


def test_loss_columns_on_a_slice():
    ids = pa.array([[9, 9], [1, 2, 3], [4, 5]], type=TOKENS).slice(1)
    labels, mask = loss_columns(ids, np.array([0, 1, 1, 1, 0]), "shifted")
    assert labels.to_pylist() == [[2, 3, X], [X, X]]
    labels, mask = loss_columns(ids, np.array([0, 1, 1, 1, 0]), "unshifted")
    assert labels.to_pylist() == [[X, 2, 3], [4, X]] and mask.to_pylist() == [[0, 1, 1], [1, 0]]


def test_loss_columns_rejects_misaligned_flags():
    with pytest.raises(ValueError, match="3 flags for 2 tokens"):
        loss_columns(pa.array([[1, 2]], type=TOKENS), np.ones(3), "shifted")


def test_concat_lists_three_parts():
    a = pa.array([[1], [], [2, 3]], type=TOKENS)
    b = pa.array([[4, 5], [6], []], type=TOKENS).slice(0)
    c = pa.array([[0], [7], [8]], type=TOKENS)
    ids, part = concat_lists([a, b, c])
    assert ids.to_pylist() == [[1, 4, 5, 0], [6, 7], [2, 3, 8]]
    assert part.tolist() == [0, 1, 1, 2, 1, 2, 0, 0, 2]


def _batch(n: int):
    return batch_from_pylist([{"x": i} for i in range(n)], "f.jsonl", np.arange(1, n + 1), "line")


@pytest.mark.parametrize("policy", ["drop", "keep", "error"])
def test_apply_empty_loss(policy):
    ids = pa.array([[1, 2], [3, 4], [], [5]], type=TOKENS)
    labels, mask = loss_columns(ids, np.array([0, 1, 0, 0, 1]), "unshifted")
    if policy == "error":
        with pytest.raises(InputError, match=r"f.jsonl, line 2, field 'x': no token to learn from"):
            apply_empty_loss(_batch(4), ids, labels, mask, policy, "x")
        return
    rb = apply_empty_loss(_batch(4), ids, labels, mask, policy, "x")
    assert empty_loss_count(rb) == (1, 2)  # the empty sample (no tokens) is not counted here
    if policy == "keep":
        assert rb.column("input_ids").to_pylist() == [[1, 2], [3, 4], [], [5]]
    else:
        assert rb.column("input_ids").to_pylist() == [[1, 2], [], [], [5]]
        assert rb.column("labels").to_pylist() == [[X, 2], [], [], [5]]
        assert rb.column("loss_mask").to_pylist() == [[0, 1], [], [], [1]]
