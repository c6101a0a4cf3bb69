"""read_packs: every pack of an output, and an error (not fewer packs) when a shard is not the manifest's."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from packtool import read_packs
from packtool.errors import PacktoolError
from tests.conftest import DEMO, DEMO_TOKENIZER, run_cli, without_conflicts

ARGS = ["--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", "1024", "--long-samples", "truncate",
        "--shard-size", "48", "-q"]  # fmt: skip


def pack(out: Path, *extra: str) -> Path:
    run_cli("pack", *without_conflicts(DEMO / "train.jsonl", "-o", out, *ARGS, *extra))
    return out


def _unchecked(out: Path):
    """The packs of ``out`` with the shard sizes in the manifest made to match the files (so that the
    check before the first pack passes): what a shard that is not the manifest's gives past it."""
    m = json.loads((out / "manifest.json").read_text())
    for s in m["shards"]:
        s["bytes"] = (out / s["path"]).stat().st_size
    (out / "manifest.json").write_text(json.dumps(m))
    return read_packs(out, verify_checksums=False)


def test_a_tar_shard_cut_where_a_pack_ends_is_an_error(tmp_path):
    out = pack(tmp_path / "tar", "--format", "webdataset")
    shard = out / "packs-000001.tar"
    with tarfile.open(shard) as src:
        members = [(m, src.extractfile(m).read()) for m in src.getmembers()]
    keys = sorted({m.name.split(".", 1)[0] for m, _ in members})
    kept = set(keys[:10])
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as dst:  # a whole tar, 10 packs of 48
        for m, data in members:
            if m.name.split(".", 1)[0] in kept:
                dst.addfile(m, io.BytesIO(data))
    packs = []
    with pytest.raises(PacktoolError, match=r"packs-000001.tar: [\d,]+ bytes on disk, manifest says [\d,]+"):
        for p in read_packs(out):
            packs.append(p)
    assert packs == []  # the shard set is checked before the first pack
    # read unchecked past the size, the shard still holds too few packs
    with pytest.raises(PacktoolError, match=r"packs-000001.tar: 10 packs, the manifest says 48"):
        for p in _unchecked(out):
            packs.append(p)
    assert len(packs) == 48  # shard 0 whole; nothing of a shard that is not the manifest's


def test_a_parquet_shard_of_another_run_is_an_error(tmp_path):
    out = pack(tmp_path / "a")
    other = pack(tmp_path / "b", "--seed", "7")
    shutil.copy(other / "packs-000000.parquet", out / "packs-000000.parquet")
    with pytest.raises(PacktoolError, match=r"packs-000000.parquet: [\d,]+ bytes on disk"):
        list(read_packs(out))
    with pytest.raises(PacktoolError, match=r"packs-000000.parquet: shard of run \w+, the manifest is run"):
        list(_unchecked(out))


@pytest.mark.parametrize("layout", ["full", "minimal"])
def test_a_tar_shard_of_another_run_is_an_error(tmp_path, layout):
    """A tar shard's run_id is its first pack's: the .json's, or a field of a minimal pack's record."""
    out = pack(tmp_path / "a", "--format", "webdataset", "--columns", layout)
    other = pack(tmp_path / "b", "--format", "webdataset", "--columns", layout, "--seed", "7")
    for name in ("packs-000000.tar", "packs-000000.tar.idx"):
        shutil.copy(other / name, out / name)
    with pytest.raises(PacktoolError, match=r"packs-000000.tar: shard of run \w+, the manifest is run"):
        list(_unchecked(out))
    text = run_cli("verify", out, check=False).stdout
    assert "packs-000000.tar, field 'run_id': shard belongs to run " in text, text


def test_a_truncated_parquet_shard_is_named(tmp_path):
    out = pack(tmp_path / "a")
    shard = out / "packs-000001.parquet"
    shard.write_bytes(shard.read_bytes()[:-3000])
    with pytest.raises(
        PacktoolError, match=r"packs-000001.parquet: [\d,]+ bytes on disk, manifest says [\d,]+"
    ):
        list(read_packs(out))
