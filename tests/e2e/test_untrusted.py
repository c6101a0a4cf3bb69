"""A hostile or damaged output directory, and hostile inputs (issue 27): each row of the tables is a case
with the exit code and the message it must give.

``READ_CASES`` damage a copy of a finished output (``outputs``, made once for the module): ``read_packs``
must raise ``InputError`` with the message, having yielded only packs equal to the run's own (a prefix of
them), and ``verify`` must find a problem with its message (``packtool verify`` exits 1), never raise.
``PACK_CASES`` are ``pack`` runs on hostile inputs; the tests after them, other commands on a hostile
output. Every case runs under a time limit: a hang fails it instead of blocking the suite.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import tarfile
import textwrap
import tracemalloc
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool import run_pack
from packtool.errors import EXIT_INPUT, EXIT_USAGE, InputError
from packtool.loader import PackedDataset, get_loader
from packtool.options import PackOptions
from packtool.reading import read_packs
from packtool.verify import verify_output
from tests.conftest import DEMO_TOKENIZER, rewrite_tar_members, run_cli, time_limit, write_jsonl

TOK = ["--tokenizer", str(DEMO_TOKENIZER)]
N = 64
BASE = ["--packed-sequence-size", N, "--shard-size", 12, "-q"]
RECORDS = [{"text": " ".join(f"word{j % 37}" for j in range(3 + (i * 7) % 18))} for i in range(120)]


class Hang(BaseException):
    """A case ran past its time limit (no ``except Exception`` of the code under test can swallow it)."""


@pytest.fixture(autouse=True)
def hang_limit():
    """Fail a case that runs past 60 s (a reader that loops without progress) instead of hanging."""
    with time_limit(60, Hang):
        yield


def pack(src: Path, out: Path, *args) -> None:
    run_cli("pack", src, *TOK, *BASE, *args, "-o", out)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """``parquet`` and ``webdataset`` outputs of one input, and ``shuffled``: the same options on a
    line-shuffled copy of that input with the same name and size (another run, the same old run_id)."""
    base = tmp_path_factory.mktemp("untrusted")
    src = write_jsonl(base / "in.jsonl", RECORDS)
    made = {"parquet": base / "parquet", "webdataset": base / "webdataset", "shuffled": base / "sh"}
    pack(src, made["parquet"], "--row-group-size", 4)
    pack(src, made["webdataset"], "--format", "webdataset")
    size = src.stat().st_size
    shuffled = list(RECORDS)
    random.Random(0).shuffle(shuffled)
    write_jsonl(src, shuffled)  # the same path and size: only the content tells the runs apart
    assert src.stat().st_size == size
    pack(src, made["shuffled"], "--row-group-size", 4)
    made["input"] = src  # (holding the shuffled lines now)
    return made


def packs_of(out: Path) -> list[dict]:
    return [{k: v.tolist() for k, v in p.items()} for p in read_packs(out)]


@pytest.fixture(scope="module")
def run_packs(outputs) -> dict[str, list[dict]]:
    return {fmt: packs_of(outputs[fmt]) for fmt in ("parquet", "webdataset")}


# --- damage ----------------------------------------------------------------------------------------------
def edit_manifest(out: Path, edit: Callable[[dict], None]) -> None:
    m = json.loads((out / "manifest.json").read_text())
    edit(m)
    (out / "manifest.json").write_text(json.dumps(m))


def negative_tar_size(out: Path, ctx: dict) -> None:
    """The first header of shard 1 gets a GNU base-256 size of -512 (its checksum fixed, so it parses)."""
    path = out / "packs-000001.tar"
    data = bytearray(path.read_bytes())
    data[124:136] = b"\xff" + (256**11 - 512).to_bytes(11, "big")
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    path.write_bytes(bytes(data))
    crc = zlib.crc32(bytes(data))  # the manifest follows: only the parser can tell
    edit_manifest(out, lambda m: m["shards"][1].update(crc32=crc))


def fifo_shard(out: Path, ctx: dict) -> None:
    (out / "packs-000001.parquet").unlink()
    os.mkfifo(out / "packs-000001.parquet")


def entry_path(path: str | Callable[[Path], str]) -> Callable[[Path, dict], None]:
    """Shard 1's entry names ``path`` (a copy of the shard is left outside the output, in ``elsewhere``)."""

    def damage(out: Path, ctx: dict) -> None:
        elsewhere = out.parent / "elsewhere"
        elsewhere.mkdir(exist_ok=True)
        shutil.copy(out / "packs-000001.parquet", elsewhere / "packs-000001.parquet")
        name = path(out) if callable(path) else path
        edit_manifest(out, lambda m: m["shards"][1].update(path=name))

    return damage


