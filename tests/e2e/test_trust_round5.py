"""An output directory read as untrusted input, round five (issue 44, items 1, 4, 6, 7, 8 and 11): each
case damages a copy of a finished output as a crafted one would be (the manifest re-signed to follow: sizes,
sha256, CRC-32, content digests), and every reader must refuse it in one line naming the file and field,
``verify`` must report it (exit 1, never 4), and no pack that is not the run's may come out.

* item 1: a tar shard overwritten in place (the same inode) by another run's, right after the reader checked
  it, gives the checked bytes' packs (it is read from what was checked), at 0 and 2 workers; a Parquet shard
  so overwritten after it was opened is refused as its row groups are read;
* ``CASES`` (items 4, 6, 7, 8, 11): ``read_packs``, the loader and ``verify`` on each damage.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.errors import InputError
from packtool.fileio import file_digests
from packtool.formats import parquet, tar
from packtool.formats.parquet_content import CONTENT_KEY, ContentRecord, record_digest, table_digests
from packtool.loader import PackedDataset, get_loader
from packtool.reading import read_packs
from packtool.verify import verify_output
from tests.conftest import run_cli, time_limit, write_jsonl

N = 64
PACKS, SHARD = 180, 40  # the output: 180 packs in 5 shards of 40


@pytest.fixture(autouse=True)
def hang_limit():
    """Fail a case that runs past 120 s instead of hanging the suite."""
    with time_limit(120):
        yield


def pretokenized(path: Path, seed: int) -> Path:
    """``PACKS`` samples of ``N`` tokens: one pack each (every shard of every run the same size in tar)."""
    rng = np.random.default_rng(seed)
    return write_jsonl(path, [{"input_ids": rng.integers(5, 900, N).tolist()} for _ in range(PACKS)])


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """``webdataset`` and ``parquet`` outputs of one input, and ``other-*``: another run's (other tokens)."""
    base = tmp_path_factory.mktemp("round5")
    made = {}
    for run, seed in (("", 0), ("other-", 1)):
        src = pretokenized(base / f"{run}in.jsonl", seed)
        for fmt in ("webdataset", "parquet"):
            made[run + fmt] = base / (run + fmt)
            args = ["--packed-sequence-size", N, "--shard-size", SHARD, "--format", fmt]
            args += ["--row-group-size", 8] if fmt == "parquet" else []
            run_cli("pack", src, *args, "-q", "-o", made[run + fmt])
    return made


def copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "out"))


def packs_by_index(out: Path) -> dict[int, list[int]]:
    """Every pack of ``out`` as the loader gives it (0 workers, in order): ``{pack_index: input_ids}``."""
    ds = PackedDataset(out, batch_size=4, shuffle=False)
    return {
        int(i): ids.tolist()
        for batch in get_loader(ds, num_workers=0)
        for i, ids in zip(batch.pack_index, batch.input_ids, strict=True)
    }


def overwrite_in_place(path: Path, data: bytes) -> None:
    """``path``'s bytes replaced by ``data`` in the same inode (``cp`` over a file does so)."""
    inode = path.stat().st_ino
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()
    assert path.stat().st_ino == inode


# --- item 1: a shard overwritten in place under a running loader ----------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_item_1_a_tar_shard_overwritten_after_its_check_is_read_from_the_checked_bytes(
    tmp_path, outputs, monkeypatch, workers
):
    out = copy(outputs["webdataset"], tmp_path)
    want = packs_by_index(out)
    shard = out / "packs-000003.tar"
    other = (outputs["other-webdataset"] / "packs-000003.tar").read_bytes()
    assert len(other) == shard.stat().st_size and other != shard.read_bytes()
    swapped = tmp_path / "swapped"  # (a file: the workers are other processes)
    walk = tar.samples

    def swap_after_the_first_pack(path, buf, complete=None):
        """The shard's packs as the reader walks them; another run's shard copied over it once the first
        pack's run_id and place were checked (workers inherit this: fork)."""
        packs = walk(path, buf, complete)
        yield next(packs)
        if Path(path).name == shard.name and not swapped.exists():
            overwrite_in_place(shard, other)
            swapped.touch()
        yield from packs

    monkeypatch.setattr(tar, "samples", swap_after_the_first_pack)
    ds = PackedDataset(out, batch_size=4, shuffle=False)
    got = {
        int(i): ids.tolist()
        for batch in get_loader(ds, num_workers=workers)
        for i, ids in zip(batch.pack_index, batch.input_ids, strict=True)
    }
    assert swapped.exists()  # the shard was overwritten while it was being read
    assert got == want  # every pack the run's own, none of the other run's shard
    with pytest.raises(InputError, match="packs-000003.tar: checksum mismatch"):  # read again: refused
        list(read_packs(out))


