"""``packtool inspect`` on real outputs made by the CLI from the demo data.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from packtool.errors import InputError
from packtool.inspect import inspect_report, pack_report
from packtool.manifest import Manifest
from tests.conftest import DEMO
from tests.fixtures.inspect_outputs import out, tar_out  # noqa: F401 - fixtures

TRAIN = DEMO / "train.jsonl"


def _damaged_copies(out: Path, tmp_path: Path) -> dict[str, Path]:
    """Copies of ``out`` whose shard 1 (packs 100..199, row groups of 32) is damaged in one way each."""
    import pyarrow.parquet as pq

    copies = {}
    for how in ("truncated", "footer", "page", "missing"):
        copy = copies[how] = Path(shutil.copytree(out, tmp_path / how))
        shard = copy / "packs-000001.parquet"
        data = bytearray(shard.read_bytes())
        if how == "truncated":
            del data[-3000:]
        elif how == "footer":
            data[-200] ^= 0xFF
        elif how == "page":  # the zstd frame of row group 1's input_ids (packs 132..163)
            chunk = pq.ParquetFile(out / shard.name).metadata.row_group(1).column(0)
            data[data.index(b"\x28\xb5\x2f\xfd", chunk.data_page_offset)] ^= 0xFF
        if how == "missing":
            shard.unlink()
        else:
            shard.write_bytes(data)
    return copies


def test_overview_and_full_of_damaged_parquet_shards_warn(out: Path, tmp_path: Path):
    """The overview and ``--full`` of an output with a damaged shard list what is wrong as warnings (no
    error); the overview reads only footers, so it cannot see a damaged page, ``--full`` does."""
    from packtool.inspect import inspect_report
    from packtool.inspect.render import render_report

    seen = {
        "truncated": "bytes on disk, manifest says",
        "footer": "metadata unreadable (",
        "missing": "missing",
    }
    for how, copy in _damaged_copies(out, tmp_path).items():
        fast, full = inspect_report(copy), inspect_report(copy, full=True)
        assert all(w.startswith("packs-000001.parquet: ") for w in fast["warnings"])
        assert any(seen[how] in w for w in fast["warnings"]) if how in seen else fast["warnings"] == []
        assert full["recomputed"]["num_packs"] < full["num_packs"]  # shard 1's packs, or some, left out
        assert any(w.startswith("num_packs: ") for w in full["warnings"])
        if how != "missing":
            assert any(w.startswith("packs-000001.parquet") and "parse" in w for w in full["warnings"])
        render_report(full)


def test_tar_one_pack_is_read_through_the_index_and_without_it(tar_out: Path, out: Path, tmp_path: Path):
    """``--pack I`` on a tar reads only pack I's bytes through the shard's .tar.idx; without the index it
    reads the shard in order: the same pack either way (and the same as the Parquet output's pack I). An
    index that points elsewhere is damaged: refused, naming it."""
    import shutil

    from packtool.formats.registry import get_format
    from packtool.inspect import read_one_pack

    manifest = Manifest.load(tar_out)
    tar = get_format("webdataset")

    def read_tar_pack(path, row):
        return tar.reader.read_pack(path, manifest.shards[int(path.name[6:12])], row, manifest)

    copy = tmp_path / "out"
    shutil.copytree(tar_out, copy)
    idx = copy / "packs-000001.tar.idx"
    last = manifest.num_packs - 1
    for index in (0, 99, 100, 150, last):
        shard, row = divmod(index, 100)  # shards of 100 packs
        fast = read_tar_pack(tar_out / f"packs-{shard:06d}.tar", row)
        assert fast is not None
        want, _, _ = read_one_pack(out, Manifest.load(out), index)
        assert fast.keys() == want.keys()  # sample_offset too, as the Parquet path gives it
        for k in want:
            np.testing.assert_array_equal(fast[k], want[k])
    offsets = np.fromfile(idx, dtype="<u8")
    (offsets + 512).astype("<u8").tofile(idx)  # every pack one block off
    with pytest.raises(InputError, match="packs-000001.tar.idx: its offsets do not rise from 0"):
        read_tar_pack(copy / "packs-000001.tar", 50)
    idx.unlink()
    assert read_tar_pack(copy / "packs-000001.tar", 50) is None
    got, shard_name, row = read_one_pack(copy, manifest, 150)  # read in order, the slow way
    want, _, _ = read_one_pack(out, Manifest.load(out), 150)
    assert (shard_name, row) == ("packs-000001.tar", 50)
    for k in got:
        np.testing.assert_array_equal(got[k], want[k])


# (field, value, what the one-line error names): an untrusted manifest's figures are not computed with
WRONG_FIELDS = [
    (("stats", "num_packs"), None, "field 'stats.num_packs'"),
    (("stats", "fill_rate"), "x", "field 'stats.fill_rate'"),
    (("stats", "dropped_samples"), [1], "field 'stats.dropped_samples'"),
    (("shards", 0, "num_packs"), None, "field 'shards[0].num_packs'"),
    (("packed_sequence_size",), 2**70, "field 'packed_sequence_size'"),
]


@pytest.mark.parametrize("where, value, named", WRONG_FIELDS)
def test_a_manifest_field_of_the_wrong_type_is_one_error_for_every_report(out, tmp_path, where, value, named):
    """inspect (overview, --full, --pack) stops with the field's name, as read_packs and verify do; on
    246f1ae these were TypeErrors inside the report (the fuzz test found them)."""
    copy = Path(shutil.copytree(out, tmp_path / "out"))
    m = json.loads((copy / "manifest.json").read_text())
    target = m
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    (copy / "manifest.json").write_text(json.dumps(m))
    for full in (False, True):
        with pytest.raises(InputError, match=re.escape(named)):
            inspect_report(copy, full=full)
    with pytest.raises(InputError, match=re.escape(named)):
        pack_report(copy, 0)
