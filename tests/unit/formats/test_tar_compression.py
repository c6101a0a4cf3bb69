"""``--tar-compression gzip``: a tar shard's ``.npy`` members as gzip streams (``NAME.npy.gz``).

The same packs as uncompressed, through every packtool reader (``read_packs``, the loader, ``inspect``,
``verify``); a member that decompresses to more than a pack can hold (a gzip bomb), a truncated one and
a compression this packtool does not know are refused in one line, never allocated or guessed at.
(webdataset, wids and Energon read compressed outputs: tests/interop/.)"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import shutil
import tarfile
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

from packtool import read_packs
from packtool.errors import InputError
from packtool.fileio import file_digests
from packtool.formats.tar import pack_key
from packtool.formats.tar import read_index as read_tar_index
from packtool.inspect import inspect_report
from packtool.loader import PackedDataset, get_loader
from packtool.verify import verify_output
from tests.conftest import manifest_json, rewrite_tar_members
from tests.fixtures.webdataset_outputs import N, wds_gzip_out, wds_out  # noqa: F401 - fixtures


def test_options_list_the_compressions_tar_knows():
    from packtool.formats.options import TAR_COMPRESSIONS
    from packtool.formats.tar import COMPRESSIONS

    assert TAR_COMPRESSIONS == tuple(COMPRESSIONS)


def test_gzip_output_gives_the_same_packs_through_every_reader(wds_out, wds_gzip_out):
    m = manifest_json(wds_gzip_out)
    assert (m["format_version"], m["format_minor"]) == (6, 2)  # a 5.x reader would find no NAME.npy
    assert {s["compression"] for s in m["shards"]} == {"gzip"}
    raw_m = manifest_json(wds_out)
    assert {s["compression"] for s in raw_m["shards"]} == {"none"}
    assert (raw_m["format_version"], raw_m["format_minor"]) == (5, 2)  # 5.x readers read it whole
    with (
        tarfile.open(wds_gzip_out / "packs-000000.tar") as tar,
        tarfile.open(wds_out / "packs-000000.tar") as raw,
    ):
        names = tar.getnames()
        assert names[:7] == [f"{pack_key(0)}.{e}" for e in (
            "input_ids.npy.gz", "json", "labels.npy.gz", "position_ids.npy.gz", "sample_index.npy.gz",
            "sample_offset.npy.gz", "seq_lens.npy.gz")]  # fmt: skip
        for name in [n for n in names[:7] if n.endswith(".gz")]:  # the uncompressed output's, gzipped
            plain = raw.extractfile(name.removesuffix(".gz")).read()
            assert gzip.decompress(tar.extractfile(name).read()) == plain, name
    sizes = [
        (o / s["path"]).stat().st_size for o in (wds_out, wds_gzip_out) for s in manifest_json(o)["shards"]
    ]
    assert sum(sizes[len(sizes) // 2 :]) < 0.85 * sum(sizes[: len(sizes) // 2])  # N = 256: mostly tar blocks
    want = list(read_packs(wds_out, with_sample_index=True))
    got = list(read_packs(wds_gzip_out, with_sample_index=True))
    assert len(got) == len(want) > 64
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    ds = PackedDataset(wds_gzip_out, batch_size=8, shuffle=False, drop_last=False)
    ids = np.concatenate([np.asarray(b.input_ids) for b in get_loader(ds, num_workers=0)])
    assert np.array_equal(ids, np.stack([p["input_ids"] for p in want]))
    report = inspect_report(wds_gzip_out, full=True)
    assert [w for w in report["warnings"] if not w.startswith("lost: ")] == []
    verified = verify_output(wds_gzip_out)
    assert verified.ok, verified.lines()
    field_map = (wds_gzip_out / ".nv-meta" / "dataset.yaml").read_text()
    assert "input_ids: input_ids.npy.gz" in field_map


def test_minimal_gzip_shard_round_trips_and_its_summary_reads_the_record_head(tmp_path):
    from packtool.formats.webdataset import TarReader, read_tar_packs, write_tar_shard
    from tests.unit.test_packs import N as n
    from tests.unit.test_packs import minimal_packs

    packs = minimal_packs()
    fields = write_tar_shard(
        tmp_path / "a.tar", packs, first_pack=40, run_id="r", shard=3, layout="minimal", compression="gzip"
    )
    assert fields == {"index": "a.tar.idx", "compression": "gzip"}
    with tarfile.open(tmp_path / "a.tar") as tar:
        assert tar.getnames()[:2] == ["000000040.input_ids.npy.gz", "000000040.small_columns.npy.gz"]
    got = read_tar_packs(tmp_path / "a.tar", n, packs.present(), "r")
    for i, pack in enumerate(got):
        for name in packs.present():
            assert np.array_equal(pack[name], packs.row(name, i)), name
    # asking for input_ids alone, the record still decompresses within its bound
    alone = read_tar_packs(tmp_path / "a.tar", n, ["input_ids"], "r")
    assert [p.keys() for p in alone] == [{"input_ids"}] * 2
    summary = {"run_id": "r", "shard": 3, "first_pack": 40, "num_packs": 2}
    assert TarReader().summary(tmp_path / "a.tar") == summary


def test_shard_max_bytes_counts_compressed_members_at_their_largest(tmp_path):
    """Random token ids barely compress: every shard stays under shard_max_bytes all the same."""
    from packtool.formats.webdataset import pack_tar_bytes, shard_bounds, write_tar_shard
    from tests.unit.formats.test_webdataset import _plan_and_packs

    plan, packs = _plan_and_packs(3, 256, 60, {"labels", "position_ids"})
    stored = packs.present()
    bound = pack_tar_bytes(plan, stored, "full", "gzip")
    write_tar_shard(tmp_path / "all.tar", packs, first_pack=0, run_id="r", shard=0, layout="full",
                    compression="gzip")  # fmt: skip
    assert (np.diff(read_tar_index(tmp_path / "all.tar")) <= bound).all()
    limit = int(bound.sum()) // 3
    for s, (a, b) in enumerate(shard_bounds(plan, 1000, limit, stored, "full", "gzip")):
        path = tmp_path / f"{s}.tar"
        write_tar_shard(path, packs.take(np.arange(a, b)), first_pack=a, run_id="r", shard=s, layout="full",
                        compression="gzip")  # fmt: skip
        assert path.stat().st_size <= limit


def _gzip_bomb(nbytes: int) -> bytes:
    """A gzip stream of a ``.npy`` header saying ``(nbytes // 4,)`` int32 and that many zero bytes (made
    in 1 MiB steps: a few KiB of stream)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<i4", "fortran_order": False, "shape": (nbytes // 4,)}
    )
    z = zlib.compressobj(9, wbits=31)
    out = [z.compress(header.getvalue())]
    zeros = bytes(1 << 20)
    out += [z.compress(zeros) for _ in range(nbytes >> 20)]
    return b"".join([*out, z.flush()])


