"""``--format webdataset``: tar shard layout, determinism, ``.tar.idx`` offsets, shard bounds, read-back."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from packtool import read_packs
from packtool.formats.tar import pack_key
from packtool.formats.tar import read_index as read_tar_index
from tests.conftest import DEMO, DEMO_TOKENIZER, manifest_json, run_cli, write_jsonl

N = 256
BASE = [
    str(DEMO / "train.jsonl"),
    "--tokenizer",
    str(DEMO_TOKENIZER),
    "--packed-sequence-size",
    str(N),
    "--long-samples",
    "truncate",
    "--add-eos",
    "--quiet",
]
NPY = {"input_ids", "labels", "position_ids", "seq_lens", "sample_index", "sample_offset"}


def pack(out: Path, *args: str) -> dict:
    run_cli("pack", *BASE, "--output", str(out), *args)
    return manifest_json(out)


@pytest.fixture(scope="module")
def wds_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wds") / "out"
    pack(out, "--format", "webdataset", "--shard-size", "64")
    return out


def tar_samples(path: Path) -> list[tuple[str, dict[str, tarfile.TarInfo]]]:
    """Samples of a tar as (key, {ext: member}), grouped the way WebDataset groups them."""
    out: list[tuple[str, dict]] = []
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            key, _, ext = m.name.partition(".")
            if not out or out[-1][0] != key:
                out.append((key, {}))
            out[-1][1][ext] = m
    return out


def test_layout_members_and_manifest(wds_out):
    m = manifest_json(wds_out)
    assert m["shard_format"] == "webdataset"
    packs = list(read_packs(wds_out, with_sample_index=True))
    assert len(packs) == m["stats"]["num_packs"] > 64  # several shards
    assert [s["path"] for s in m["shards"]] == [f"packs-{i:06d}.tar" for i in range(len(m["shards"]))]
    assert [s["num_packs"] for s in m["shards"][:-1]] == [64] * (len(m["shards"]) - 1)
    first = 0
    for shard in m["shards"]:
        path = wds_out / shard["path"]
        assert shard["first_pack"] == first
        assert shard["bytes"] == path.stat().st_size
        assert shard["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert shard["index"] == shard["path"] + ".idx" and (wds_out / shard["index"]).is_file()
        samples = tar_samples(path)
        assert [k for k, _ in samples] == [pack_key(first + i) for i in range(shard["num_packs"])]
        with tarfile.open(path) as tar:
            for key, members in samples:
                assert "." not in key and len(key) == 9
                assert set(members) == {f"{c}.npy" for c in NPY} | {"json"}  # no pickle, nothing else
                for ti in members.values():
                    assert (ti.mtime, ti.uid, ti.gid, ti.mode, ti.uname, ti.gname) == (0, 0, 0, 0o444, "", "")
                meta = json.loads(tar.extractfile(members["json"]).read())
                p = packs[int(key)]
                assert meta == {
                    "pack_index": int(key),
                    "num_tokens": int(p["seq_lens"][: len(p["sample_index"])].sum()),
                    "num_samples": len(p["sample_index"]),
                    "run_id": m["run_id"],  # verify matches shards to their manifest by these two
                    "shard": m["shards"].index(shard),
                }
                arr = np.lib.format.read_array(io.BytesIO(tar.extractfile(members["seq_lens.npy"]).read()))
                assert arr.dtype == np.int32 and np.array_equal(arr, p["seq_lens"])
        first += shard["num_packs"]
    assert sum(s["num_tokens"] for s in m["shards"]) == m["stats"]["num_tokens"]


def test_tar_idx_is_the_sample_offsets_energon_reads(wds_out):
    """Every .tar.idx holds, as little-endian uint64, the offset of each sample's first header and the end
    offset, as Energon's indexer computes them from the tar (first member of each key; offset after the
    last member)."""
    m = manifest_json(wds_out)
    for shard in m["shards"]:
        path = wds_out / shard["path"]
        expected, last = [], None
        with tarfile.open(path) as tar:
            for member in tar:
                key = member.name.partition(".")[0]
                if key != last:
                    expected.append(member.offset)
                    last = key
            expected.append(tar.offset)
        raw = (wds_out / shard["index"]).read_bytes()
        assert len(raw) == 8 * (shard["num_packs"] + 1)
        assert np.frombuffer(raw, dtype="<u8").tolist() == expected == read_tar_index(path).tolist()
        # each byte range is exactly one pack: a tar of its members alone
        data = path.read_bytes()
        for i in (0, shard["num_packs"] - 1):
            chunk = data[expected[i] : expected[i + 1]]
            with tarfile.open(fileobj=io.BytesIO(chunk + b"\0" * 1024)) as one:
                names = one.getnames()
            assert {n.partition(".")[0] for n in names} == {pack_key(shard["first_pack"] + i)}
            assert len(names) == len(NPY) + 1


def test_dataset_index_files(wds_out):
    m = manifest_json(wds_out)
    assert m["index_files"] == [
        "wids.json",
        ".nv-meta/.info.json",
        ".nv-meta/split.yaml",
        ".nv-meta/dataset.yaml",
    ]
    wids = json.loads((wds_out / "wids.json").read_text())
    assert wids["__kind__"] == "wids-shard-index-v1" and wids["wids_version"] == 1
    assert wids["shardlist"] == [
        {"url": s["path"], "nsamples": s["num_packs"], "filesize": s["bytes"]} for s in m["shards"]
    ]
    info = json.loads((wds_out / ".nv-meta" / ".info.json").read_text())
    assert info == {"shard_counts": {s["path"]: s["num_packs"] for s in m["shards"]}}
    split = yaml.safe_load((wds_out / ".nv-meta" / "split.yaml").read_text())
    assert split["split_parts"] == {"train": [s["path"] for s in m["shards"]]}
    dataset = yaml.safe_load((wds_out / ".nv-meta" / "dataset.yaml").read_text())
    assert dataset["sample_type"] == {"__module__": "packtool.energon", "__class__": "PackSample"}
    assert dataset["field_map"] == {c: f"{c}.npy" for c in m["columns"]}


def test_byte_identical_across_runs_and_num_proc(tmp_path):
    out = tmp_path / "out"

    def snapshot() -> dict[str, bytes]:
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    pack(out, "--format", "webdataset", "--shard-size", "64", "--num-proc", "1")
    first = snapshot()
    pack(out, "--format", "webdataset", "--shard-size", "64", "--num-proc", "2", "--overwrite")
    second = snapshot()
    assert first.keys() == second.keys() and len(first) > 5
    for name in first:
        assert first[name] == second[name], name


def test_read_packs_same_for_parquet_and_webdataset(wds_out, tmp_path):
    pq_out = tmp_path / "pq"
    pack(pq_out, "--shard-size", "64")
    a = list(read_packs(pq_out, with_sample_index=True))
    b = list(read_packs(wds_out, with_sample_index=True))
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k
    assert "sample_index" not in next(read_packs(wds_out))


def test_shard_max_bytes_bounds_every_tar(wds_out, tmp_path):
    limit = 200_000
    out = tmp_path / "small"
    m = pack(out, "--format", "webdataset", "--shard-size", "64", "--shard-max-bytes", str(limit))
    assert len(m["shards"]) > len(manifest_json(wds_out)["shards"])
    sizes = [(out / s["path"]).stat().st_size for s in m["shards"]]
    assert max(sizes) <= limit
    assert all(s["num_packs"] <= 64 for s in m["shards"])
    # cut as late as the bound allows: one more pack would not have fitted
    per_pack = sizes[0] // m["shards"][0]["num_packs"]
    assert sizes[0] + per_pack > limit - 10240
    for x, y in zip(read_packs(out), read_packs(wds_out), strict=True):
        assert np.array_equal(x["input_ids"], y["input_ids"])


def test_shard_max_bytes_smaller_than_one_pack_is_an_error(tmp_path):
    out = tmp_path / "tiny"
    proc = run_cli(
        "pack",
        *BASE,
        "--output",
        str(out),
        "--format",
        "webdataset",
        "--shard-max-bytes",
        "1000",
        check=False,
    )
    assert proc.returncode == 2
    assert "shard_max_bytes 1000" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()
    proc = run_cli("pack", *BASE, "--output", str(out), "--shard-max-bytes", "10000000", check=False)
    assert proc.returncode == 2 and "shard_max_bytes" in proc.stderr and "webdataset" in proc.stderr
    assert not out.exists()


def test_loss_mask_member_when_input_has_one(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(40):
        n = int(rng.integers(5, 90))
        rows.append(
            {"input_ids": rng.integers(1, 500, n).tolist(), "loss_mask": rng.integers(0, 2, n).tolist()}
        )
    src = write_jsonl(tmp_path / "tok.jsonl", rows)
    out = tmp_path / "out"
    run_cli(
        "pack", src, "--output", out, "--packed-sequence-size", "128", "--format", "webdataset", "--quiet"
    )
    m = manifest_json(out)
    assert "loss_mask" in m["columns"]
    _, members = tar_samples(out / "packs-000000.tar")[0]
    assert "loss_mask.npy" in members
    packs = list(read_packs(out))
    assert all(p["loss_mask"].dtype == np.int8 and p["loss_mask"].shape == (128,) for p in packs)
    # without labels the mask marks the tokens to learn: shifted labels train token i + 1 where its mask is
    # 1, and the stored mask is labels != -100 (README, "Labels")
    assert all(np.array_equal(p["loss_mask"], (p["labels"] != -100).astype(np.int8)) for p in packs)
    assert sum(int(p["loss_mask"].sum()) for p in packs) == sum(sum(r["loss_mask"][1:]) for r in rows)
    assert yaml.safe_load((out / ".nv-meta" / "dataset.yaml").read_text())["field_map"]["loss_mask"] == (
        "loss_mask.npy"
    )


def test_manifest_records_both_formats_alike(wds_out, tmp_path):
    """Same shard keys for both formats, plus each format's index: .tar.idx, or Parquet row-group offsets."""
    import pyarrow.parquet as pq

    pq_out = tmp_path / "pq"
    m = pack(pq_out, "--shard-size", "64", "--row-group-size", "16")
    common = {"path", "first_pack", "num_packs", "num_tokens", "bytes", "sha256"}
    for shard in manifest_json(wds_out)["shards"]:
        assert set(shard) == common | {"index"}
    for shard in m["shards"]:
        assert set(shard) == common | {"row_groups", "row_group_offsets"}
        md = pq.ParquetFile(pq_out / shard["path"]).metadata
        offsets = shard["row_group_offsets"]
        assert len(offsets) == md.num_row_groups + 1 == len(shard["row_groups"]) + 1 > 2
        assert offsets[0] == 4 and offsets == sorted(set(offsets)) and offsets[-1] < shard["bytes"]
        for i in range(md.num_row_groups):  # every column chunk of row group i lies in its byte range
            rg = md.row_group(i)
            for j in range(rg.num_columns):
                c = rg.column(j)
                first = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
                assert offsets[i] <= first and first + c.total_compressed_size <= offsets[i + 1]


