"""``--format webdataset``: tar shard layout, determinism, ``.tar.idx`` offsets, shard bounds, read-back.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import dataclasses
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
from packtool.packing.plan import PackPlan
from packtool.packs import PackArrays
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


def test_a_minimal_tar_pack_is_input_ids_and_one_small_columns_record(tmp_path):
    """In the minimal layout a pack is two members: input_ids.npy and small_columns.npy, a NumPy record
    holding the pack's metadata (the keys a full pack's .json has) and every other stored column as fields
    (numpy.load reads it without pickle); no .json. Read back as stored; a labels column is a member."""
    from packtool.formats.tar import PACK_META
    from packtool.formats.webdataset import TarReader, read_tar_packs, stack_packs, write_tar_shard
    from tests.unit.test_packs import N, minimal_packs

    packs = minimal_packs()
    run_id = "0123456789abcdef"
    write_tar_shard(tmp_path / "a.tar", packs, first_pack=40, run_id=run_id, shard=3, layout="minimal")
    samples = tar_samples(tmp_path / "a.tar")
    assert [set(members) for _, members in samples] == [{"input_ids.npy", "small_columns.npy"}] * 2
    with tarfile.open(tmp_path / "a.tar") as tar:
        for i, (key, members) in enumerate(samples):
            rec = np.load(
                io.BytesIO(tar.extractfile(members["small_columns.npy"]).read()), allow_pickle=False
            )
            assert rec.shape == () and rec.dtype.names == (*PACK_META, *packs.present()[1:])
            num_samples = len(packs.row("sample_index", i))
            assert {k: rec[k].item() for k in PACK_META} == {
                "pack_index": 40 + i,
                "num_tokens": int(packs.row("seq_lens", i)[:num_samples].sum()),
                "num_samples": num_samples,
                "run_id": run_id.encode(),
                "shard": 3,
            } and key == pack_key(40 + i)
            for name in packs.present()[1:]:
                want = packs.row(name, i)
                assert rec[name].dtype == want.dtype and np.array_equal(rec[name], want), name
    again = stack_packs(read_tar_packs(tmp_path / "a.tar", N, packs.present(), run_id), N)
    for name in packs.present():
        assert np.array_equal(getattr(again, name), getattr(packs, name)), name
    # inspect's fast path reads the same metadata from the records of the first and last packs
    assert TarReader().summary(tmp_path / "a.tar") == {
        "run_id": run_id,
        "shard": 3,
        "first_pack": 40,
        "num_packs": 2,
    }
    # a stored labels column is token-sized: a member of its own, as input_ids
    labeled = dataclasses.replace(packs, labels=packs.input_ids + 1, next_label=None)
    write_tar_shard(tmp_path / "b.tar", labeled, first_pack=0, run_id="r", shard=0, layout="minimal")
    (_, members), _ = tar_samples(tmp_path / "b.tar")
    assert set(members) == {"input_ids.npy", "labels.npy", "small_columns.npy"}
    with pytest.raises(ValueError, match="longer than 16 bytes"):  # the record's run_id field is 16 bytes
        write_tar_shard(tmp_path / "c.tar", packs, first_pack=0, run_id="r" * 17, shard=0, layout="minimal")


@pytest.mark.parametrize("layout", ["full", "minimal"])
def test_reading_refuses_a_tar_shard_of_another_run(tmp_path, layout):
    """The run_id of a shard's first pack (its .json, or a minimal pack's record) must be the manifest's."""
    from packtool.errors import InputError
    from packtool.formats.webdataset import read_tar_packs, write_tar_shard
    from tests.unit.test_packs import N, minimal_packs

    packs = minimal_packs()
    if layout == "full":
        packs = dataclasses.replace(packs, labels=packs.input_ids, position_ids=packs.input_ids)
    write_tar_shard(tmp_path / "a.tar", packs, first_pack=0, run_id="aaaa", shard=0, layout=layout)
    assert len(read_tar_packs(tmp_path / "a.tar", N, ["input_ids"], "aaaa")) == 2
    with pytest.raises(InputError, match="a.tar: shard of run aaaa, the manifest is run bbbb"):
        read_tar_packs(tmp_path / "a.tar", N, ["input_ids"], "bbbb")


