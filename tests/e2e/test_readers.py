"""Every reader on real files, through ``read_inputs`` and through the CLI.

(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import json

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool import read_packs
from tests.conftest import run_cli, write_jsonl


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "hf_disk"])
def test_every_format_packs_the_same_through_the_cli(tmp_path, fmt):
    rng = np.random.default_rng(0)
    rows = [{"input_ids": rng.integers(1, 100, size=n).tolist()} for n in rng.integers(1, 30, size=40)]
    if fmt == "jsonl":
        src = write_jsonl(tmp_path / "in.jsonl", rows)
    elif fmt == "json":
        src = tmp_path / "in.json"
        src.write_text(json.dumps(rows))
    elif fmt == "parquet":
        src = tmp_path / "in.parquet"
        pq.write_table(pa.Table.from_pylist(rows), src)
    else:
        src = tmp_path / "in_ds"
        datasets.Dataset.from_list(rows).save_to_disk(str(src))
    run_cli(
        "pack", src, "-o", tmp_path / "out", "--packed-sequence-size", 32, "--strategy", "sequential", "-q"
    )
    packed = np.concatenate(
        [p["input_ids"][: p["seq_lens"][: len(p["seq_lens"])].sum()] for p in read_packs(tmp_path / "out")]
    )
    packed = packed[packed != 0]
    assert packed.tolist() == [t for r in rows for t in r["input_ids"]]
