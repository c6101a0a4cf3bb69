"""The bytes a progress bar counts: the inputs' total from the start, and each lazy piece's span."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from packtool.readers.inputs import input_bytes, piece_bytes, read_inputs
from tests.conftest import DEMO, DEMO_TOKENIZER, run_cli


def test_pieces_cover_the_input_bytes(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": "w " * (i % 50)}) + "\n" for i in range(5000)))
    assert input_bytes([str(src)]) == src.stat().st_size
    pieces = list(read_inputs([str(src)], lazy=True))
    first = pieces[0]  # read by the driver to learn the fields: no byte range
    assert piece_bytes(first) == 0 and not hasattr(first, "line_starts")
    first_bytes = sum(len(json.dumps({"text": "w " * (i % 50)})) + 1 for i in range(first.num_rows))
    assert sum(piece_bytes(p) for p in pieces[1:]) + first_bytes == src.stat().st_size


def test_no_byte_total_where_bytes_are_not_handed_out(tmp_path):
    pq.write_table(pa.table({"input_ids": [[1, 2]]}), tmp_path / "a.parquet")
    (tmp_path / "b.json").write_text(json.dumps([{"text": "x"}]))
    (tmp_path / "c.txt").write_text("a\nb\n")
    assert input_bytes([str(tmp_path / "a.parquet")]) is None
    assert input_bytes([str(tmp_path / "b.json")]) is None
    assert input_bytes([str(tmp_path / "c.txt")]) == 4


def test_encode_bar_has_a_total_from_the_start(tmp_path):
    proc = run_cli("pack", DEMO / "train.jsonl", "-o", tmp_path / "out", "--tokenizer", DEMO_TOKENIZER,
                   "--packed-sequence-size", 4096, "--chunk-size", 200)  # fmt: skip
    bars = [b for b in proc.stderr.replace("\r", "\n").splitlines() if b.startswith("encode:")]
    size = f"{(DEMO / 'train.jsonl').stat().st_size / 1024:.0f}k"
    assert bars[0].startswith("encode:   0%") and all(size in b for b in bars), bars
    assert "100%" in bars[-1] and "1,000 records" in bars[-1]


def test_encode_bar_moves_within_a_chunk(tmp_path):
    """12,000 lines in 2 chunks of 8,192 records are read in pieces of 2,048 lines: the bar moves at each
    piece the encoding reads (pipeline.progress), in this process and from a pool's workers."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"w{i % 7} " * (i % 40 + 1)}) + "\n" for i in range(12_000)))
    for procs in (1, 2):
        proc = run_cli("pack", src, "-o", tmp_path / f"out{procs}", "--tokenizer", DEMO_TOKENIZER,
                       "--packed-sequence-size", 512, "--chunk-size", 8192, "--num-proc", procs,
                       env={"TQDM_MININTERVAL": "0", "TQDM_MINITERS": "1"})  # fmt: skip
        # (every move drawn, however fast the machine encodes)
        bars = [b for b in proc.stderr.replace("\r", "\n").splitlines() if b.startswith("encode:")]
        positions = {b.split("|")[2].split("[")[0].strip() for b in bars}
        assert len(positions) > 2 + 1, bars  # more than once per chunk, besides 0


def test_encode_bar_moves_on_long_documents(tmp_path):
    """30 documents of 300,000 characters, fewer lines than one range of 2,048: they are handed out in
    pieces of a few MiB, so the bar moves as they are encoded instead of sitting at 0% to the end."""
    words = " ".join(f"w{i % 13}" for i in range(100_000))[:300_000]
    src = tmp_path / "long.jsonl"
    src.write_text("".join(json.dumps({"text": f"{i} {words}"}) + "\n" for i in range(30)))
    proc = run_cli("pack", src, "-o", tmp_path / "out", "--tokenizer", DEMO_TOKENIZER,
                   "--packed-sequence-size", 4096, "--split-across-pack", "--num-proc", 1,
                   env={"TQDM_MININTERVAL": "0", "TQDM_MINITERS": "1"})  # fmt: skip
    bars = [b for b in proc.stderr.replace("\r", "\n").splitlines() if b.startswith("encode:")]
    percents = [int(b.split("%")[0].split()[-1]) for b in bars]
    assert any(0 < p < 100 for p in percents), bars  # it moved before the end
