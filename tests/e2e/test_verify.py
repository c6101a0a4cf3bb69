"""``packtool verify``: real outputs made by the CLI, damaged in each way the issue names, and verify
must name the problem (shard, pack, field) and exit 1; ``--source`` proves nothing was lost."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool import read_packs
from packtool.errors import EXIT_INPUT
from packtool.fileio import file_sha256
from packtool.formats.parquet_content import CONTENT_KEY, ContentRecord, record_digest, table_digests
from packtool.manifest import SamplesPerPack, total_stats
from tests.conftest import DEMO, DEMO_TOKENIZER, rewrite_tar_members, run_cli, without_conflicts, write_jsonl

TRAIN = DEMO / "train.jsonl"
# sequential: the damage tests below name the shards and packs of its layout
BASE = ["--tokenizer", DEMO_TOKENIZER, "--add-eos", "-q", "--shard-size", "48", "--row-group-size", "16",
        "--strategy", "sequential"]  # fmt: skip


def pack(out: Path, *extra: str, inputs: tuple = (TRAIN,)) -> Path:
    run_cli("pack", *without_conflicts(*inputs, "-o", out, *BASE, *extra))
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
    keeping its packtool metadata, with a content record of its new row groups (as one who knows
    packtool's digests would forge it); with ``update_manifest`` the manifest's size, sha256, counts, row
    groups, content digest and totals follow, so that only checks of the packs themselves can notice."""
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
    new = pa.table(arrays)
    record = ContentRecord(new.column_names, table_digests(new, row_group_size)).to_bytes()
    new = new.replace_schema_metadata({**table.schema.metadata, CONTENT_KEY: record})
    pq.write_table(new, path, row_group_size=row_group_size, compression="zstd")
    if update_manifest:
        entry["content_digest"] = record_digest(record)
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
        packs, tokens = (sum(e[key] for e in m["shards"]) for key in ("num_packs", "num_tokens"))
        per_pack = [len(v) for e in m["shards"] for v in pq.read_table(out / e["path"])["sample_index"]]
        m["stats"].update(
            total_stats(m["packed_sequence_size"], packs, tokens),
            samples_per_pack=dataclasses.asdict(
                SamplesPerPack.of(packs, sum(per_pack), min(per_pack), max(per_pack))
            ),
        )
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


def test_position_ids_that_are_not_the_layouts_are_named(out: Path):
    """position_ids go to the model as they are: each pack's must be what its seq_lens and pieces give."""

    def change(cols):
        cols["position_ids"][2] = np.full_like(cols["position_ids"][2], 5)
        cols["position_ids"][30] = cols["position_ids"][30] - 3

    rewrite_shard(out, 0, change)
    code, text = verify(out)
    assert code == 1
    assert "packs-000000.parquet, pack 2, field 'position_ids': position id 5 at position 0" in text
    assert "packs-000000.parquet, pack 30, field 'position_ids': position id -3 at position 0" in text
    assert "2 problem(s)" in text


def test_broken_pack_layout_is_named_by_pack_and_field(out: Path):
    def change(cols):
        cols["seq_lens"][5] = cols["seq_lens"][5].copy()
        cols["seq_lens"][5][0] += 1  # sum(seq_lens) = N + 1
        cols["input_ids"][7] = cols["input_ids"][7].copy()
        cols["input_ids"][7][3] = 5000  # outside the demo tokenizer's 1300 ids
        cols["labels"][20] = cols["labels"][20][:-1]  # in the second row group of the shard

    rewrite_shard(out, 1, change)
    code, text = verify(out)
    assert code == 1
    assert "packs-000001.parquet, pack 53, field 'seq_lens': sum(seq_lens) = 1025, expected 1024" in text
    assert (
        "packs-000001.parquet, pack 55, field 'input_ids': token id 5000 at position 3 is outside the "
        "vocabulary (size 1300)" in text
    )
    # problems found while reading a row group name global packs too
    assert (
        "packs-000001.parquet, pack 68, field 'labels': has 1023 values, expected packed_sequence_size"
        in text
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
    code, text = verify(out)  # the shards and the totals agree, but the fates no longer add up
    assert code == 1 and "field 'stats': token fates add up to" in text, text
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
        ["--packed-sequence-size", "64", "--long-samples", "truncate", "--max-packs", "60"],
    ],
    ids=["split", "drop+max_packs", "split+max_packs", "truncate+max_packs"],
)
def test_source_accounts_for_every_sample_under_each_policy(tmp_path: Path, options: list[str]):
    rows = [{"text": "one two three " * (i % 40)} for i in range(300)]  # empty samples included
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = pack(tmp_path / "out", *options, inputs=(src,))
    s = manifest(out)["stats"]
    assert s["empty_samples"] > 0
    code, text = verify(out, "--source", "-q")
    assert code == 0, text