def test_item_1_a_parquet_shard_overwritten_after_it_was_opened_is_refused(tmp_path, outputs, monkeypatch):
    out = copy(outputs["parquet"], tmp_path)
    want = packs_by_index(out)
    shard = out / "packs-000003.parquet"
    other = (outputs["other-parquet"] / "packs-000003.parquet").read_bytes()
    swapped = tmp_path / "swapped"
    read = parquet.OpenShard.read

    def swap_after_open(self, row_group, columns=None):
        if parquet.shard_metadata(self.parquet)["shard"] == 3 and row_group == 1 and not swapped.exists():
            overwrite_in_place(shard, other)  # opened and checked, its first row group read
            swapped.touch()
        return read(self, row_group, columns)

    monkeypatch.setattr(parquet.OpenShard, "read", swap_after_open)
    got = {}
    with pytest.raises(InputError) as err:
        for batch in get_loader(PackedDataset(out, batch_size=4, shuffle=False), num_workers=2):
            got.update(zip(batch.pack_index.tolist(), batch.input_ids.tolist(), strict=True))
    # (torch wraps a worker's error in its traceback: the message is its last line)
    assert "packs-000003.parquet, row group 1: cannot read packs" in str(err.value), str(err.value)
    assert swapped.exists() and all(want[i] == ids for i, ids in got.items())


# --- the damages ----------------------------------------------------------------------------------------
def edit_manifest(out: Path, edit: Callable[[dict], None]) -> None:
    m = json.loads((out / "manifest.json").read_text())
    edit(m)
    (out / "manifest.json").write_text(json.dumps(m))


def rewrite_parquet(
    out: Path,
    name: str,
    *,
    own: Callable[[dict], None] | None = None,
    content: bytes | None = None,
    table=None,
) -> None:
    """Shard ``name`` written again as packtool writes it (its row groups, settings and page CRCs), with its
    ``packtool`` metadata edited by ``own``, its content record ``content`` (default: the digests of what it
    now holds) and its rows ``table`` (default: its own); its manifest entry re-signed to follow (bytes,
    sha256, CRC-32, content_digest, image_bytes): only the shard itself can tell."""
    path = out / name
    pf = pq.ParquetFile(path)
    groups = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
    table = pf.read() if table is None else table
    pf.close()
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != CONTENT_KEY}
    if own is not None:
        record = json.loads(meta[b"packtool"])
        own(record)
        meta[b"packtool"] = json.dumps(record, sort_keys=True).encode()
    table = table.replace_schema_metadata(meta)
    if content is None:
        digests = [d for a, g in zip(np.cumsum([0, *groups[:-1]]), groups, strict=True)
                   for d in table_digests(table.slice(int(a), g), g)]  # fmt: skip
        content = ContentRecord(table.schema.names, digests).to_bytes()
    settings = dict(
        compression="zstd", use_dictionary=False, write_statistics=False, write_page_checksum=True
    )
    with pq.ParquetWriter(path, table.schema, **settings) as writer:
        for a, rows in zip(np.cumsum([0, *groups[:-1]]), groups, strict=True):
            writer.write_table(table.slice(int(a), rows))
        writer.add_key_value_metadata({CONTENT_KEY: content})
    md = pq.ParquetFile(path).metadata
    sha, crc = file_digests(path)

    def follow(m: dict) -> None:
        entry = next(e for e in m["shards"] if e["path"] == name)
        entry.update(bytes=path.stat().st_size, sha256=sha, crc32=crc, content_digest=record_digest(content))
        entry.update(row_group_offsets=parquet.row_group_offsets(md))
        if "image_bytes" in entry:
            entry["image_bytes"] = parquet.image_bytes(md)

    edit_manifest(out, follow)


def nested_content_record(out: Path) -> None:
    """Shard 1's footer record ``packtool.content`` nested 100,000 deep, the manifest's content_digest (and
    size, checksums) set to match."""
    rewrite_parquet(out, "packs-000001.parquet", content=b"[" * 100_000 + b"]" * 100_000)


def footer_first_pack(out: Path) -> None:
    """Shard 2's own first_pack (its footer) one less, the shard re-signed in the manifest."""
    rewrite_parquet(out, "packs-000002.parquet", own=lambda r: r.update(first_pack=r["first_pack"] - 1))


def manifest_first_pack(out: Path) -> None:
    """Shard 2's entry's first_pack one less, nothing else changed (nothing re-signed)."""
    edit_manifest(out, lambda m: m["shards"][2].update(first_pack=m["shards"][2]["first_pack"] - 1))


