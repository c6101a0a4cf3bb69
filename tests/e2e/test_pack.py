"""The whole ``pack`` pipeline: determinism across --num-proc, the manifest, atomic output.

(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from packtool import read_packs
from tests.conftest import DEMO, DEMO_TOKENIZER, ROOT, manifest_json, run_cli, write_jsonl


def _pretokenized(tmp_path: Path, count: int = 500, seed: int = 0, max_len: int = 300) -> Path:
    rng = np.random.default_rng(seed)
    rows = [
        {"input_ids": rng.integers(0, 30000, size=n).tolist()} for n in rng.integers(1, max_len, size=count)
    ]
    return write_jsonl(tmp_path / "pre.jsonl", rows)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("split", [False, True])
def test_output_is_byte_identical_for_any_num_proc(tmp_path, split):
    extra = ["--split-across-pack"] if split else []
    outs = []
    for num_proc in (1, 2):
        out = tmp_path / f"out{num_proc}"
        run_cli(
            "pack",
            DEMO / "train.jsonl",
            "-o",
            out,
            "--tokenizer",
            DEMO_TOKENIZER,
            "--add-eos",
            "--packed-sequence-size",
            512,
            "--strategy",
            "sequential",
            *([] if "--split-across-pack" in extra else ["--long-samples", "truncate"]),
            "--chunk-size",
            100,
            "--shard-size",
            40,
            "--num-proc",
            num_proc,
            "-q",
            *extra,
        )
        outs.append(_files(out))
    assert outs[0].keys() == outs[1].keys() and len(outs[0]) > 3  # several shards + manifest
    for name in outs[0]:
        assert outs[0][name] == outs[1][name], name


@pytest.mark.parametrize("strategy", ["sequential", "bfd"])
def test_parquet_inputs_read_by_the_workers_give_the_same_bytes(tmp_path, strategy):
    # Parquet rows are read where they are encoded: row groups (37 rows) cut across chunks (50 rows) and
    # files; one process, or two workers each given runs of chunks, write the same bytes, with every token
    import pyarrow as pa

    rng = np.random.default_rng(3)
    samples = [rng.integers(1, 30000, size=int(n)).tolist() for n in rng.integers(1, 200, size=300)]
    for k, part in enumerate((samples[:170], samples[170:])):
        pq.write_table(pa.table({"input_ids": part}), tmp_path / f"p{k}.parquet", row_group_size=37)
    outs = []
    for num_proc in (1, 2):
        out = tmp_path / f"out{num_proc}"
        run_cli(
            "pack", tmp_path / "p*.parquet", "-o", out, "--packed-sequence-size", 256, "--strategy", strategy,
            "--split-across-pack", "--chunk-size", 50, "--shard-size", 10, "--num-proc", num_proc, "-q",
        )  # fmt: skip
        outs.append(_files(out))
    assert outs[0].keys() == outs[1].keys() and len(outs[0]) > 3
    for name in outs[0]:
        assert outs[0][name] == outs[1][name], name
    pieces: dict[int, list] = {}
    for pack in read_packs(tmp_path / "out1", with_sample_index=True):
        at = 0
        for i, off, n in zip(pack["sample_index"], pack["sample_offset"], pack["seq_lens"], strict=False):
            pieces.setdefault(int(i), []).append((int(off), pack["input_ids"][at : at + n].tolist()))
            at += n
    rebuilt = [sum((t for _, t in sorted(pieces[i])), []) for i in range(len(samples))]
    assert rebuilt == samples


def test_manifest_describes_the_run(tmp_path):
    src = _pretokenized(tmp_path)
    out = tmp_path / "out"
    run_cli(
        "pack",
        src,
        "-o",
        out,
        "--packed-sequence-size",
        256,
        "--strategy",
        "sequential",
        "--long-samples",
        "drop",
        "--shard-size",
        30,
        "--row-group-size",
        8,
        "-q",
    )
    m = manifest_json(out)
    s = m["stats"]
    packs = list(read_packs(out))
    lengths = [len(json.loads(line)["input_ids"]) for line in open(src)]
    assert m["packed_sequence_size"] == 256 and (m["format_version"], m["format_minor"]) == (5, 2)
    assert m["provenance"]["long_samples"] == "drop" and "num_proc" not in m["provenance"]
    assert s["num_samples"] == 500 and s["num_packs"] == len(packs)
    assert s["dropped_samples"] == sum(n > 256 for n in lengths) > 0
    assert all(int(p["seq_lens"].sum()) == 256 for p in packs)
    assert s["num_tokens"] == sum(lengths) - s["dropped_tokens"]
    assert s["fill_rate"] == pytest.approx(s["num_tokens"] / (s["num_packs"] * 256), abs=1e-6)
    assert s["lower_bound_packs"] == -(-s["num_tokens"] // 256)
    assert sum(sh["num_packs"] for sh in m["shards"]) == s["num_packs"]
    for sh in m["shards"]:
        pf = pq.ParquetFile(out / sh["path"])
        assert pf.metadata.num_rows == sh["num_packs"] and os.path.getsize(out / sh["path"]) == sh["bytes"]
        assert [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)] == sh["row_groups"]
        assert json.loads(pf.schema_arrow.metadata[b"packtool"])["run_id"] == m["run_id"]
    assert not (tmp_path / "out.partial").exists() and not (tmp_path / "out.lock").exists()


def test_dropped_samples_are_counted(tmp_path):
    rows = [{"input_ids": [1] * n} for n in (10, 300, 20, 257, 5)]
    out = tmp_path / "out"
    run_cli(
        "pack",
        write_jsonl(tmp_path / "in.jsonl", rows),
        "-o",
        out,
        "--packed-sequence-size",
        256,
        "--strategy",
        "sequential",
        "--long-samples",
        "drop",
        "-q",
    )
    s = manifest_json(out)["stats"]
    assert (s["dropped_samples"], s["dropped_tokens"], s["packed_samples"]) == (2, 557, 3)


def test_parquet_schema_is_the_documented_one(tmp_path):
    out = tmp_path / "out"
    run_cli(
        "pack",
        _pretokenized(tmp_path, 50, max_len=60),
        "-o",
        out,
        "--packed-sequence-size",
        64,
        "--strategy",
        "sequential",
        "-q",
    )
    schema = pq.read_schema(out / "packs-000000.parquet")
    assert {f.name: str(f.type) for f in schema} == {
        "input_ids": "list<element: int32>",
        "labels": "list<element: int32>",
        "position_ids": "list<element: int32>",
        "seq_lens": "list<element: int32>",
        "sample_index": "list<element: int64>",
        "sample_offset": "list<element: int64>",
    }
    pack = next(read_packs(out, with_sample_index=True))
    assert pack["input_ids"].dtype == np.int32 and pack["input_ids"].shape == (64,)
    assert pack["sample_index"].tolist() == list(range(len(pack["sample_index"])))


def test_overwrite_is_required_to_replace_output(tmp_path):
    src = _pretokenized(tmp_path, 20, max_len=30)
    out = tmp_path / "out"
    run_cli("pack", src, "-o", out, "--packed-sequence-size", 32, "-q")
    again = run_cli("pack", src, "-o", out, "--packed-sequence-size", 32, "-q", check=False)
    assert again.returncode == 2 and "exists; pass --overwrite" in again.stderr
    run_cli("pack", src, "-o", out, "--packed-sequence-size", 64, "--overwrite", "-q")
    assert manifest_json(out)["packed_sequence_size"] == 64


def test_bad_input_late_in_the_stream_leaves_nothing(tmp_path):
    src = _pretokenized(tmp_path, 300, max_len=50)
    with open(src, "a") as f:
        f.write('{"input_ids": [1, 2, "x"]}\n')
    out = tmp_path / "out"
    proc = run_cli(
        "pack", src, "-o", out, "--packed-sequence-size", 64, "--chunk-size", 50, "--num-proc", 2, check=False
    )
    assert proc.returncode == 3
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"packtool: error: {src}, line 301, field 'input_ids'")
    )
    assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_killed_run_leaves_no_output_that_looks_complete(tmp_path):
    src = _pretokenized(tmp_path, 4000, max_len=400)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "packtool.cli",
            "pack",
            str(src),
            "-o",
            str(out),
            "--packed-sequence-size",
            "128",
            "--shard-size",
            "2",
            "--split-across-pack",
            "--strategy",
            "sequential",
            "-q",
        ],
        env=env,
    )
    partial = tmp_path / "out.partial"
    deadline = time.time() + 60
    while time.time() < deadline and not list(partial.glob("packs-*.parquet")):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(partial.glob("packs-*.parquet")), "the run finished before it could be interrupted"
    assert not out.exists()
    assert not (partial / "manifest.json").exists()


@pytest.mark.parametrize("strategy", ["bfd", "sequential"])
def test_max_packs_stats_partition_the_samples(tmp_path, strategy):
    """A sample partly kept under --max-packs is counted once, as packed (and partial), not also as over."""
    out = tmp_path / "out"
    run_cli(
        "pack", DEMO / "train.jsonl", "-o", out, "--tokenizer", DEMO_TOKENIZER, "--add-eos",
        "--packed-sequence-size", 512, "--split-across-pack", "--max-packs", 33, "--strategy", strategy, "-q",
    )  # fmt: skip
    s = manifest_json(out)["stats"]
    assert s["num_packs"] == 33 and s["num_tokens"] + s["tokens_over_max_packs"] == s["input_tokens"]
    assert s["packed_samples"] + s["empty_samples"] + s["samples_over_max_packs"] == s["num_samples"]
    kept = set()
    for pack in read_packs(out, with_sample_index=True):
        kept.update(int(i) for i in pack["sample_index"])
    assert len(kept) == s["packed_samples"]
    # the pack cut at max_packs leaves some sample partly kept; one fate per sample, adding up to the input
    assert s["partial_samples"] > 0
    fates = ("whole_samples", "split_samples", "truncated_samples", "partial_samples")
    assert sum(s[k] for k in fates) == s["packed_samples"]