def symlink_out(out: Path, ctx: dict) -> None:
    elsewhere = out.parent / "elsewhere"
    elsewhere.mkdir()
    shutil.move(out / "packs-000001.parquet", elsewhere / "packs-000001.parquet")
    (out / "packs-000001.parquet").symlink_to(elsewhere / "packs-000001.parquet")


def parquet_bomb(out: Path, ctx: dict) -> None:
    """Shard 1 replaced by one that declares 100,000 values in a pack of N = 64 (its metadata, row groups
    and manifest size kept): what a tiny file declaring 2**28 values is, at the scale of a test."""
    path = out / "packs-000001.parquet"
    pf = pq.ParquetFile(path)
    schema, rows = pf.schema_arrow, pf.metadata.row_group(0).num_rows
    table = pf.read().slice(0, rows)
    big = pa.array([[0] * 100_000] + [[0] * N] * (rows - 1), type=schema.field("input_ids").type)
    table = table.set_column(table.schema.get_field_index("input_ids"), "input_ids", big)
    groups = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
    pf.close()
    full = pa.concat_tables([table, pq.read_table(ctx["copy"] / "packs-000001.parquet").slice(rows)])
    writer = pq.ParquetWriter(path, full.schema.with_metadata(schema.metadata), compression="zstd")
    start = 0
    for g in groups:
        writer.write_table(full.slice(start, g).replace_schema_metadata(schema.metadata))
        start += g
    writer.close()
    size = path.stat().st_size
    edit_manifest(out, lambda m: m["shards"][1].update(bytes=size))


def other_runs_shard(out: Path, ctx: dict) -> None:
    """Shard 1 of the shuffled input's run, its size written into the manifest (only the run_id tells)."""
    shutil.copy(ctx["shuffled"] / "packs-000001.parquet", out / "packs-000001.parquet")
    size = (out / "packs-000001.parquet").stat().st_size
    edit_manifest(out, lambda m: m["shards"][1].update(bytes=size))


def no_crc32_and_a_flipped_token(out: Path, ctx: dict) -> None:
    path = out / "packs-000001.tar"
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".input_ids.npy"))
    data = bytearray(path.read_bytes())
    data[member.offset_data + member.size - 8] ^= 0x01
    path.write_bytes(bytes(data))
    edit_manifest(out, lambda m: m["shards"][1].pop("crc32"))


def set_field(key: str, value) -> Callable[[Path, dict], None]:
    return lambda out, ctx: edit_manifest(out, lambda m: m.update({key: value}))


def renumbered(m: dict) -> None:
    """Each shard entry's ``first_pack`` made where the entries before it end (what an editor who knows
    the format changes with the list, so that the shards' own metadata is what tells)."""
    first = 0
    for entry in m["shards"]:
        entry["first_pack"] = first
        first += entry["num_packs"]


def duplicated_shard_list(drop_run_key: bool) -> Callable[[Path, dict], None]:
    def edit(m: dict) -> None:
        m["shards"].append(dict(m["shards"][1]))
        m["stats"]["num_packs"] += m["shards"][1]["num_packs"]
        renumbered(m)
        if drop_run_key:
            m.pop("run_key")

    return lambda out, ctx: edit_manifest(out, edit)


def reordered_without_run_key(out: Path, ctx: dict) -> None:
    def edit(m: dict) -> None:
        m["shards"][0], m["shards"][1] = m["shards"][1], m["shards"][0]
        renumbered(m)
        m.pop("run_key")

    edit_manifest(out, edit)


def columns_without_labels(out: Path, ctx: dict) -> None:
    edit_manifest(out, lambda m: m.update(columns=[c for c in m["columns"] if c != "labels"]))


def huge_npy_shape(out: Path, ctx: dict) -> None:
    """The first pack of shard 1 gets a seq_lens member that is only a header declaring shape (2**32,
    2**32), whose element count overflows int64 to 0 (the manifest's size and crc32 follow it)."""
    header = io.BytesIO()
    big = {"descr": "<i4", "fortran_order": False, "shape": (2**32, 2**32)}
    np.lib.format.write_array_header_1_0(header, big)
    path = out / "packs-000001.tar"
    rewrite_tar_members(
        path, lambda packs: next(iter(packs.values())).update({"seq_lens.npy": header.getvalue()})
    )
    data = path.read_bytes()
    edit_manifest(out, lambda m: m["shards"][1].update(bytes=len(data), crc32=zlib.crc32(data)))