def _plan_and_packs(seed: int, n: int, k: int, columns: set[str]) -> tuple[PackPlan, PackArrays]:
    """A random plan of ``k`` packs of ``n`` tokens (full packs and padded ones, from 1 to 40 pieces) and
    packs that fit it, holding ``columns`` of the optional ones."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 41, k)
    lengths, seq_lens, seq_offsets, cp = [], [], [0], []
    for c in counts:
        used = n if rng.random() < 0.5 else int(rng.integers(c, n))  # a full pack, or padding after
        cuts = np.sort(rng.choice(np.arange(1, used), c - 1, replace=False))
        piece = np.diff(np.r_[0, cuts, used])
        pad = np.minimum(rng.integers(0, 3, c), piece - 1) if "cp_padding" in columns else np.zeros(c, int)
        lengths += list(piece - pad)
        cp += list(pad)
        seq_lens += list(piece) + ([n - piece.sum()] if piece.sum() < n else [])
        seq_offsets.append(len(seq_lens))
    pieces = int(counts.sum())
    offsets = np.r_[0, np.cumsum(counts)]
    spans = np.array(lengths) + np.array(cp)
    plan = PackPlan(n, offsets, np.arange(pieces), np.zeros(pieces, np.int64), np.array(lengths),
                    span=spans if "cp_padding" in columns else None)  # fmt: skip
    token = rng.integers(0, 1000, (k, n)).astype(np.int32)
    packs = PackArrays(
        input_ids=token,
        seq_lens=np.array(seq_lens, np.int32),
        seq_lens_offsets=np.array(seq_offsets),
        sample_index=plan.sample,
        sample_index_offsets=offsets,
        sample_offset=plan.start,
        labels=token if "labels" in columns else None,
        position_ids=token if "position_ids" in columns else None,
        loss_mask=(token % 2).astype(np.int8) if "loss_mask" in columns else None,
        cp_padding=np.array(cp, np.int32) if "cp_padding" in columns else None,
        next_label=np.full(pieces, -100, np.int32) if "next_label" in columns else None,
        loss_mask_bits=np.packbits(token % 2, axis=1) if "loss_mask_bits" in columns else None,
    )
    return plan, packs


@pytest.mark.parametrize(
    "layout, columns",
    [
        ("full", {"labels", "position_ids"}),
        ("full", {"labels", "position_ids", "loss_mask", "cp_padding"}),
        ("minimal", {"next_label"}),
        ("minimal", {"next_label", "loss_mask_bits", "cp_padding"}),
        ("minimal", {"labels", "loss_mask_bits"}),
    ],
)
@pytest.mark.parametrize("n", [256, 4096])
def test_pack_tar_bytes_predicts_every_pack_and_shard_exactly(tmp_path, layout, columns, n):
    """``pack_tar_bytes`` (the plan alone) gives every pack's bytes as written (the .tar.idx offsets), so
    ``shard_bounds`` cuts at ``shard_max_bytes`` exactly: the shard files' sizes are the predicted ones."""
    from packtool.formats.tar import BLOCK, RECORD
    from packtool.formats.webdataset import pack_tar_bytes, shard_bounds, write_tar_shard

    plan, packs = _plan_and_packs(n + len(columns), n, 60, columns)
    stored = packs.present()
    sizes = pack_tar_bytes(plan, stored, layout)
    write_tar_shard(tmp_path / "all.tar", packs, first_pack=0, run_id="r", shard=0, layout=layout)
    assert np.diff(read_tar_index(tmp_path / "all.tar")).tolist() == sizes.tolist()
    limit = int(sizes.sum()) // 3
    bounds = shard_bounds(plan, 1000, limit, stored, layout)
    assert len(bounds) > 2
    for s, (a, b) in enumerate(bounds):
        path = tmp_path / f"{s}.tar"
        write_tar_shard(path, packs.take(np.arange(a, b)), first_pack=a, run_id="r", shard=s, layout=layout)
        size = path.stat().st_size
        assert size == -(-(int(sizes[a:b].sum()) + 2 * BLOCK) // RECORD) * RECORD <= limit
        if b < plan.num_packs:  # cut as late as the limit allows
            assert -(-(int(sizes[a : b + 1].sum()) + 2 * BLOCK) // RECORD) * RECORD > limit


def test_a_shard_is_read_from_the_bytes_it_was_checked_in_and_never_past_its_size(tmp_path, monkeypatch):
    """``shard_bytes``: what the CRC-32 is checked on and the packs parsed from is one read of the file, at
    most the entry's ``bytes`` + 1 long; a vision shard's image member over the limit is refused from its
    header, before the shard is read into memory."""
    from packtool.errors import InputError
    from packtool.formats import tar
    from packtool.formats.base import ShardMismatch
    from packtool.formats.webdataset import shard_bytes

    path = tmp_path / "packs-000000.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in (("000000000.json", b"{}"), ("000000000.img0.png", b"\x89PNG" * 750)):
            archive.addfile(tar.tarinfo(name, len(data)), io.BytesIO(data))
    size = path.stat().st_size
    assert bytes(shard_bytes(path, tmp_path, size, True, bytearray(size + 1))) == path.read_bytes()
    with pytest.raises(ShardMismatch, match=f"over {size:,} bytes as read, the manifest says {size - 1:,}"):
        shard_bytes(path, tmp_path, size - 1)
    monkeypatch.setattr(tar, "MAX_IMAGE_BYTES", 2048)
    buffer = bytearray(size + 1)
    with pytest.raises(
        InputError, match="member 000000000.img0.png takes 3,000 bytes, over the 2,048 an image"
    ):
        shard_bytes(path, tmp_path, size, True, buffer)
    assert not any(buffer)  # refused from the headers: nothing read into memory
    assert bytes(shard_bytes(path, tmp_path, size, False)) == path.read_bytes()  # (no images looked for)