@pytest.mark.parametrize("strategy", ["bfd", "sequential"])
def test_max_packs_cutting_through_samples_verifies_and_inspects_clean(tmp_path: Path, strategy: str):
    """--max-packs cuts split samples: the partly kept ones count as packed and as partial_samples, the
    others as samples_over_max_packs, and verify --source and inspect --full agree with the manifest."""
    out = tmp_path / "out"
    run_cli(
        "pack", TRAIN, "-o", out, "--tokenizer", DEMO_TOKENIZER, "--add-eos", "--packed-sequence-size", "512",
        "--split-across-pack", "--max-packs", "33", "--strategy", strategy, "-q",
    )  # fmt: skip
    s = manifest(out)["stats"]
    assert s["partial_samples"] > 0
    assert s["packed_samples"] + s["samples_over_max_packs"] + s["empty_samples"] == s["num_samples"]
    code, text = verify(out, "--source", "-q")
    assert code == 0, text
    report = json.loads(run_cli("inspect", out, "--full", "--json").stdout)
    assert [w for w in report["warnings"] if not w.startswith("lost: ")] == []  # only what max_packs cut
    assert any("left out by max_packs" in w for w in report["warnings"])


def test_source_with_another_input_fails(good: Path, tmp_path: Path):
    rows = [json.loads(line) for line in TRAIN.read_text().splitlines()]
    rows[10]["text"] = rows[10]["text"].replace("a", "b", 1) + " extra"
    src = write_jsonl(tmp_path / "changed.jsonl", rows)
    code, text = verify(good, "--source", src, "-q")
    assert code == 1
    assert "changed.jsonl, line 11" in text


def test_manifest_totals_that_disagree_with_the_shards(out: Path):
    # each total the manifest's stats derive from the shards' packs and tokens, changed by hand
    m = manifest(out)
    s = m["stats"]
    tokens = s["num_tokens"]
    s["num_tokens"] += 5
    s["padding_tokens"] += 1
    s["fill_rate"] = 0.5
    s["lower_bound_packs"] -= 1
    s["packs_over_lower_bound"] += 1
    s["samples_per_pack"]["max"] += 1
    (out / "manifest.json").write_text(json.dumps(m))
    code, text = verify(out)
    assert code == 1
    assert f"field 'num_tokens': the shards list {tokens:,} tokens, stats say {tokens + 5:,}" in text
    assert "field 'fill_rate': stats say 0.5, the shards' 152 packs of " in text
    for key in ("padding_tokens", "lower_bound_packs", "packs_over_lower_bound", "samples_per_pack.max"):
        assert f"manifest.json, field '{key}': stats say " in text
    # each derived total is recomputed from the shards, not from the stats beside it: one problem each
    # the six totals, and the token fates that no longer add up to the input tokens
    assert text.splitlines()[-1].startswith("FAILED") and ": 7 problem(s)" in text


def test_every_bad_pack_is_counted_and_the_first_are_listed(out: Path):
    # all 48 packs of shard 0 (three row groups of 16) start with an id outside the vocabulary
    def change(cols):
        for ids in cols["input_ids"]:
            ids[0] = 5000

    rewrite_shard(out, 0, change)
    proc = run_cli("verify", out, "--source", "-q", "--json", check=False)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["problem_counts"] == {"vocab": 48, "source": 48}
    assert [p["pack"] for p in report["problems"] if p["kind"] == "vocab"] == list(range(10))
    code, text = verify(out)
    assert "... and 38 more problem(s) of kind 'vocab'" in text and ": 48 problem(s)" in text


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
    assert code == EXIT_INPUT  # not an output at all: an error, as inspect says it
    assert text.startswith("packtool: error: ") and "no manifest.json" in text