def _damaged_copy(src: Path, dst: Path, member: str, data: bytes) -> Path:
    """A copy of output ``src`` whose first pack's ``member`` holds ``data``, its manifest's checksums
    updated (so that the member itself is what a reader meets)."""
    shutil.copytree(src, dst)
    shard = dst / "packs-000000.tar"
    rewrite_tar_members(shard, lambda packs: packs[pack_key(0)].__setitem__(member, data))
    m = manifest_json(dst)
    m["shards"][0]["bytes"] = shard.stat().st_size
    m["shards"][0]["sha256"], m["shards"][0]["crc32"] = file_digests(shard)
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def test_a_gzip_bomb_is_refused_without_allocating_it(wds_gzip_out, tmp_path):
    bomb = _gzip_bomb(64 << 20)  # 64 MiB of zeros in about 64 KiB
    out = _damaged_copy(wds_gzip_out, tmp_path / "bomb", "input_ids.npy.gz", bomb)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"member 000000000.input_ids.npy.gz decompresses to over") as e:
            list(read_packs(out))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "\n" not in str(e.value)
    assert peak < 4 << 20  # what a pack of N = 256 tokens holds, not the 64 MiB
    verified = verify_output(out)
    assert not verified.ok and any("decompresses to over" in line for line in verified.lines())


@pytest.mark.parametrize(
    "data, message",
    [
        (lambda z: z[: len(z) // 2], "is a truncated gzip stream"),
        (lambda z: z + b"more", "has bytes after its gzip stream"),
        (lambda z: b"not gzip at all", "is not a gzip stream"),
    ],
)
def test_a_damaged_gzip_member_is_named(wds_gzip_out, tmp_path, data, message):
    with tarfile.open(wds_gzip_out / "packs-000000.tar") as tar:
        member = tar.extractfile(f"{pack_key(0)}.seq_lens.npy.gz").read()
    out = _damaged_copy(wds_gzip_out, tmp_path / "bad", "seq_lens.npy.gz", data(member))
    with pytest.raises(InputError, match=f"member 000000000.seq_lens.npy.gz {message}"):
        list(read_packs(out))
    verified = verify_output(out)
    assert not verified.ok and any(message in line for line in verified.lines()), verified.lines()


def test_an_unknown_compression_is_refused_in_one_line(wds_gzip_out, tmp_path):
    out = shutil.copytree(wds_gzip_out, tmp_path / "zstd")
    m = manifest_json(out)
    for entry in m["shards"]:
        entry["compression"] = "zstd"  # what a newer packtool might write
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError) as e:
        list(read_packs(out))
    assert "\n" not in str(e.value) and str(e.value).startswith(
        "shard packs-000000.tar, field 'compression': tar members compressed with 'zstd', which this "
        "packtool does not read (none, gzip): upgrade packtool"
    )
    verified = verify_output(out)
    assert not verified.ok and any("compressed with 'zstd'" in line for line in verified.lines())


def test_writing_is_the_same_bytes_every_time(tmp_path):
    from packtool.formats.webdataset import write_tar_shard
    from tests.unit.test_packs import minimal_packs

    packs = dataclasses.replace(minimal_packs())
    for name in ("a.tar", "b.tar"):
        write_tar_shard(tmp_path / name, packs, first_pack=0, run_id="r", shard=0, layout="minimal",
                        compression="gzip")  # fmt: skip
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