def swapped_packs(out: Path, ctx: dict) -> None:
    """Shard 1 rewritten whole with its first two packs swapped: its metadata (run_id, shard, first pack),
    row groups, writer settings and page CRCs those of a shard packtool writes; its size into the
    manifest (only the content tells)."""
    path = out / "packs-000001.parquet"
    pf = pq.ParquetFile(path)
    groups = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
    table = pf.read()
    pf.close()
    order = list(range(table.num_rows))
    order[0], order[1] = 1, 0
    table = table.take(order)
    settings = dict(
        compression="zstd", use_dictionary=False, write_statistics=False, write_page_checksum=True
    )
    with pq.ParquetWriter(path, table.schema, **settings) as writer:
        for a, rows in zip(np.cumsum([0, *groups[:-1]]), groups, strict=True):
            writer.write_table(table.slice(int(a), rows))
    size = path.stat().st_size
    edit_manifest(out, lambda m: m["shards"][1].update(bytes=size))


def edit_text(old: str | Callable[[str], str], new: str | None = None) -> Callable[[Path, dict], None]:
    """The manifest's text edited: ``old`` replaced by ``new`` once (a callable of the text gives ``old``)."""

    def damage(out: Path, ctx: dict) -> None:
        text = (out / "manifest.json").read_text()
        what = old(text) if callable(old) else old
        assert what in text
        (out / "manifest.json").write_text(text.replace(what, new, 1))

    return damage


def pad_id_text(text: str) -> str:
    return f'"pad_token_id": {json.loads(text)["pad_token_id"]}'


def shard_1_packs_text(text: str) -> str:
    return f'"num_packs": {json.loads(text)["shards"][1]["num_packs"]}'


HUGE_PAD_ID = '"pad_token_id": ' + "9" * 5000


def npy_shape(shape: tuple[int, ...]) -> Callable[[Path, dict], None]:
    """The first pack of shard 1 gets a seq_lens member that is only a header declaring ``shape`` (the
    manifest's size and crc32 follow it)."""

    def damage(out: Path, ctx: dict) -> None:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<i4", "fortran_order": False, "shape": shape})
        path = out / "packs-000001.tar"
        rewrite_tar_members(
            path, lambda packs: next(iter(packs.values())).update({"seq_lens.npy": header.getvalue()})
        )
        data = path.read_bytes()
        edit_manifest(out, lambda m: m["shards"][1].update(bytes=len(data), crc32=zlib.crc32(data)))

    return damage


PASSWD = "../" * 5 + "etc/passwd"


@dataclass
class ReadCase:
    row: str  # the row
    name: str
    fmt: str
    damage: Callable[[Path, dict], None]
    message: str  # in read_packs' InputError
    verify_message: str = ""
    checksums: bool = True  # read_packs(verify_checksums=...): off to reach the parser past the CRC


