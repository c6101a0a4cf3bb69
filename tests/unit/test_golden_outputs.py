"""Outputs written by every earlier format version (tests/golden/, made by scripts/make_golden.py with the
commits that wrote them) read with the current code: the packs their own ``read_packs`` gave, through
``read_packs`` and the loader, and ``inspect`` and ``verify`` find no problem. And an output whose
manifest and tar ``.json`` carry fields this version does not know reads with at most a note."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packtool.errors import InputError
from packtool.fileio import file_digests
from packtool.inspect import inspect_report
from packtool.loader import PackedDataset, get_loader
from packtool.manifest import BASE_FORMAT_VERSION, FORMAT_MINOR, FORMAT_VERSION, NEWEST_MINOR, Manifest
from packtool.reading import read_packs
from packtool.verify import verify_output
from tests.conftest import rewrite_tar_members

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
sys.path.insert(0, str(ROOT / "scripts"))
from make_golden import pack_digest  # noqa: E402 - scripts/ is not a package

OUTPUTS = sorted(p.with_suffix("").with_suffix("") for p in GOLDEN.glob("v*/*.expected.json"))


def _expected(output: Path) -> dict:
    return json.loads(output.with_name(output.name + ".expected.json").read_text())


def test_every_earlier_version_is_there():
    versions = {_expected(p)["format_version"] for p in OUTPUTS}
    assert versions == set(range(2, FORMAT_VERSION))
    assert sum(f.stat().st_size for f in GOLDEN.rglob("*") if f.is_file()) < 1_200_000


@pytest.mark.parametrize("output", OUTPUTS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_golden_output_reads_as_its_own_version_read_it(output: Path):
    expected = _expected(output)
    packs = list(read_packs(output, with_sample_index=True))
    assert [pack_digest(p) for p in packs] == expected["pack_digests"]
    # the loader gives the same packs, in order
    ds = PackedDataset(output, batch_size=1, shuffle=False, drop_last=False)
    loaded = [(b.input_ids[0], b.labels[0], b.position_ids[0]) for b in get_loader(ds, num_workers=0)]
    assert len(loaded) == len(packs)
    for (ids, labels, pos), pack in zip(loaded, packs, strict=True):
        for got, name in ((ids, "input_ids"), (labels, "labels"), (pos, "position_ids")):
            np.testing.assert_array_equal(np.asarray(got), pack[name])
    report = inspect_report(output, full=True)
    assert [w for w in report["warnings"] if not w.startswith("lost: ")] == []
    verified = verify_output(output)
    assert verified.ok, verified.lines()


def test_format_2_stats_of_the_counts_era_are_no_damage():
    """Format 2 before f5c97c8 counted packed_samples with overlapping counts, no whole_samples: the
    issue's case (pretokenized, --split-across-pack) said 'packed_samples is 40, its fates add up to 19'."""
    output = GOLDEN / "v2" / "pretok-split-parquet"
    raw = json.loads((output / "manifest.json").read_text())["stats"]
    assert "whole_samples" not in raw and raw["packed_samples"] == 40
    stats = Manifest.load(output).stats
    assert stats.accounting == "counts" and stats.check() == []
    assert sum(stats.sample_fates().values()) == stats.input_samples == 40


def _with_unknown_fields(src: Path, dst: Path) -> Path:
    """A copy of ``src`` whose manifest carries a newer minor version and unknown fields everywhere, and
    whose tar shards' packs each carry one more field in their ``.json``."""
    shutil.copytree(src, dst)
    path = dst / "manifest.json"
    m = json.loads(path.read_text())
    if m["shard_format"] == "webdataset":
        for entry in m["shards"]:
            shard = dst / entry["path"]
            rewrite_tar_members(shard, _add_pack_field)
            entry["bytes"] = shard.stat().st_size
            entry["sha256"], entry["crc32"] = file_digests(shard)
    m["format_minor"] = NEWEST_MINOR[m["format_version"]] + 3
    m["future_section"] = {"anything": [1, 2]}
    m["provenance"]["packs_per_shard"] = m["provenance"].pop("shard_size")  # an option renamed
    m["provenance"]["future_option"] = True
    m["stats"]["future_count"] = 7
    m["stats"]["samples_per_pack"]["median"] = 3
    m["tokenizer"]["future_identity"] = "x"
    m["histograms"]["pack_fill"]["future"] = 1
    m["histograms"]["future_histogram"] = {"edges": [0, 1], "counts": [1], "unit": "x"}
    m["inputs"][0]["future_input_field"] = 1
    for entry in m["shards"]:
        entry["future_entry_field"] = {"a": 1}
    path.write_text(json.dumps(m))
    return dst