def test_source_ok_for_bfd_with_split_samples_in_shuffled_packs(tmp_path):
    """bfd shuffles packs: the pieces of a split sample are put back together by sample_offset."""
    out = tmp_path / "bfd"
    run_cli("pack", TRAIN, "-o", out, "--tokenizer", DEMO_TOKENIZER, "--add-eos", "-q", "--strategy", "bfd",
            "--split-across-pack", "--packed-sequence-size", "256", "--seed", "5")  # fmt: skip
    proc = run_cli("verify", out, "--source", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- webdataset (tar) output: the same damage, and what only a tar can get wrong --------------------------
@pytest.fixture(scope="module")
def good_tar(tmp_path_factory) -> Path:
    # the layout of ``good`` as tar shards: 152 packs in 4 shards of 48, 48, 48, 8
    return pack(
        tmp_path_factory.mktemp("verify-tar") / "good",
        "--packed-sequence-size",
        "1024",
        "--long-samples",
        "truncate",
        "--format",
        "webdataset",
    )


@pytest.fixture
def tar_out(good_tar: Path, tmp_path: Path) -> Path:
    """A fresh copy of the good tar output for a test to damage."""
    return Path(shutil.copytree(good_tar, tmp_path / "copy"))


def tar_index(out: Path, shard: int) -> np.ndarray:
    return np.fromfile(out / f"packs-{shard:06d}.tar.idx", dtype="<u8").astype(np.int64)


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def unnpy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def rewrite_tar(out: Path, shard: int, change, *, update_index: bool = True, update_manifest: bool = True):
    """Rewrite tar shard ``shard`` after ``change(packs)`` edits its members (``{key: {ext: bytes}}``, in
    order); the ``.tar.idx`` and, with ``update_manifest``, the manifest's size and sha256 follow, so that
    only checks of the content itself can notice."""
    m = manifest(out)
    entry = m["shards"][shard]
    path = out / entry["path"]
    index = out / entry["index"]
    stale = index.read_bytes()
    rewrite_tar_members(path, change)
    if not update_index:
        index.write_bytes(stale)
    if update_manifest:
        entry.update(bytes=os.path.getsize(path), sha256=file_sha256(path))
        (out / "manifest.json").write_text(json.dumps(m))


def test_tar_good_output_is_ok_with_and_without_source(good_tar: Path):
    code, text = verify(good_tar)
    assert code == 0, text
    assert text.startswith("OK:") and "shards: 4, packs: 152" in text
    code, text = verify(good_tar, "--source", "-q")
    assert code == 0, text
    assert "source samples: 1,000" in text


@pytest.mark.parametrize("cut", ["inside a member", "at a pack boundary"])
def test_tar_truncated_shard(tar_out: Path, cut: str):
    path = tar_out / "packs-000001.tar"
    size, offsets = path.stat().st_size, tar_index(tar_out, 1)
    new = size // 2 if cut == "inside a member" else int(offsets[20])
    os.truncate(path, new)
    code, text = verify(tar_out)
    assert code == 1
    assert f"packs-000001.tar, field 'bytes': {new:,} bytes, manifest says {size:,} (truncated)" in text
    if cut == "inside a member":
        pack_no = 48 + int(np.searchsorted(offsets, new, side="right")) - 1
        assert f"packs-000001.tar, pack {pack_no}: does not parse as tar: truncated tar archive" in text
    else:  # every member whole, but the archive stops short: no end blocks, 20 packs, a stale index
        assert "packs-000001.tar: the archive does not end with zero blocks" in text
        assert "packs-000001.tar, field 'num_packs': holds 20 packs, manifest says 48" in text
        assert "packs-000001.tar.idx holds 49 offsets, the tar has 20 packs + 1 (stale index)" in text
    assert "packs-000000.tar" not in text and text.splitlines()[-1].startswith("FAILED")


def test_tar_flipped_byte_in_a_header_and_in_a_token(tar_out: Path):
    # shard 2, pack 5 (global 101): a bit of its first header's name flips, the header checksum fails
    header = int(tar_index(tar_out, 2)[5])
    path = tar_out / "packs-000002.tar"
    data = bytearray(path.read_bytes())
    data[header + 10] ^= 0x01
    path.write_bytes(bytes(data))
    # shard 1, pack 5 (global 53): the top byte of token 3 flips, the id leaves the vocabulary
    path = tar_out / "packs-000001.tar"
    with tarfile.open(path) as tar:
        member = tar.getmember("000000053.input_ids.npy")
    data = bytearray(path.read_bytes())
    start = member.offset_data + member.size - 1024 * 4  # the values end the member
    before = int(np.frombuffer(bytes(data[start + 12 : start + 16]), "<i4")[0])
    data[start + 15] ^= 0x01
    path.write_bytes(bytes(data))
    code, text = verify(tar_out)
    assert code == 1
    assert "packs-000002.tar, field 'sha256': sha256 differs" in text
    assert (
        f"packs-000002.tar, pack 101: does not parse as tar: bad tar header checksum at byte {header}" in text
    )
    assert "packs-000001.tar, field 'sha256': sha256 differs" in text
    assert (
        f"packs-000001.tar, pack 53, field 'input_ids': token id {before + (1 << 24)} at position 3 is "
        "outside the vocabulary (size 1300)" in text
    )
    assert "packs-000000.tar" not in text


def test_tar_header_field_that_is_not_octal(tar_out: Path):
    # shard 0, pack 7: a letter in its first header's size field (octal digits only) is a bad header,
    # named by shard, pack and byte (the parser raises it as PacktoolError, as read_tar_pack expects)
    header = int(tar_index(tar_out, 0)[7])
    path = tar_out / "packs-000000.tar"
    data = bytearray(path.read_bytes())
    data[header + 124] = ord("z")
    path.write_bytes(bytes(data))
    code, text = verify(tar_out)
    assert code == 1
    problem = f"packs-000000.tar, pack 7: does not parse as tar: bad tar header checksum at byte {header}"
    assert problem in text
    assert "internal error" not in text


def test_tar_missing_shard(tar_out: Path):
    (tar_out / "packs-000003.tar").unlink()
    code, text = verify(tar_out)
    assert code == 1
    assert "packs-000003.tar: shard named in the manifest is missing" in text


def test_tar_shard_not_in_the_manifest(tar_out: Path):
    shutil.copy(tar_out / "packs-000000.tar", tar_out / "packs-000004.tar")
    shutil.copy(tar_out / "packs-000000.tar.idx", tar_out / "packs-000004.tar.idx")
    code, text = verify(tar_out)
    assert code == 1
    assert "packs-000004.tar: shard file is not in the manifest" in text
    assert "packs-000004.tar.idx: index file of a shard the manifest does not name" in text


def test_shard_of_the_other_format_not_in_the_manifest(good: Path, good_tar: Path, tmp_path: Path):
    # a shard of the other format left beside an output's own shards
    for source, other, suffix in ((good, good_tar, "tar"), (good_tar, good, "parquet")):
        out = Path(shutil.copytree(source, tmp_path / source.parent.name))
        shutil.copy(other / f"packs-000000.{suffix}", out / f"packs-000005.{suffix}")
        code, text = verify(out)
        assert code == 1
        assert f"packs-000005.{suffix}: shard file is not in the manifest" in text
        assert ": 1 problem(s)" in text


def test_tar_manifest_from_another_run(tar_out: Path, tmp_path: Path):
    other = pack(tmp_path / "other", "--packed-sequence-size", "1024", "--long-samples", "drop",
                 "--format", "webdataset")  # fmt: skip
    mine, theirs = manifest(tar_out)["run_id"], manifest(other)["run_id"]
    assert mine != theirs
    shutil.copy(other / "manifest.json", tar_out / "manifest.json")
    code, text = verify(tar_out)
    assert code == 1
    for i in range(3):  # too long samples dropped: 144 packs, 3 shards in the other run
        assert (
            f"packs-00000{i}.tar, field 'run_id': shard belongs to run {mine}, the manifest to run {theirs} "
            "(a manifest or shard from another run)" in text
        )
    assert f"wids.json, field 'name': \"packtool-{mine}\" in the file" in text
    assert "packs-000003.tar: shard file is not in the manifest" in text
    assert "members are named" not in text  # a foreign shard is said once, not as every pack misplaced


def test_tar_stale_index_files(tar_out: Path, tmp_path: Path):
    # the shard gains a member in pack 2, its size and sha256 recorded again, but not its .tar.idx:
    # every offset after pack 2 moves
    offsets = tar_index(tar_out, 0)
    rewrite_tar(tar_out, 0, lambda packs: packs["000000002"].update(txt=b"x"), update_index=False)
    # the wids and Energon indexes of another run (shards of 40 packs)
    other = pack(tmp_path / "other", "--packed-sequence-size", "1024", "--long-samples", "truncate",
                 "--format", "webdataset", "--shard-size", "40")  # fmt: skip
    shutil.copy(other / "wids.json", tar_out / "wids.json")
    shutil.copy(other / ".nv-meta" / ".info.json", tar_out / ".nv-meta" / ".info.json")
    shutil.copy(other / "packs-000001.tar.idx", tar_out / "packs-000001.tar.idx")
    code, text = verify(tar_out)
    assert code == 1
    assert "packs-000000.tar, pack 2: unexpected member(s) 000000002.txt" in text
    assert (
        f"packs-000000.tar, pack 3, field 'index': packs-000000.tar.idx puts pack 3 at byte {offsets[3]}, "
        f"the tar at byte {offsets[3] + 1024} (46 offset(s) differ: stale index)" in text
    )
    assert (
        "packs-000001.tar, field 'index': packs-000001.tar.idx holds 41 offsets, the tar has 48 packs + 1 "
        "(stale index)" in text
    )
    # name (run_id), then nsamples and filesize of shards 0, 1, 2 and 3 differ
    assert "wids.json, field 'name': \"packtool-" in text and "(stale index; 8 more field(s) differ)" in text
    assert (
        ".nv-meta/.info.json, field 'shard_counts.packs-000000.tar': 40 in the file, the manifest gives 48 "
        "(stale index; 3 more field(s) differ)" in text
    )
    (tar_out / "packs-000002.tar.idx").unlink()
    code, text = verify(tar_out)
    assert "packs-000002.tar, field 'index': index file packs-000002.tar.idx is missing" in text


def test_tar_broken_packs_are_named_by_pack_and_field(tar_out: Path):
    def change(packs):
        del packs["000000049"]["labels.npy"]
        p = packs["000000050"]
        p["input_ids.npy"] = npy(unnpy(p["input_ids.npy"]).astype(np.int64))
        p = packs["000000051"]
        seq_lens = unnpy(p["seq_lens.npy"])
        seq_lens[0] += 1
        p["seq_lens.npy"] = npy(seq_lens)
        p = packs["000000052"]
        p["json"] = json.dumps({**json.loads(p["json"]), "run_id": "0123456789abcdef"}).encode()

    run_id = manifest(tar_out)["run_id"]
    rewrite_tar(tar_out, 1, change)
    code, text = verify(tar_out)
    assert code == 1
    assert "packs-000001.tar, pack 49: missing member(s) 000000049.labels.npy" in text
    assert (
        "packs-000001.tar, pack 50, field 'input_ids': int64 array of shape (1024,), expected a 1-D int32 "
        "array" in text
    )
    assert "packs-000001.tar, pack 51, field 'seq_lens': sum(seq_lens) = 1025, expected 1024" in text
    assert "packs-000001.tar, pack 51, field 'num_tokens': 000000051.json says num_tokens" in text
    assert (
        f"packs-000001.tar, pack 52, field 'run_id': 000000052.json says run_id 0123456789abcdef, expected "
        f"{run_id}" in text
    )
    assert "packs-000000.tar" not in text and "pack 48" not in text


def test_tar_source_catches_a_consistently_altered_token(tar_out: Path):
    def change(packs):
        p = packs["000000003"]
        ids, lab = unnpy(p["input_ids.npy"]), unnpy(p["labels.npy"])
        ids[10] = (ids[10] + 1) % 1300
        lab[9] = ids[10]
        p["input_ids.npy"], p["labels.npy"] = npy(ids), npy(lab)

    rewrite_tar(tar_out, 0, change)
    code, text = verify(tar_out)
    assert code == 0, text
    code, text = verify(tar_out, "--source", "-q")
    assert code == 1
    assert "packs-000000.tar, pack 3, field 'input_ids': sample 16 (" in text
    assert "train.jsonl, line 17): token 10 is" in text


def test_tar_output_of_an_older_or_newer_format_version(tar_out: Path):
    # an output written before format_version 2: no run_id or shard in the packs' .json
    def strip(packs):
        for members in packs.values():
            meta = json.loads(members["json"])
            members["json"] = json.dumps(
                {k: meta[k] for k in ("pack_index", "num_tokens", "num_samples")}
            ).encode()

    for shard in range(4):
        rewrite_tar(tar_out, shard, strip)
    m = manifest(tar_out)
    m["format_version"] = 1
    for s in m["shards"]:
        del s["crc32"]  # format 3 on: an older manifest has none
    (tar_out / "manifest.json").write_text(json.dumps(m))
    code, text = verify(tar_out)
    assert code == 1
    assert text.splitlines()[0] == (
        "problem: manifest.json, field 'format_version': written by an older packtool (format_version 1): "
        "its tar shards carry no run_id, so they cannot be matched to this manifest; pack it again to verify "
        "it (it still loads)"
    )
    assert "FAILED" in text and "1 problem(s)" in text  # one message, not one per shard or pack
    assert sum(1 for _ in read_packs(tar_out)) == 152
    m["format_version"] = 99
    (tar_out / "manifest.json").write_text(json.dumps(m))
    code, text = verify(tar_out)
    newer = f"format_version 99.{m['format_minor']} is newer than this packtool reads (6.2 and older"
    assert code == 1 and newer in text


def test_minimal_tar_output_of_format_version_3_is_checked_as_readers_read_it(tmp_path: Path):
    """Format 3's minimal tar packs held one member per column and a .json (tests/golden/v3): verify reads
    them as read_packs does, finds a sound one OK and names a damaged shard once."""
    out = shutil.copytree(Path(__file__).parents[1] / "golden" / "v3" / "chat-minimal-tar", tmp_path / "min")
    code, text = verify(out)
    assert code == 0 and "packs: 6" in text, text
    shard = out / "packs-000000.tar"
    data = bytearray(shard.read_bytes())
    data[1100] ^= 0xFF  # inside the first pack's first member
    shard.write_bytes(bytes(data))
    code, text = verify(out)
    assert code == 1
    assert "problem: packs-000000.tar: cannot be read (" in text


def test_tar_source_ok_for_bfd_with_split_samples(tmp_path):
    out = tmp_path / "bfd"
    run_cli("pack", TRAIN, "-o", out, "--tokenizer", DEMO_TOKENIZER, "--add-eos", "-q", "--strategy", "bfd",
            "--split-across-pack", "--packed-sequence-size", "256", "--seed", "5", "--format", "webdataset",
            "--shard-size", "100")  # fmt: skip
    code, text = verify(out, "--source")
    assert code == 0, text


def test_context_parallel_padding_verifies_and_its_damage_is_named(tmp_path: Path):
    """``--cp-size``: every piece padded to a multiple of 2 x cp_size; ``verify --source`` finds every
    token with the padding left out, and padding that is not padding, or a ``cp_padding`` that does not
    fit its piece, is named."""
    out = pack(tmp_path / "cp", "--packed-sequence-size", "1024", "--long-samples", "split", "--cp-size", "4")
    code, text = verify(out, "--source", TRAIN)
    assert code == 0, text
    first = next(read_packs(out, with_sample_index=True))
    assert np.all((first["seq_lens"][: len(first["sample_index"])] % 8) == 0) and first["cp_padding"].any()

    def change(cols):
        cp, sl = cols["cp_padding"][0], cols["seq_lens"][0]
        j = int(np.flatnonzero(cp)[0])  # pack 0's first padded piece: its last cell is padding
        ids = cols["input_ids"][0] = cols["input_ids"][0].copy()
        ids[int(np.sum(sl[: j + 1])) - 1] = 5
        cols["cp_padding"][1] = cols["cp_padding"][1].copy()
        cols["cp_padding"][1][0] = cols["seq_lens"][1][0]  # as long as its piece

    rewrite_shard(out, 0, change, update_manifest=False)
    code, text = verify(out)
    assert code == 1
    assert "pack 0, field 'input_ids': padding is not pad_token_id" in text
    assert "pack 1, field 'cp_padding': cp_padding is negative or not shorter than its piece" in text