READ_CASES = [
    ReadCase("1", "tar size GNU base-256 negative", "webdataset", negative_tar_size,
             "packs-000001.tar: bad tar header at byte 0 (member", verify_message="size -512"),
    ReadCase("1", "a FIFO named like a shard", "parquet", fifo_shard,
             "packs-000001.parquet: is a FIFO, not a regular file", verify_message="shard file is a FIFO"),
    ReadCase("1", "an entry pointing at /dev/zero", "parquet", entry_path("/dev/zero"),
             "/dev/zero: names an absolute path", verify_message="names an absolute path"),
    ReadCase("2", "a shard path with ..", "parquet", entry_path("../elsewhere/packs-000001.parquet"),
             "names a path outside the output directory (a .. part)", verify_message="(a .. part)"),
    ReadCase("2", "an absolute shard path", "parquet",
             entry_path(lambda out: str(out.parent / "elsewhere" / "packs-000001.parquet")),
             "names an absolute path", verify_message="names an absolute path"),
    ReadCase("2", "a symlink leading out", "parquet", symlink_out,
             "packs-000001.parquet: is a symlink leading outside the output directory",
             verify_message="is a symlink leading outside"),
    ReadCase("2", "an index path out to /etc/passwd", "webdataset",
             lambda out, ctx: edit_manifest(out, lambda m: m["shards"][0].update(index=PASSWD)),
             "etc/passwd: names a path outside the output directory",
             verify_message="index file names a path outside"),
    ReadCase("4", "a Parquet footer declaring 100,000 values a pack", "parquet", parquet_bomb,
             "its footer declares", verify_message="its footer declares"),
    ReadCase("5", "a shard of the shuffled input's run", "parquet", other_runs_shard,
             "packs-000001.parquet: shard of run", verify_message="shard belongs to run"),
    ReadCase("6", "crc32 removed, a token flipped", "webdataset", no_crc32_and_a_flipped_token,
             "the manifest records no crc32 for it", verify_message="sha256 differs"),
    ReadCase("6", "labels flipped shifted -> unshifted", "parquet", set_field("labels", "unshifted"),
             "the manifest was edited", verify_message="the manifest was edited"),
    ReadCase("6", "position_ids flipped restart -> nemo", "parquet", set_field("position_ids", "nemo"),
             "the manifest was edited", verify_message="the manifest was edited"),
    ReadCase("6", "shard list duplicated, stats adjusted", "parquet", duplicated_shard_list(False),
             "the manifest was edited", verify_message="the manifest was edited"),
    ReadCase("6", "shard list duplicated, run_key removed", "parquet", duplicated_shard_list(True),
             "the shard's own shard is 1, the manifest's", verify_message="shard metadata says shard 1"),
    ReadCase("6", "shard list reordered, run_key removed", "webdataset", reordered_without_run_key,
             "the shard's first pack is pack 12, the manifest's 0",
             verify_message="shard metadata says shard 1"),
    ReadCase("6", "columns without labels", "parquet", columns_without_labels,
             "columns store neither labels nor next_label", verify_message="columns store neither labels"),
    ReadCase("8", "an npy shape (2**32, 2**32)", "webdataset", huge_npy_shape,
             "seq_lens.npy is not a plain C-order .npy array of its size",
             verify_message="seq_lens.npy is not a plain C-order .npy array of its size"),
    # issue 36: item 2, the content of a Parquet shard is checked as it is read
    ReadCase("36.2", "two packs swapped, the shard rewritten whole", "parquet", swapped_packs,
             "packs-000001.parquet: row group 0, column input_ids: not the content the run wrote",
             verify_message="row group 0, column input_ids: not the content the run wrote"),
    ReadCase("36.2", "content_digest edited", "parquet",
             lambda out, ctx: edit_manifest(out, lambda m: m["shards"][1].update(content_digest="0" * 32)),
             "packs-000001.parquet: its content record is not the one the manifest's content_digest names",
             verify_message="its content record is not the one the manifest's content_digest names"),
    ReadCase("36.2", "content_digest removed", "parquet",
             lambda out, ctx: edit_manifest(out, lambda m: m["shards"][1].pop("content_digest")),
             "the manifest records no content_digest for it, which format_version 5.2 writes",
             verify_message="the manifest records no content_digest for it"),
    # item 5: fields no writer gives, and a member's shape NumPy cannot make
    ReadCase("36.5", "a 5,000-digit pad_token_id", "parquet", edit_text(pad_id_text, HUGE_PAD_ID),
             "manifest.json, field 'pad_token_id': an integer of 5,000 digits",
             verify_message="field 'pad_token_id': an integer of 5,000 digits"),
    ReadCase("36.5", "a pad_token_id past int32", "parquet", set_field("pad_token_id", 2**40),
             "field 'pad_token_id': 1099511627776 is not a token id",
             verify_message="field 'pad_token_id': 1099511627776 is not a token id"),
    ReadCase("36.5", "num_packs: Infinity", "webdataset",
             edit_text(shard_1_packs_text, '"num_packs": Infinity'),
             "field 'num_packs': Infinity (beyond a float), not a value packtool writes",
             verify_message="field 'num_packs': Infinity"),
    ReadCase("36.5", "a key given twice (the last one read)", "parquet",
             edit_text('"run_id": ', '"run_id": "0123456789abcdef", "run_id": '),
             "manifest.json, field 'run_id': given twice", verify_message="field 'run_id': given twice"),
    ReadCase("36.5", "an npy shape (0, 2**62)", "webdataset", npy_shape((0, 2**62)),
             "seq_lens.npy is not a plain C-order .npy array of its size",
             verify_message="seq_lens.npy is not a plain C-order .npy array of its size"),
]  # fmt: skip


