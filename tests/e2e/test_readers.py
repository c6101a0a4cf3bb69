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
from tests.conftest import DEMO_TOKENIZER, run_cli, write_jsonl


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


def test_a_documentation_tree_packs_with_its_subdirectories_and_says_what_it_left_out(tmp_path):
    """A tree as corpora ship: text files a level down, files known by name only (README, a gzip
    changelog), a hidden directory. By name, the .txt files are packed and the rest is said in one
    warning; with --input-format text every file is a sample (the gzip one decompressed), and verify
    --source and inspect --locate read the files as the run did."""
    import gzip

    tree = tmp_path / "doc"
    for d in ("pkg-a", "pkg-b", ".git"):
        (tree / d).mkdir(parents=True)
    (tree / "pkg-a" / "guide.txt").write_text("the guide of a")
    (tree / "pkg-b" / "notes.txt").write_text("notes of b")
    (tree / "pkg-b" / "README").write_text("read me first")
    (tree / "pkg-b" / "changelog.Debian.gz").write_bytes(gzip.compress(b"version 1 released"))
    (tree / ".git" / "HEAD.txt").write_text("never packed")
    tok = ["--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", 64]
    by_name = run_cli("pack", tree, "-o", tmp_path / "a", *tok, "--strategy", "sequential")
    assert (
        f"packtool: warning: {tree}: 2 files of no known format not read (pkg-b/README, "
        "pkg-b/changelog.Debian.gz; known: .jsonl .json .ndjson .parquet .txt .tar, compressed or not; "
        "--input-format text reads every file as text)"
    ) in by_name.stderr.splitlines()
    assert f"packtool: note: {tree}: 1 hidden entry left out (.git)" in by_name.stderr
    assert "packed 2 of 2 samples whole" in by_name.stderr
    report = json.loads(run_cli("inspect", tmp_path / "a", "--json").stdout)
    assert any("2 files of no known format not read" in w for w in report["warnings"])

    out = tmp_path / "b"
    as_text = run_cli("pack", tree, "-o", out, *tok, "--strategy", "sequential", "--input-format", "text")
    assert "packed 4 of 4 samples whole" in as_text.stderr and "warning" not in as_text.stderr
    run_cli("verify", out, "--source")
    pack = json.loads(run_cli("inspect", out, "--pack", 0, "--locate", "--decode", "--json").stdout)
    assert [p["text"] for p in pack["pieces"]] == [
        "the guide of a", "read me first", "version 1 released", "notes of b"
    ]  # fmt: skip
    assert [(p["source"]["row_kind"], p["source"]["row"]) for p in pack["pieces"]] == [
        ("file", 0), ("file", 1), ("file", 2), ("file", 3)
    ]  # fmt: skip


def test_a_directory_and_one_below_it_count_their_own_samples(tmp_path):
    """`docs docs/sub`: docs is read with its subdirectory, then docs/sub again, as given; each input's
    entry in the manifest counts the samples it gave (docs' are not counted again for docs/sub's)."""
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "sub/c.txt"):
        (docs / name).write_text(f"text of {name}")
    out = tmp_path / "out"
    run_cli(
        "pack", docs, docs / "sub", "-o", out, "--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", 64
    )
    m = json.loads((out / "manifest.json").read_text())
    assert [(i["source"], i["num_samples"]) for i in m["inputs"]] == [(str(docs), 3), (str(docs / "sub"), 1)]
    assert m["stats"]["num_samples"] == 4
