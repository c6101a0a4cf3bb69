"""``packtool verify``: real outputs made by the CLI, damaged in each way the issue names, and verify
must name the problem (shard, pack, field) and exit 1; ``--source`` proves nothing was lost."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.utils import file_sha256
from tests.conftest import DEMO, DEMO_TOKENIZER, run_cli, write_jsonl

TRAIN = DEMO / "train.jsonl"
# sequential: the damage tests below name the shards and packs of its layout
BASE = ["--tokenizer", DEMO_TOKENIZER, "--add-eos", "-q", "--shard-size", "48", "--row-group-size", "16",
        "--strategy", "sequential"]  # fmt: skip


def pack(out: Path, *extra: str, inputs: tuple = (TRAIN,)) -> Path:
    run_cli("pack", *inputs, "-o", out, *BASE, *extra)
    return out


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    # 1000 demo samples, N=1024, 7 over N truncated: 152 packs in 4 shards of 48 (row groups of 16)
    return pack(
        tmp_path_factory.mktemp("verify") / "good",
        "--packed-sequence-size",
        "1024",
        "--long-samples",
        "truncate",
    )


@pytest.fixture
def out(good: Path, tmp_path: Path) -> Path:
    """A fresh copy of the good output for a test to damage."""
    return Path(shutil.copytree(good, tmp_path / "copy"))


def verify(*args) -> tuple[int, str]:
    proc = run_cli("verify", *args, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def rewrite_shard(out: Path, shard: int, change, *, row_group_size: int = 16, update_manifest: bool = True):
    """Rewrite shard ``shard`` after ``change(cols)`` edits its columns (dict of lists of NumPy arrays),
    keeping its packtool metadata; with ``update_manifest`` the manifest's size, sha256, counts and row
    groups follow, so that only checks of the content itself can notice."""
    m = manifest(out)
    entry = m["shards"][shard]
    path = out / entry["path"]
    table = pq.read_table(path)
    cols = {name: [np.asarray(v) for v in table.column(name).to_pylist()] for name in table.column_names}
    change(cols)
    arrays = {
        name: pa.array([list(map(int, v)) for v in values], type=table.schema.field(name).type)
        for name, values in cols.items()
    }
    new = pa.table(arrays).replace_schema_metadata(table.schema.metadata)
    pq.write_table(new, path, row_group_size=row_group_size, compression="zstd")
    if update_manifest:
        num = new.num_rows
        entry.update(
            bytes=os.path.getsize(path),
            sha256=file_sha256(path),
            num_packs=num,
            num_tokens=int(
                sum(
                    int(np.sum(s[: len(i)]))
                    for s, i in zip(cols["seq_lens"], cols["sample_index"], strict=True)
                )
            ),
            row_groups=[min(row_group_size, num - a) for a in range(0, num, row_group_size)],
        )
        m["stats"]["num_packs"] = sum(e["num_packs"] for e in m["shards"])
        (out / "manifest.json").write_text(json.dumps(m))


def test_good_output_is_ok_with_and_without_source(good: Path):
    code, text = verify(good)
    assert code == 0, text
    assert text.startswith("OK:") and "packs: 152" in text
    code, text = verify(good, "--source", "-q")
    assert code == 0, text
    assert "source samples: 1,000" in text
    # explicit source paths are the same as the manifest's inputs
    code, text = verify(good, "--source", TRAIN, "-q")
    assert code == 0, text


def test_truncated_shard(out: Path):
    path = out / "packs-000001.parquet"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    code, text = verify(out)
    assert code == 1
    assert (
        f"packs-000001.parquet, field 'bytes': {size // 2:,} bytes, manifest says {size:,} (truncated)"
        in text
    )
    assert "packs-000001.parquet: does not parse as Parquet" in text
    assert text.splitlines()[-1].startswith("FAILED")


def test_flipped_byte(out: Path):
    path = out / "packs-000002.parquet"
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 3)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    code, text = verify(out)
    assert code == 1
    assert "packs-000002.parquet, field 'sha256': sha256 differs" in text
    assert "packs-000000.parquet" not in text  # the other shards are fine


def test_missing_shard(out: Path):
    (out / "packs-000003.parquet").unlink()
    code, text = verify(out)
    assert code == 1
    assert "packs-000003.parquet: shard named in the manifest is missing" in text


def test_shard_not_in_the_manifest(out: Path):
    shutil.copy(out / "packs-000000.parquet", out / "packs-000004.parquet")
    code, text = verify(out)
    assert code == 1
    assert "packs-000004.parquet: shard file is not in the manifest" in text


def test_manifest_from_another_run(out: Path, tmp_path: Path):
    other = pack(tmp_path / "other", "--packed-sequence-size", "1024", "--long-samples", "drop")
    assert manifest(other)["run_id"] != manifest(out)["run_id"]
    shutil.copy(other / "manifest.json", out / "manifest.json")
    code, text = verify(out)
    assert code == 1
    assert "field 'run_id': shard belongs to run" in text
    assert "from another run" in text


def test_stale_index(out: Path):
    # the shard is rewritten with other row groups, the manifest's size/sha256 follow but not its index
    m = manifest(out)
    rewrite_shard(out, 0, lambda cols: None, row_group_size=20, update_manifest=False)
    m["shards"][0].update(
        bytes=os.path.getsize(out / "packs-000000.parquet"), sha256=file_sha256(out / "packs-000000.parquet")
    )
    (out / "manifest.json").write_text(json.dumps(m))
    code, text = verify(out)
    assert code == 1
    assert (
        "packs-000000.parquet, field 'row_groups': row groups [20, 20, 8] differ from the manifest's index "
        "[16, 16, 16] (stale index)" in text
    )


def test_broken_pack_layout_is_named_by_pack_and_field(out: Path):
    def change(cols):
        cols["seq_lens"][5] = cols["seq_lens"][5].copy()
        cols["seq_lens"][5][0] += 1  # sum(seq_lens) = N + 1
        cols["input_ids"][7] = cols["input_ids"][7].copy()
        cols["input_ids"][7][3] = 5000  # outside the demo tokenizer's 1300 ids

    rewrite_shard(out, 1, change)
    code, text = verify(out)
    assert code == 1
    assert "packs-000001.parquet, pack 53, field 'seq_lens': sum(seq_lens) = 1025, expected 1024" in text
    assert (
        "packs-000001.parquet, pack 55, field 'input_ids': token id 5000 at position 3 is outside the "
        "vocabulary (size 1300)" in text
    )


def test_labels_on_padding_and_misaligned(out: Path):
    def change(cols):
        lab = cols["labels"]
        lab[2] = lab[2].copy()
        lab[2][-1] = 7  # pack 2 has padding at its end
        lab[4] = lab[4].copy()
        lab[4][0] = (int(cols["input_ids"][4][1]) + 1) % 1300  # shifted label must be the next id or -100

    rewrite_shard(out, 0, change)
    code, text = verify(out)
    assert code == 1
    assert "pack 2, field 'labels': label on padding is not -100" in text
    assert "pack 4, field 'labels': label" in text and "is not aligned with input_ids" in text


def test_source_catches_a_consistently_altered_token(out: Path):
    # a token and the label that predicts it are both changed, the shard's size/sha256 recorded again:
    # every structure check passes, only the comparison with the source can see it
    def change(cols):
        ids, lab = cols["input_ids"][3].copy(), cols["labels"][3].copy()
        ids[10] = (ids[10] + 1) % 1300
        lab[9] = ids[10]
        cols["input_ids"][3], cols["labels"][3] = ids, lab

    rewrite_shard(out, 0, change)
    code, text = verify(out)
    assert code == 0, text
    code, text = verify(out, "--source", "-q")
    assert code == 1
    assert "packs-000000.parquet, pack 3, field 'input_ids': sample 16 (" in text
    assert "train.jsonl, line 17): token 10 is" in text


def test_source_catches_a_lost_pack_and_a_duplicated_pack(out: Path):
    def drop_last(cols):
        for v in cols.values():
            v.pop()

    rewrite_shard(out, 3, drop_last)  # the last pack (samples 998, 999) is gone, counts updated
    code, text = verify(out)
    assert code == 0, text
    code, text = verify(out, "--source", "-q")
    assert code == 1
    assert "sample 999 (" in text and "train.jsonl, line 1000) is missing from the packs" in text
    assert "field 'packed_samples': the source gives packed_samples" in text

    def duplicate_first(cols):
        for v in cols.values():
            v.append(v[0])

    rewrite_shard(out, 0, duplicate_first)
    code, text = verify(out, "--source", "-q")
    assert code == 1
    assert "more tokens in the packs than in the source" in text


@pytest.mark.parametrize(
    "options",
    [
        ["--packed-sequence-size", "256", "--split-across-pack"],
        ["--packed-sequence-size", "512", "--long-samples", "drop", "--max-packs", "100"],
        ["--packed-sequence-size", "512", "--split-across-pack", "--max-packs", "50"],
    ],
    ids=["split", "drop+max_packs", "split+max_packs"],
)
def test_source_accounts_for_every_sample_under_each_policy(tmp_path: Path, options: list[str]):
    rows = [{"text": "one two three " * (i % 40)} for i in range(300)]  # empty samples included
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = pack(tmp_path / "out", *options, inputs=(src,))
    s = manifest(out)["stats"]
    assert s["empty_samples"] > 0
    code, text = verify(out, "--source", "-q")
    assert code == 0, text


def test_source_with_another_input_fails(good: Path, tmp_path: Path):
    rows = [json.loads(line) for line in TRAIN.read_text().splitlines()]
    rows[10]["text"] = rows[10]["text"].replace("a", "b", 1) + " extra"
    src = write_jsonl(tmp_path / "changed.jsonl", rows)
    code, text = verify(good, "--source", src, "-q")
    assert code == 1
    assert "changed.jsonl, line 11" in text


def test_json_report_and_usage(out: Path):
    (out / "packs-000003.parquet").unlink()
    proc = run_cli("verify", out, "--json", check=False)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert report["problem_counts"] == {"missing": 1}
    assert report["problems"][0] == {
        "kind": "missing",
        "shard": "packs-000003.parquet",
        "pack": None,
        "field": None,
        "message": "shard named in the manifest is missing",
    }
    proc = run_cli("verify", out, TRAIN, check=False)
    assert proc.returncode == 2 and "pass --source" in proc.stderr


def test_not_an_output_directory(tmp_path: Path):
    code, text = verify(tmp_path)
    assert code == 1
    assert "no manifest.json" in text


def test_source_ok_for_bfd_with_split_samples_in_shuffled_packs(tmp_path):
    """bfd shuffles packs: the pieces of a split sample are put back together by sample_offset."""
    out = tmp_path / "bfd"
    run_cli("pack", TRAIN, "-o", out, "--tokenizer", DEMO_TOKENIZER, "--add-eos", "-q", "--strategy", "bfd",
            "--split-across-pack", "--packed-sequence-size", "256", "--seed", "5")  # fmt: skip
    proc = run_cli("verify", out, "--source", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