@pytest.mark.parametrize("case", READ_CASES, ids=[f"row {c.row}: {c.name}" for c in READ_CASES])
def test_read_case(tmp_path: Path, outputs, run_packs, case: ReadCase):
    out = Path(shutil.copytree(outputs[case.fmt], tmp_path / "out", symlinks=True))
    case.damage(out, {"copy": outputs[case.fmt], "shuffled": outputs["shuffled"]})
    got = []
    with pytest.raises(InputError) as err:
        for pack in read_packs(out, verify_checksums=case.checksums):
            got.append({k: v.tolist() for k, v in pack.items()})
    assert case.message in str(err.value), str(err.value)
    assert got == run_packs[case.fmt][: len(got)]  # only the run's own packs came out before
    report = verify_output(out)  # in process (what `packtool verify` prints; exit 1 when not ok)
    lines = "\n".join(report.lines())
    assert not report.ok and case.verify_message in lines, lines


def test_the_loader_refuses_a_hanging_tar_header(tmp_path, outputs):
    out = Path(shutil.copytree(outputs["webdataset"], tmp_path / "out"))
    negative_tar_size(out, {})
    with pytest.raises(InputError, match="packs-000001.tar: bad tar header at byte 0"):
        for _ in get_loader(PackedDataset(out, batch_size=4, shuffle=False), num_workers=0):
            pass


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_refuses_a_shard_rewritten_with_two_packs_swapped(tmp_path, outputs, workers):
    out = Path(shutil.copytree(outputs["parquet"], tmp_path / "out"))
    swapped_packs(out, {})
    with pytest.raises(InputError, match="row group 0, column input_ids: not the content the run wrote"):
        for _ in get_loader(PackedDataset(out, batch_size=4, shuffle=False), num_workers=workers):
            pass


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_a_shard_replaced_by_a_fifo_mid_epoch_is_refused_by_the_workers(tmp_path, outputs, fmt):
    """The output is checked when the loader starts; a worker opens a shard long after: one put in its place
    meanwhile is checked as it is opened, never blocked on."""
    out = Path(shutil.copytree(outputs[fmt], tmp_path / "out"))
    name = "packs-000004." + ("tar" if fmt == "webdataset" else "parquet")  # the last: 48 packs on
    # batches of 1 pack: the workers, 8 packs ahead each, are at packs 0-7 and 27-34 for now
    batches = iter(get_loader(PackedDataset(out, batch_size=1, shuffle=False), num_workers=2))
    next(batches)
    (out / name).unlink()
    os.mkfifo(out / name)
    with pytest.raises(InputError, match=f"{name}: is a FIFO, not a regular file"):
        for _ in batches:
            pass


def test_run_identity_is_bound_to_content(outputs):
    ids = {
        k: json.loads((outputs[k] / "manifest.json").read_text())["run_id"] for k in ("parquet", "shuffled")
    }
    assert ids["parquet"] != ids["shuffled"]  # same name, size and options; other content


def test_a_shard_repacked_in_place_mid_epoch_is_refused(tmp_path, outputs, run_packs):
    out = Path(shutil.copytree(outputs["parquet"], tmp_path / "out"))
    packs = read_packs(out)
    first = [{k: v.tolist() for k, v in next(packs).items()}]
    # another job re-packs the directory from the input's path, the same size, other lines, meanwhile
    pack(outputs["input"], out, "--row-group-size", 4, "--overwrite")
    with pytest.raises(InputError, match="shard of run"):
        for p in packs:
            first.append({k: v.tolist() for k, v in p.items()})
    assert first == run_packs["parquet"][: len(first)]


# --- other commands on a damaged output: one line, exit 3 -----------------------------------------------
def index_link_out(out: Path, ctx: dict) -> None:
    """Shard 0's .tar.idx a symlink to a file outside the output (a copy of the index itself)."""
    (out.parent / "elsewhere.idx").write_bytes((out / "packs-000000.tar.idx").read_bytes())
    (out / "packs-000000.tar.idx").unlink()
    (out / "packs-000000.tar.idx").symlink_to(out.parent / "elsewhere.idx")


def index_fifo(out: Path, ctx: dict) -> None:
    (out / "packs-000000.tar.idx").unlink()
    os.mkfifo(out / "packs-000000.tar.idx")


def index_offset(out: Path, ctx: dict) -> None:
    offsets = np.fromfile(out / "packs-000000.tar.idx", dtype="<u8")
    offsets[1] = 10**12  # pack 0 would run to byte 1e12
    offsets.tofile(out / "packs-000000.tar.idx")


@dataclass
class CommandCase:
    row: str
    name: str
    fmt: str
    damage: Callable[[Path, dict], None]
    args: list  # after the output directory
    code: int
    message: str  # in the one line on stderr