def test_reader_rejects_truncated_corrupt_and_pickled_shards(wds_out, tmp_path):
    from packtool.errors import PacktoolError
    from packtool.formats.webdataset import read_tar_packs

    data = (wds_out / "packs-000000.tar").read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:5000])
    with pytest.raises(PacktoolError, match="cut.tar: truncated tar archive"):
        read_tar_packs(cut, N, ["input_ids"])
    bad = tmp_path / "bad.tar"
    bad.write_bytes(data[:2050] + b"\xff" + data[2051:])  # in the 2nd header (1st: 512 + 1536 bytes)
    with pytest.raises(PacktoolError, match="bad.tar: bad tar header checksum at byte"):
        read_tar_packs(bad, N, ["input_ids"])
    pickled = tmp_path / "pickled.tar"
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with tarfile.open(pickled, "w", format=tarfile.USTAR_FORMAT) as tar:
        ti = tarfile.TarInfo("000000000.input_ids.npy")
        ti.size = len(buf.getvalue())
        tar.addfile(ti, io.BytesIO(buf.getvalue()))
    with pytest.raises(PacktoolError, match="000000000.input_ids.npy"):
        read_tar_packs(pickled, N, ["input_ids"])


def test_packtool_imports_neither_energon_nor_torch():
    """Energon is an optional extra: importing and running packtool's writers must not need it."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = (
        "import sys, packtool, packtool.pipeline.run, packtool.cli, packtool.formats.webdataset\n"
        "print(sorted(m for m in ('torch', 'webdataset', 'megatron.energon', 'wids') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert proc.stdout.strip() == "[]"
