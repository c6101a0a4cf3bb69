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
import signal
import tarfile
import textwrap
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.errors import EXIT_INPUT, EXIT_USAGE, InputError
from packtool.loader import PackedDataset, get_loader
from packtool.reading import read_packs
from packtool.verify import verify_output
from tests.conftest import DEMO_TOKENIZER, rewrite_tar_members, run_cli, write_jsonl

TOK = ["--tokenizer", str(DEMO_TOKENIZER)]
N = 64
BASE = ["--packed-sequence-size", N, "--shard-size", 12, "-q"]
RECORDS = [{"text": " ".join(f"word{j % 37}" for j in range(3 + (i * 7) % 18))} for i in range(120)]


class Hang(BaseException):
    """A case ran past its time limit (no ``except Exception`` of the code under test can swallow it)."""


@pytest.fixture(autouse=True)
def time_limit():
    """Fail a case that runs past 60 s (a reader that loops without progress) instead of hanging."""

    def stop(*_):
        raise Hang("the case ran past its time limit (a hang)")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


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


def duplicated_shard_list(drop_run_key: bool) -> Callable[[Path, dict], None]:
    def edit(m: dict) -> None:
        m["shards"].append(dict(m["shards"][1]))
        m["stats"]["num_packs"] += m["shards"][1]["num_packs"]
        if drop_run_key:
            m.pop("run_key")

    return lambda out, ctx: edit_manifest(out, edit)


def reordered_without_run_key(out: Path, ctx: dict) -> None:
    def edit(m: dict) -> None:
        m["shards"][0], m["shards"][1] = m["shards"][1], m["shards"][0]
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