COMMAND_CASES = [
    CommandCase("36.5", ".tar.idx a symlink leading out", "webdataset", index_link_out, ["--pack", 0],
                EXIT_INPUT, "packs-000000.tar.idx: is a symlink leading outside the output directory"),
    CommandCase("36.5", ".tar.idx a FIFO", "webdataset", index_fifo, ["--pack", 0], EXIT_INPUT,
                "packs-000000.tar.idx: is a FIFO, not a regular file"),
    CommandCase("36.5", ".tar.idx with an offset of 1e12", "webdataset", index_offset, ["--pack", 0],
                EXIT_INPUT, "packs-000000.tar.idx: its offsets do not rise from 0 inside the tar's"),
    CommandCase("36.5", "a 5,000-digit pad_token_id", "parquet",
                edit_text(pad_id_text, HUGE_PAD_ID), [], EXIT_INPUT,
                "field 'pad_token_id': an integer of 5,000 digits"),
]  # fmt: skip


@pytest.mark.parametrize("case", COMMAND_CASES, ids=[f"row {c.row}: {c.name}" for c in COMMAND_CASES])
def test_inspect_case(tmp_path: Path, outputs, case: CommandCase):
    out = Path(shutil.copytree(outputs[case.fmt], tmp_path / "out", symlinks=True))
    case.damage(out, {})
    proc = run_cli("inspect", out, *case.args, check=False)
    assert proc.returncode == case.code, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("packtool: error: ") and case.message in line, line


def test_verify_names_a_member_of_shape_0_by_2_to_the_62(tmp_path: Path, outputs):
    out = Path(shutil.copytree(outputs["webdataset"], tmp_path / "out"))
    npy_shape((0, 2**62))(out, {})
    proc = run_cli("verify", out, check=False)
    assert proc.returncode == 1, proc.stderr  # problems found (was exit 4: an internal error)
    assert "seq_lens.npy is not a plain C-order .npy array of its size" in proc.stdout


def test_a_loader_state_of_a_billion_lanes_is_refused_before_any_allocation(outputs):
    loader = get_loader(PackedDataset(outputs["parquet"], batch_size=4), num_workers=0)
    state = {**loader.state_dict(), "lanes": 10**9}
    tracemalloc.start()
    with pytest.raises(
        ValueError, match="loader state: field 'lanes' must be at most 65,536, got 1000000000"
    ):
        loader.load_state_dict(state)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20
    # the epoch's plan takes memory and time by its batches, whatever the lanes: lanes past the batches
    # read nothing, so the plan is the one of as many lanes as batches
    ds = PackedDataset(outputs["parquet"], batch_size=4, shuffle=True)
    np.testing.assert_array_equal(ds.plan(0, lanes=10**12), ds.plan(0, lanes=ds.batches_per_epoch))


# --- pack on hostile inputs ----------------------------------------------------------------------------
@dataclass
class PackCase:
    row: str
    name: str
    setup: Callable[[Path], list]  # makes the files in tmp, returns the pack arguments (no -o)
    code: int
    message: str  # in the one line on stderr (an error), or in stderr (a warning, code 0)
    output: str = "out"


def texts(tmp: Path) -> Path:
    return write_jsonl(tmp / "in.jsonl", RECORDS[:30])


def fifo_input(tmp: Path) -> list:
    os.mkfifo(tmp / "in.jsonl")
    return [tmp / "in.jsonl", *TOK]


def dangling_link_in_a_folder(tmp: Path) -> list:
    (tmp / "d").mkdir()
    texts(tmp).rename(tmp / "d" / "a.jsonl")
    (tmp / "d" / "b.jsonl").symlink_to(tmp / "nowhere.jsonl")
    return [tmp / "d", *TOK]


def long_integer(tmp: Path) -> list:
    line = json.dumps({"text": "fine words"})[:-1] + ', "meta": ' + "1" * 4301 + "}\n"
    (tmp / "in.jsonl").write_text(line)
    return [tmp / "in.jsonl", *TOK]


def two_text_columns(tmp: Path) -> list:
    table = pa.Table.from_arrays([pa.array(["a b", "c d"]), pa.array(["e", "f"])], names=["text", "text"])
    pq.write_table(table, tmp / "in.parquet")
    return [tmp / "in.parquet", *TOK]


def non_utf8_name(tmp: Path) -> list:
    name = os.fsdecode(bytes(tmp / "in") + b"\xff.jsonl")
    texts(tmp).rename(name)
    return [name, *TOK]


