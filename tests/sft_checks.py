"""Checks shared by the fine-tuning encoder tests: per-sample arrays, label runs, the boundary property."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packtool.encoders.base import IGNORE_INDEX
from packtool.readers.base import batch_from_pylist
from packtool.reading import read_packs
from tests.conftest import manifest_json


def encode_rows(encoder, rows: list[dict]) -> list[dict[str, list[int]]]:
    """Run ``encoder`` on ``rows`` (one batch, as read from ``rows.jsonl`` lines 1..n); one dict per row."""
    batch = batch_from_pylist(rows, "rows.jsonl", np.arange(1, len(rows) + 1, dtype=np.int64), "line")
    rb = encoder(batch)
    cols = {name: rb.column(name).to_pylist() for name in rb.schema.names}
    return [{name: cols[name][i] for name in cols} for i in range(len(rows))]


def label_runs(labels) -> list[list[int]]:
    """Maximal runs of consecutive labels that are not -100.

    >>> label_runs([-100, 5, 6, -100, 7])
    [[5, 6], [7]]
    """
    runs, cur = [], []
    for x in list(labels) + [IGNORE_INDEX]:
        if x == IGNORE_INDEX:
            if cur:
                runs.append(cur)
            cur = []
        else:
            cur.append(int(x))
    return runs


def packed_samples(directory: str | Path) -> dict[int, dict[str, np.ndarray]]:
    """Every packed sample's arrays, put back together from its pieces, keyed by input index.

    Also checks what must hold in every pack whatever the sample format: ``seq_lens`` covers the pack,
    padding has label -100 and loss_mask 0, and ``loss_mask == (labels != -100)`` everywhere.
    """
    manifest = manifest_json(directory)
    n = manifest["packed_sequence_size"]
    out: dict[int, dict[str, list]] = {}
    for pack in read_packs(directory, with_sample_index=True):
        assert int(pack["seq_lens"].sum()) == n
        if "loss_mask" in pack:
            assert np.array_equal(pack["loss_mask"], (pack["labels"] != IGNORE_INDEX).astype(np.int8))
        pos = 0
        for k, length in enumerate(pack["seq_lens"]):
            sl = slice(pos, pos + int(length))
            pos += int(length)
            if k >= len(pack["sample_index"]):  # the padding entry
                assert np.all(pack["labels"][sl] == IGNORE_INDEX)
                continue
            piece = {name: pack[name][sl] for name in ("input_ids", "labels", "loss_mask") if name in pack}
            # pieces of a split sample may come in any pack order: sample_offset puts them back in order
            out.setdefault(int(pack["sample_index"][k]), []).append((int(pack["sample_offset"][k]), piece))
    samples = {}
    for s, pieces in out.items():
        pieces.sort(key=lambda p: p[0])
        assert [p[0] for p in pieces] == np.cumsum([0] + [len(p[1]["input_ids"]) for p in pieces])[
            :-1
        ].tolist()
        samples[s] = {name: np.concatenate([p[1][name] for p in pieces]) for name in pieces[0][1]}
    return samples


def check_boundary_property(directory: str | Path, expected: list[dict[str, list[int]]]) -> int:
    """The packs hold exactly the per-sample arrays ``expected`` (index = input index), and with shifted
    labels no label is predicted across a sample boundary: every label is the sample's own next token and
    each sample's last label is -100. Returns the number of samples checked."""
    manifest = manifest_json(directory)
    samples = packed_samples(directory)
    kept = [i for i, e in enumerate(expected) if e["input_ids"]]
    assert sorted(samples) == kept
    for i, got in samples.items():
        exp = expected[i]
        assert got["input_ids"].tolist() == exp["input_ids"], i
        assert got["labels"].tolist() == exp["labels"], i
        if "loss_mask" in exp:
            assert got["loss_mask"].tolist() == exp["loss_mask"], i
        if manifest["labels"] == "shifted":
            assert got["labels"][-1] == IGNORE_INDEX
            trained = np.flatnonzero(got["labels"][:-1] != IGNORE_INDEX)
            assert np.array_equal(got["labels"][trained], got["input_ids"][trained + 1])
        else:
            trained = np.flatnonzero(got["labels"] != IGNORE_INDEX)
            assert np.array_equal(got["labels"][trained], got["input_ids"][trained])
    return len(samples)
