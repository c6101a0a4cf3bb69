"""Encoded chunks: the write step keeps a bounded number of chunks open, whatever the input size.

(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq

from tests.conftest import DEMO, DEMO_TOKENIZER, ROOT


def test_many_chunks_within_a_small_open_file_limit(tmp_path):
    """1000 one-sample chunks under ``ulimit -n 96``: keeping every chunk mapped would need 5000 fds."""
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "packtool.cli", "pack", str(DEMO / "train.jsonl"), "-o", str(out),
        "--tokenizer", str(DEMO_TOKENIZER), "--packed-sequence-size", "4096", "--long-samples", "truncate",
        "--chunk-size", "1", "--shard-size", "1000", "-q",
    ]  # fmt: skip
    script = 'ulimit -n 96 && exec "$@"'
    proc = subprocess.run(
        ["bash", "-c", script, "bash", *cmd],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(out / "packs-000000.parquet", columns=["sample_index"])
    assert sorted(i for row in table.column("sample_index").to_pylist() for i in row) == list(range(1000))