def rewritten_at_same_size_and_mtime(tmp: Path) -> list:
    """An encoder that rewrites the input (same size, other content) and sets its mtime back."""
    src = texts(tmp)
    (tmp / "swap.py").write_text(textwrap.dedent(f"""
        import os
        def encode(records):
            st = os.stat({str(src)!r})
            data = open({str(src)!r}, "rb").read()
            open({str(src)!r}, "wb").write(data.replace(b"word1", b"word2"))
            os.utime({str(src)!r}, ns=(st.st_atime_ns, st.st_mtime_ns))
            return {{"input_ids": [[1, 2, 3] for _ in records["text"]]}}
        """))  # fmt: skip
    return [src, "--tokenizer", f"{tmp / 'swap.py'}:encode"]


def view_columns(tmp: Path) -> list:
    """The texts as a Parquet ``string_view`` column (as Polars writes strings)."""
    table = pa.table({"text": pa.array([r["text"] for r in RECORDS[:30]], pa.string_view())})
    pq.write_table(table, tmp / "in.parquet")
    return [tmp / "in.parquet", *TOK]


def huge_record(tmp: Path) -> list:
    (tmp / "in.jsonl").write_text(json.dumps({"text": "word " * 10_000_000}) + "\n")  # 50 MB
    return [tmp / "in.jsonl", *TOK, "--long-samples", "truncate"]


def labels_equal_input_ids(*extra) -> Callable[[Path], list]:
    def setup(tmp: Path) -> list:
        rows = [{"input_ids": list(range(5, 5 + i % 9 + 2)), "labels": list(range(5, 5 + i % 9 + 2))}
                for i in range(30)]  # fmt: skip
        return [write_jsonl(tmp / "in.jsonl", rows), *extra]

    return setup


PACK_CASES = [
    PackCase("1", "a FIFO as input", fifo_input, EXIT_INPUT, "in.jsonl: is a FIFO, not a regular file"),
    PackCase("8", "a 4,301-digit integer in an unread field", long_integer, 0, ""),
    PackCase("8", "two Parquet columns named text", two_text_columns, EXIT_INPUT,
             "in.parquet: 2 columns are named 'text'"),
    PackCase("8", "a non-UTF-8 input file name", non_utf8_name, EXIT_INPUT,
             "in\\xff.jsonl: file name is not valid UTF-8"),
    PackCase("9", "a dangling symlink in an input folder", dangling_link_in_a_folder, EXIT_INPUT,
             "b.jsonl: a broken symbolic link (to "),
    PackCase("9", "-o /proc/x", lambda tmp: [texts(tmp), *TOK], EXIT_USAGE,
             "/proc/x: cannot create the lock file /proc/x.lock", output="/proc/x"),
    PackCase("7", "input rewritten at the same size and mtime", rewritten_at_same_size_and_mtime, EXIT_INPUT,
             "changed while the run read it (rewritten at the same size)"),
    PackCase("11", "one 50 MB record with --long-samples truncate", huge_record, 0,
             "1 text sample(s) longer than 1,048,576 characters were cut"),
    PackCase("12", "given labels equal to input_ids, packed as shifted", labels_equal_input_ids(), 0,
             "warning: labels: taken as given from the input; the input's own labels equal its input_ids"),
    PackCase("12", "the same with --strict", labels_equal_input_ids("--strict"), EXIT_USAGE,
             "--strict: the input's own labels equal its input_ids"),
    PackCase("12", "the same with --labels unshifted", labels_equal_input_ids("--labels", "unshifted"), 0,
             ""),
    PackCase("36.5", "a Parquet text column of string_view", view_columns, 0, ""),
]  # fmt: skip


@pytest.mark.parametrize("case", PACK_CASES, ids=[f"row {c.row}: {c.name}" for c in PACK_CASES])
def test_pack_case(tmp_path: Path, case: PackCase):
    args = case.setup(tmp_path)
    out = tmp_path / case.output
    proc = run_cli("pack", *args, "--packed-sequence-size", N, "-o", out, "-q", check=False)
    assert proc.returncode == case.code, proc.stderr
    if case.code:
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("packtool: error: ") and case.message in line, line
        assert not (tmp_path / "out").exists()
    else:
        assert case.message in proc.stderr, proc.stderr
        m = json.loads((out / "manifest.json").read_text())
        if "cut" in case.message:
            assert any(case.message in w for w in m["warnings"])
        if "labels" in case.message:
            assert any("taken as given" in w for w in m["warnings"])
    assert not list(tmp_path.glob("*.lock")) and not list(tmp_path.glob("*.partial"))