def processor_field(key: str, value, minor: int | None = None) -> Callable[[Path], None]:
    """The vision processor record's ``key`` set to ``value`` (and ``format_minor`` to ``minor``: an
    edit that also claims an older version, whose record was not bound)."""

    def edit(m: dict) -> None:
        m["vision"]["processor"][key] = value
        if minor is not None:
            m["format_minor"] = minor

    return lambda out: edit_manifest(out, edit)


IMAGE_LIMIT = 1 << 20  # MAX_IMAGE_BYTES in these cases (the check is the same at 256 MiB)


def huge_image_cell(out: Path) -> None:
    """The first image's bytes replaced by 2 MiB of zeros (zstd keeps them a few KiB; the footer's bound,
    five images of 1 MiB, admits them), the shard re-signed with its content record, ``image_bytes`` and
    all: only the image's own length tells (at 1 GiB, read_packs reached 3.2 GB before refusing it)."""
    table = pq.read_table(out / "packs-000000.parquet")
    images = table.column("images").combine_chunks()
    cells = images.values.field("bytes").to_pylist()
    cells[0] = bytes(2 * IMAGE_LIMIT)
    struct = pa.StructArray.from_arrays(
        [pa.array(cells, pa.binary()), images.values.field("path")], names=["bytes", "path"]
    )
    column = pa.ListArray.from_arrays(images.offsets, struct)
    table = table.set_column(table.schema.get_field_index("images"), "images", column)
    rewrite_parquet(out, "packs-000000.parquet", table=table)


def images_of_600_kib(out: Path) -> None:
    """Every image 600 KiB (a page of them takes more than one image may, each less): read as it is."""
    table = pq.read_table(out / "packs-000000.parquet")
    images = table.column("images").combine_chunks()
    cells = [os.urandom(600 << 10) for _ in range(len(images.values))]
    struct = pa.StructArray.from_arrays(
        [pa.array(cells, pa.binary()), images.values.field("path")], names=["bytes", "path"]
    )
    column = pa.ListArray.from_arrays(images.offsets, struct)
    rewrite_parquet(
        out,
        "packs-000000.parquet",
        table=table.set_column(table.schema.get_field_index("images"), "images", column),
    )


@dataclass
class Case:
    item: str
    name: str
    output: str  # the fixture output damaged: "parquet" or "vision"
    damage: Callable[[Path], None]
    message: str  # in the one-line InputError of read_packs and the loader
    verify_message: str  # in verify's report
    before_decoding: bool = False  # refused before any row group is decoded


BOUND = "field 'vision.processor': not the processor record its run_key binds"
CASES = [
    Case("4", "a footer record nested 100,000 deep", "parquet", nested_content_record,
         "packs-000001.parquet: its packtool.content record is not JSON (nested too deep)",
         "its packtool.content record is not JSON (nested too deep)"),
    Case("6", "a shard's own first_pack one less, re-signed", "parquet", footer_first_pack,
         "packs-000002.parquet: the shard's own first_pack is 79, the manifest's 80",
         "shard metadata says its first pack is 79, its place in the manifest's shard list 80"),
    Case("7", "the manifest's first_pack one less", "parquet", manifest_first_pack,
         "manifest.json: field 'shards[2].first_pack': 79, where the shards before it end at pack 80",
         "field 'shards[2].first_pack': 79, where the shards before it end at pack 80"),
    Case("8", "loss_on edited", "vision", processor_field("loss_on", "all"), BOUND, BOUND),
    Case("8", "chat_template_sha256 edited", "vision", processor_field("chat_template_sha256", "0" * 64),
         BOUND, BOUND),
    Case("8", "image_token edited", "vision", processor_field("image_token", "<image>"), BOUND, BOUND),
    Case("8", "image_token_ids edited", "vision", processor_field("image_token_ids", [7]), BOUND, BOUND),
    Case("8", "image_token_ids edited, format_minor set to 1", "vision",
         processor_field("image_token_ids", [7], minor=1), BOUND, BOUND),
    Case("11", "an image cell over MAX_IMAGE_BYTES, re-signed", "vision", huge_image_cell,
         "packs-000000.parquet: row group 0, column images.list.element.bytes: image 0 takes 2,097,152 "
         "bytes, over the 1,048,576 an image may take (read before any page is decoded)",
         "image 0 takes 2,097,152 bytes, over the 1,048,576 an image may take (read before any page is "
         "decoded)", before_decoding=True),
]  # fmt: skip


