"""``--format webdataset``: tar shard layout, determinism, ``.tar.idx`` offsets, shard bounds, read-back.

(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from packtool import read_packs
from tests.conftest import (
    DEMO,
    DEMO_TOKENIZER,
    manifest_json,
    masked_rows,
    run_cli,
    without_conflicts,
    write_jsonl,
)
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


@pytest.mark.parametrize("layout", ["full", "minimal"])
def test_byte_identical_across_runs_and_num_proc(tmp_path, layout):
    out = tmp_path / "out"

    def snapshot() -> dict[str, bytes]:
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    # Energon's key index included: index.sqlite is the same bytes too
    args = ["--format", "webdataset", "--shard-size", "64", "--columns", layout]
    pack(out, *args, "--num-proc", "1")
    first = snapshot()
    pack(out, *args, "--num-proc", "2", "--overwrite")
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
    m = pack(
        out,
        "--format",
        "webdataset",
        "--shard-size",
        "64",
        "--shard-max-bytes",
        str(limit),
        "--no-energon-index",
    )
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
    assert proc.returncode == 2 and "--shard-max-bytes" in proc.stderr and "webdataset" in proc.stderr
    assert not out.exists()


def test_loss_mask_member_when_input_has_one(tmp_path):
    rows = masked_rows(40, 5, 90, 500, seed=0)
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
    """Same shard keys for both formats, plus each format's own: .tar.idx and compression, or Parquet's
    row-group offsets and content digest."""
    import pyarrow.parquet as pq

    pq_out = tmp_path / "pq"
    m = pack(pq_out, "--shard-size", "64", "--row-group-size", "16")
    common = {"path", "first_pack", "num_packs", "num_tokens", "bytes", "sha256", "crc32"}
    for shard in manifest_json(wds_out)["shards"]:
        assert set(shard) == common | {"index", "compression"}
    for shard in m["shards"]:
        assert set(shard) == common | {"row_groups", "row_group_offsets", "content_digest"}
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