def test_view_columns_pack_as_their_plain_types_do(tmp_path: Path):
    """A ``string_view`` text column and a ``list_view`` of token ids (whose cast by Arrow to a list loses
    values) give the packs of the same data in plain columns."""
    texts = [r["text"] for r in RECORDS[:40]]
    ids = [[int(t) for t in np.random.default_rng(i).integers(1, 900, 3 + i % 11)] for i in range(40)]
    plain = {"text": pa.array(texts), "ids": pa.array(ids, pa.list_(pa.int32()))}
    views = {"text": pa.array(texts, pa.string_view()), "ids": pa.array(ids, pa.list_view(pa.int32()))}
    for name, columns in (("plain", plain), ("views", views)):  # (in this process: the CLI's are elsewhere)
        pq.write_table(pa.table({"text": columns["text"]}), tmp_path / f"{name}-text.parquet")
        pq.write_table(pa.table({"input_ids": columns["ids"]}), tmp_path / f"{name}-ids.parquet")
        for kind, extra in (("text", {"tokenizer": str(DEMO_TOKENIZER)}), ("ids", {})):
            source, out = tmp_path / f"{name}-{kind}.parquet", tmp_path / f"{name}-{kind}"
            values = {"inputs": [str(source)], "output": str(out), "packed_sequence_size": N,
                      "shard_size": 12, "quiet": True, **extra}  # fmt: skip
            run_pack(PackOptions.from_dict(values), progress=False)
    for kind in ("text", "ids"):
        assert packs_of(tmp_path / f"views-{kind}") == packs_of(tmp_path / f"plain-{kind}")


def test_a_damaged_scratch_chunk_is_encoded_again(tmp_path: Path):
    src = texts(tmp_path)
    args = ["pack", src, *TOK, "--packed-sequence-size", N, "--chunk-size", 5, "--num-proc", 1]
    killed = run_cli(*args, "-o", tmp_path / "out", check=False, kill_at="encode:3")
    assert killed.returncode != 0
    chunk = next((tmp_path / "out.partial").rglob("chunk-000001/input_ids.npy"))
    data = bytearray(chunk.read_bytes())
    data[-4:] = np.array([66190], np.int32).tobytes()  # an id past the 1,300-id vocabulary
    chunk.write_bytes(bytes(data))
    again = run_cli(*args, "-o", tmp_path / "out")
    assert "1 scratch chunk(s) of the interrupted run are not what was encoded (chunk 1" in again.stderr
    run_cli(*args, "-o", tmp_path / "whole", "-q")
    assert packs_of(tmp_path / "out") == packs_of(tmp_path / "whole")


# --- other commands on a hostile output -----------------------------------------------------------------
def test_verify_source_never_imports_the_manifests_tokenizer(tmp_path: Path):
    src = texts(tmp_path)
    marker = tmp_path / "ran"
    (tmp_path / "enc.py").write_text(textwrap.dedent(f"""
        open({str(marker)!r}, "a").write("x")
        def encode(records):
            return {{"input_ids": [[1, 2, 3] for _ in records["text"]]}}
        """))  # fmt: skip
    spec = f"{tmp_path / 'enc.py'}:encode"
    run_cli("pack", src, "--tokenizer", spec, "--packed-sequence-size", N, "-o", tmp_path / "out", "-q")
    marker.unlink()
    proc = run_cli("verify", tmp_path / "out", "--source", "-q", check=False)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert (
        f"the run's tokenizer is code ({spec}), and verify runs only code named on its command line" in line
    )
    assert not marker.exists()  # nothing was imported
    confirmed = run_cli("verify", tmp_path / "out", "--source", "--tokenizer", spec, "-q", check=False)
    assert confirmed.returncode == 0 and confirmed.stdout.startswith("OK"), (
        confirmed.stdout + confirmed.stderr
    )
    assert marker.exists()  # the user named it: it ran


def test_inspect_pack_with_a_non_json_line_in_errors_log(tmp_path: Path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in RECORDS[:20]) + "{broken\n")
    args = ["--packed-sequence-size", N, "--on-error", "skip", "-q"]
    run_cli("pack", src, *TOK, *args, "-o", tmp_path / "out")
    (tmp_path / "out" / "errors.jsonl").write_text("not json at all\n")
    proc = run_cli("inspect", tmp_path / "out", "--pack", 0, "--locate", check=False)
    assert proc.returncode == 0, proc.stderr
    assert "pack 0" in proc.stdout.lower()