@pytest.fixture(scope="module")
def vision_out(tmp_path_factory) -> dict[str, Path]:
    """A vision-language output of a tiny Qwen2-VL processor's (``vision``) and the ``processor``'s
    directory."""
    from tests.fixtures.vision_inputs import write_llava_input
    from tests.fixtures.vision_processors import build_qwen2vl

    root = tmp_path_factory.mktemp("round5_vision")
    processor = build_qwen2vl(root / "qwen2vl")
    source = write_llava_input(root / "in")
    run_cli("pack", "--processor", processor, source, "-o", root / "out", "--packed-sequence-size", 120, "-q")
    return {"vision": root / "out", "processor": processor}


@pytest.mark.parametrize("case", CASES, ids=[f"item {c.item}: {c.name}" for c in CASES])
def test_case(tmp_path, outputs, vision_out, monkeypatch, case: Case):
    monkeypatch.setattr(parquet, "MAX_IMAGE_BYTES", IMAGE_LIMIT)
    src = vision_out["vision"] if case.output == "vision" else outputs[case.output]
    out = copy(src, tmp_path)
    want = [p["input_ids"].tolist() for p in read_packs(out)]
    case.damage(out)
    if case.before_decoding:
        decoded = pq.ParquetFile.read_row_group
        monkeypatch.setattr(pq.ParquetFile, "read_row_group", lambda *a, **k: pytest.fail("a page decoded"))
    got = []
    with pytest.raises(InputError) as err:
        for pack in read_packs(out):
            got.append(pack["input_ids"].tolist())
    assert case.message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert got == want[: len(got)]  # only the run's own packs before the refusal
    if case.output != "vision":  # (a vision output's loader needs its processor: below)
        for workers in (0, 2):
            with pytest.raises(InputError, match=re.escape(case.message.split(": ", 1)[1])):
                list(get_loader(PackedDataset(out, batch_size=4, shuffle=False), num_workers=workers))
    if case.before_decoding:
        monkeypatch.setattr(pq.ParquetFile, "read_row_group", decoded)
    report = verify_output(out)  # in process: it sees the MAX_IMAGE_BYTES of these cases
    lines = "\n".join(report.lines())
    assert not report.ok and case.verify_message in lines, lines


EXIT_CASES = [c for c in CASES if c.item in ("4", "6", "7") or c.name == "loss_on edited"]


@pytest.mark.parametrize("case", EXIT_CASES, ids=[f"item {c.item}: {c.name}" for c in EXIT_CASES])
def test_verify_says_so_in_exit_1(tmp_path, outputs, vision_out, case: Case):
    out = copy(vision_out["vision"] if case.output == "vision" else outputs[case.output], tmp_path)
    case.damage(out)
    proc = run_cli("verify", out, check=False)
    assert proc.returncode == 1, proc.stderr  # problems found (item 4 was exit 4: an internal error)
    assert case.verify_message in proc.stdout, proc.stdout


def test_item_7_the_loader_numbers_packs_by_the_shard_list_under_skip(tmp_path, outputs):
    out = copy(outputs["parquet"], tmp_path)
    want = packs_by_index(out)
    manifest_first_pack(out)
    ds = PackedDataset(out, batch_size=4, shuffle=False, on_error="skip")  # (the manifest is not checked)
    got = {
        int(i): ids.tolist()
        for batch in get_loader(ds, num_workers=0)
        for i, ids in zip(batch.pack_index, batch.input_ids, strict=True)
    }
    assert got == want  # every pack_index the pack's own: none twice, none missing


def test_item_8_the_vision_loader_and_inspect_say_so(tmp_path, vision_out):
    from packtool.inspect import inspect_report
    from packtool.vision.loader import vision_dataset
    from packtool.vision.processor import load_processor

    out = copy(vision_out["vision"], tmp_path)
    processor_field("loss_on", "all")(out)
    with pytest.raises(InputError, match=BOUND):
        vision_dataset(out, load_processor(vision_out["processor"]), batch_size=1)
    assert any(BOUND in w for w in inspect_report(out)["warnings"])


def test_item_11_images_over_a_page_each_under_the_limit_are_read(tmp_path, vision_out, monkeypatch):
    monkeypatch.setattr(parquet, "MAX_IMAGE_BYTES", IMAGE_LIMIT)
    out = copy(vision_out["vision"], tmp_path)
    images_of_600_kib(out)
    packs = list(read_packs(out))
    assert [len(image["bytes"]) for p in packs for image in p["images"]] == [600 << 10] * 5
    lines = "\n".join(verify_output(out).lines())  # (the bytes are no images now: the image checks say so)
    assert "images.list.element.bytes" not in lines, lines
