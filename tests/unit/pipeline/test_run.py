"""The whole ``pack`` pipeline: determinism across --num-proc, the manifest, atomic output.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packtool.pipeline.encode import chunked
from packtool.readers.inputs import read_inputs
from tests.conftest import write_jsonl


def _pretokenized(tmp_path: Path, count: int = 500, seed: int = 0, max_len: int = 300) -> Path:
    rng = np.random.default_rng(seed)
    rows = [
        {"input_ids": rng.integers(0, 30000, size=n).tolist()} for n in rng.integers(1, max_len, size=count)
    ]
    return write_jsonl(tmp_path / "pre.jsonl", rows)


def test_chunks_have_exactly_chunk_size_records(tmp_path):
    src = _pretokenized(tmp_path, 103, max_len=5)
    sizes = [sum(b.num_rows for b in c) for c in chunked(read_inputs([str(src)]), 10)]
    assert sizes == [10] * 10 + [3]
