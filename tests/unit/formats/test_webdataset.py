"""``--format webdataset``: tar shard layout, determinism, ``.tar.idx`` offsets, shard bounds, read-back.

(In-process tests; the CLI's are in tests/e2e.)"""

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
from tests.conftest import DEMO, DEMO_TOKENIZER, manifest_json, run_cli, without_conflicts
from tests.fixtures.webdataset_outputs import wds_out  # noqa: F401 - fixtures

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
    run_cli("pack", *without_conflicts(*BASE, "--output", str(out), *args))
    return manifest_json(out)


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
        ".nv-meta/crude.yaml",
    ]  # and Energon's key index without --no-energon-index: tests/interop/test_energon_prepared.py
    wids = json.loads((wds_out / "wids.json").read_text())
    assert wids["__kind__"] == "wids-shard-index-v1" and wids["wids_version"] == 1
    assert wids["shardlist"] == [
        {"url": s["path"], "nsamples": s["num_packs"], "filesize": s["bytes"]} for s in m["shards"]
    ]
    info = json.loads((wds_out / ".nv-meta" / ".info.json").read_text())
    assert info == {"shard_counts": {s["path"]: s["num_packs"] for s in m["shards"]}}
    split = yaml.safe_load((wds_out / ".nv-meta" / "split.yaml").read_text())
    assert split["split_parts"] == {"train": [s["path"] for s in m["shards"]], "val": [], "test": []}
    dataset = yaml.safe_load((wds_out / ".nv-meta" / "dataset.yaml").read_text())
    assert dataset["sample_type"] == {"__module__": "packtool.energon", "__class__": "PackSample"}
    assert dataset["field_map"] == {c: f"{c}.npy" for c in m["columns"]}
    crude = yaml.safe_load((wds_out / ".nv-meta" / "crude.yaml").read_text())
    assert crude == {
        "__module__": "megatron.energon",
        "__class__": "CrudeWebdataset",
        "subflavors": {"packtool": "pack"},
    }


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


def test_a_tar_shard_of_minimal_packs_reads_back_as_stored(tmp_path):
    """The tar members are the columns the packs hold (here the minimal layout's), one .npy each."""
    import tarfile

    import numpy as np

    from packtool.formats.webdataset import read_tar_packs, stack_packs, write_tar_shard
    from tests.unit.test_packs import N, minimal_packs

    packs = minimal_packs()
    write_tar_shard(tmp_path / "a.tar", packs, first_pack=0, run_id="r", shard=0)
    with tarfile.open(tmp_path / "a.tar") as tar:
        names = tar.getnames()
    assert "000000000.next_label.npy" in names and "000000000.loss_mask_bits.npy" in names
    assert not any("labels.npy" in n or "position_ids" in n for n in names)
    again = stack_packs(read_tar_packs(tmp_path / "a.tar", N, packs.present(), "r"), N)
    for name in packs.present():
        assert np.array_equal(getattr(again, name), getattr(packs, name)), name
