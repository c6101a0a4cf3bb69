"""``sequential`` packs equal NeMo AutoModel 0.1.2 ``PackedSequence`` element for element.

The reference is the real module file from the nemo-automodel 0.1.2 wheel (see ``nemo_reference.py``).
"""

from __future__ import annotations

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool import read_packs, run_pack
from packtool.options import PackOptions
from tests.conftest import run_cli, write_jsonl
from tests.nemo_reference import load_packed_sequence_module

FIELDS = ("input_ids", "labels", "position_ids", "seq_lens")


@pytest.fixture(scope="module")
def nemo():
    return load_packed_sequence_module()


def _rows(rng: np.random.Generator, count: int, max_len: int, loss_mask: bool = False) -> list[dict]:
    rows = []
    for length in rng.integers(1, max_len + 1, size=count):
        row = {
            "input_ids": rng.integers(1, 5000, size=length).tolist(),
            # a label is -100 or a token id (anything else is bad input)
            "labels": np.where(rng.random(length) < 0.2, -100, rng.integers(0, 5000, size=length)).tolist(),
        }
        if loss_mask:
            row["loss_mask"] = rng.integers(0, 2, size=length).tolist()
        rows.append(row)
    return rows


def _reference(nemo, rows, n, split, max_packs):
    ps = nemo.PackedSequence(
        datasets.Dataset.from_list(rows), "train", n, split_across_pack=split, max_packs=max_packs
    )
    ps.pack()
    return ps.packs


def _assert_equal(ours: list[dict], ref: list[dict], fields=FIELDS) -> None:
    assert len(ours) == len(ref)
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        for f in fields:
            np.testing.assert_array_equal(o[f], r[f].numpy(), err_msg=f"pack {i}, field {f}")


CASES = [
    # (N, split_across_pack, max_packs, max sample length)
    (16, False, None, 16),
    (16, True, None, 40),  # samples longer than 2N, split
    (7, True, None, 7),
    (50, False, 3, 50),
    (50, True, 4, 120),
    (1, True, None, 3),
    (32, False, None, 4),  # many short samples per pack
    (33, False, None, 33),
    (9, True, 7, 30),
]


@pytest.mark.parametrize("n,split,max_packs,max_len", CASES)
def test_sequential_equals_packed_sequence(tmp_path, nemo, n, split, max_packs, max_len):
    rng = np.random.default_rng(n * 7 + split)
    rows = _rows(rng, 80, max_len)
    if n % 2:  # Parquet input: its record batches are sliced into chunks (Arrow slices share buffers)
        src = tmp_path / "in.parquet"
        tokens = pa.large_list(pa.int32())  # already the internal type: no cast that would compact it
        table = pa.table({k: pa.array([r[k] for r in rows], type=tokens) for k in rows[0]})
        pq.write_table(table, src, row_group_size=30)
    else:
        src = write_jsonl(tmp_path / "in.jsonl", rows)
    cfg = PackOptions.from_dict(
        {
            "inputs": [str(src)],
            "output": str(tmp_path / "out"),
            "packed_sequence_size": n,
            "split_across_pack": split,
            "max_packs": max_packs,
            "strategy": "sequential",
            "chunk_size": 17,
            "shard_size": 5,
            "quiet": True,
        }
    )
    run_pack(cfg)
    _assert_equal(list(read_packs(tmp_path / "out")), _reference(nemo, rows, n, split, max_packs))


def test_loss_mask_is_carried_like_packed_sequence(tmp_path, nemo):
    rows = _rows(np.random.default_rng(3), 40, 30, loss_mask=True)
    write_jsonl(tmp_path / "in.jsonl", rows)
    run_cli(
        "pack",
        tmp_path / "in.jsonl",
        "-o",
        tmp_path / "out",
        "--packed-sequence-size",
        24,
        "--split-across-pack",
        "--strategy",
        "sequential",
        "--num-proc",
        2,
        "--chunk-size",
        9,
        "-q",
    )
    _assert_equal(
        list(read_packs(tmp_path / "out")), _reference(nemo, rows, 24, True, None), FIELDS + ("loss_mask",)
    )


def test_exactly_full_packs_match(tmp_path, nemo):
    rows = [{"input_ids": list(range(1, 1 + k)), "labels": list(range(k))} for k in (4, 4, 8, 3, 5, 8)]
    write_jsonl(tmp_path / "in.jsonl", rows)
    for split in (False, True):
        out = tmp_path / f"out-{split}"
        args = [
            "pack",
            tmp_path / "in.jsonl",
            "-o",
            out,
            "--packed-sequence-size",
            8,
            "--strategy",
            "sequential",
            "-q",
        ] + (["--split-across-pack"] if split else [])
        run_cli(*args)
        _assert_equal(list(read_packs(out)), _reference(nemo, rows, 8, split, None))