def _add_pack_field(packs: dict[str, dict[str, bytes]]) -> None:
    for members in packs.values():
        members["json"] = json.dumps({**json.loads(members["json"]), "future_pack_field": [1]}).encode()


@pytest.fixture(scope="module")
def current_outputs(tmp_path_factory) -> dict[str, Path]:
    """A small output of the current version in each shard format (tar: with a field added to each
    pack's .json)."""
    from click.testing import CliRunner

    from packtool.cli import main

    work = tmp_path_factory.mktemp("current")
    (work / "in.jsonl").write_text(
        "".join(json.dumps({"text": f"sample {i} " * (i % 9 + 1)}) + "\n" for i in range(40))
    )
    out = {}
    for fmt in ("parquet", "webdataset"):
        out[fmt] = work / fmt
        args = ["pack", str(work / "in.jsonl"), "-o", str(out[fmt]), "--tokenizer",
                str(ROOT / "data/demo/tokenizer.json"), "--packed-sequence-size", "64", "--format", fmt,
                "--shard-size", "4", "-q"]  # fmt: skip
        args += ["--no-energon-index"] if fmt == "webdataset" else []
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_unknown_fields_everywhere_read_with_a_note(current_outputs, tmp_path, fmt):
    src = current_outputs[fmt]
    want = [pack_digest(p) for p in read_packs(src, with_sample_index=True)]
    output = _with_unknown_fields(src, tmp_path / "out")
    assert [pack_digest(p) for p in read_packs(output, with_sample_index=True)] == want
    ds = PackedDataset(output, batch_size=1, shuffle=False, drop_last=False)
    assert len(list(get_loader(ds, num_workers=0))) == len(want)
    report = inspect_report(output, full=True)
    assert [w for w in report["warnings"] if not w.startswith("lost: ")] == []
    newer = f"{BASE_FORMAT_VERSION}.{NEWEST_MINOR[BASE_FORMAT_VERSION] + 3}"  # a text output says 5.x
    assert len(report["notes"]) == 1 and newer in report["notes"][0]
    verified = verify_output(output)
    assert verified.ok, verified.lines()
    assert verified.notes == report["notes"]
    # what a newer minor version wrote beside the known fields is kept when the entry is written back
    m = Manifest.load(output)
    assert m.shards[0].to_dict()["future_entry_field"] == {"a": 1}
    assert m.option("packs_per_shard") == 4 and m.option("shard_size") is None


def test_a_newer_major_version_is_refused_in_one_line(current_outputs, tmp_path):
    output = shutil.copytree(current_outputs["parquet"], tmp_path / "out")
    m = json.loads((output / "manifest.json").read_text())
    m["format_version"], m["format_minor"] = FORMAT_VERSION + 1, 2
    (output / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError) as e:
        list(read_packs(output))
    message = str(e.value)
    assert "\n" not in message
    assert (
        f"format_version {FORMAT_VERSION + 1}.2" in message and f"({FORMAT_VERSION}.{FORMAT_MINOR}" in message
    )


def test_a_format_s_own_entry_field_is_still_checked(tmp_path):
    """``row_groups`` is Parquet's field of a shard entry (``ParquetFields``): inspect and verify still
    compare it with the file."""
    output = shutil.copytree(GOLDEN / "v4" / "text-parquet", tmp_path / "out")
    m = json.loads((output / "manifest.json").read_text())
    real = m["shards"][0]["row_groups"]
    m["shards"][0]["row_groups"] = [real[0] + 1, *real[1:-1], real[-1] - 1]
    (output / "manifest.json").write_text(json.dumps(m))
    warnings = inspect_report(output)["warnings"]
    want = f"packs-000000.parquet: row_groups {real} in the file"
    assert any(w.startswith(want) for w in warnings), warnings
    assert not verify_output(output).ok


def test_the_manifest_depends_on_no_writer_option():
    """The reading contract is the manifest's own: reading one imports nothing of the writer's options."""
    code = "import sys, packtool.manifest; print('packtool.config' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
