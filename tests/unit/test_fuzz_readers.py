"""Fuzzing the readers of an output directory (issue 27) with hypothesis: Parquet and tar shard bytes,
``.npy`` members and the manifest's JSON, mutated from a real output. Whatever the bytes, ``read_packs``
and ``verify`` must stop with one of packtool's own errors (or read), within a time limit per case, and
never open a file outside the output's folder.

The normal test run tries a few examples of each (``PACKTOOL_FUZZ_EXAMPLES``, default 12: a few seconds);
``make fuzz`` runs thousands.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.errors import PacktoolError
from packtool.formats import tar
from packtool.formats.parquet_content import CONTENT_KEY, record_digest
from packtool.inspect import inspect_report, pack_report
from packtool.inspect.render import render_pack, render_report
from packtool.reading import read_packs
from packtool.verify import verify_output
from tests.conftest import DEMO_TOKENIZER, ROOT, run_cli, time_limit, write_jsonl

EXAMPLES = int(os.environ.get("PACKTOOL_FUZZ_EXAMPLES", "12"))
CASE_SECONDS = 10  # a case that runs longer loops without progress
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 12,  # the normal run tries the same examples every time
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# --- no read outside the output: every file opened while a case runs is recorded ----------------------
OPENED: list[str] | None = None
# where the interpreter and its libraries open files (imports, CPU and locale information)
SYSTEM = tuple(
    os.path.realpath(p)
    for p in {sys.prefix, sys.base_prefix, str(ROOT), "/usr", "/proc", "/sys", "/dev/urandom"}
)


def _audit(event: str, args: tuple) -> None:
    if OPENED is not None and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
        OPENED.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_audit)


class Hang(BaseException):
    """A case ran past its time limit (no ``except Exception`` of the code under test can swallow it)."""


@contextmanager
def guarded(root: Path):
    """Run a case: a time limit (a reader that loops without progress), and no file opened outside
    ``root`` but the system's own."""
    global OPENED
    OPENED = []
    try:
        with time_limit(CASE_SECONDS, Hang):
            yield
    finally:
        opened, OPENED = OPENED, None
    inside = os.path.realpath(root)
    outside = [p for p in opened if not p.startswith(inside + os.sep) and not p.startswith(SYSTEM)]
    assert not outside, f"opened outside the output: {outside[:3]}"


def read_all(out: Path) -> None:
    """What a reader of an untrusted output may do: read its packs (checks on and off), verify it and
    report on it (``inspect``, its first pack too), stopping only with packtool's own errors."""
    for checksums in (True, False):
        try:
            for _ in read_packs(out, verify_checksums=checksums):
                pass
        except PacktoolError:
            pass
    try:
        verify_output(out)
    except PacktoolError:
        pass
    for full in (False, True):
        try:
            render_report(inspect_report(out, full=full))
        except PacktoolError:
            pass
    try:
        render_pack(pack_report(out, 0))
    except PacktoolError:
        pass


# --- a real output to mutate ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fuzz")
    rows = [{"text": " ".join(f"w{j}" for j in range(2 + i % 9))} for i in range(24)]
    src = write_jsonl(base / "in.jsonl", rows)
    made = {}
    for fmt in ("parquet", "webdataset"):
        made[fmt] = base / fmt
        args = ["--packed-sequence-size", 32, "--shard-size", 3, "--format", fmt, "-q"]
        run_cli("pack", src, "--tokenizer", DEMO_TOKENIZER, *args, "-o", made[fmt])
    (base / "outside-canary.parquet").write_bytes(b"PAR1 not to be read PAR1")
    return made


def fresh(tmp_path: Path, source: Path) -> tuple[Path, Path]:
    """A copy of output ``source`` in its own root (cleared first: hypothesis reuses ``tmp_path``)."""
    root = tmp_path / "root"
    shutil.rmtree(root, ignore_errors=True)
    out = Path(shutil.copytree(source, root / "out"))
    return root, out


def mutated(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    """``data`` with byte ``at % len`` set to ``value`` for each edit, then cut to ``cut`` bytes."""
    buf = bytearray(data)
    for at, value in edits:
        buf[at % len(buf)] = value
    return bytes(buf[:cut] if cut is not None else buf)


EDITS = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8)
CUTS = st.none() | st.integers(0, 4096)


def write_shard(out: Path, name: str, data: bytes) -> None:
    """Shard ``name`` replaced by ``data``, the manifest's size following (so the readers parse it)."""
    (out / name).write_bytes(data)
    m = json.loads((out / "manifest.json").read_text())
    for entry in m["shards"]:
        if entry["path"] == name:
            entry["bytes"] = len(data)
    (out / "manifest.json").write_text(json.dumps(m))


@FUZZ
@given(edits=EDITS, cut=CUTS, fmt=st.sampled_from(["parquet", "webdataset"]))
def test_fuzz_shard_bytes(tmp_path, outputs, edits, cut, fmt):
    root, out = fresh(tmp_path, outputs[fmt])
    name = "packs-000000." + ("parquet" if fmt == "parquet" else "tar")
    write_shard(out, name, mutated((out / name).read_bytes(), edits, cut))
    with guarded(root):
        read_all(out)


# the tar header fields a hostile archive sets: the size (octal or GNU base-256), the type, the name
HEADER_FIELDS = {"size": (124, 12), "type": (156, 1), "name": (0, 100)}


@FUZZ
@given(
    field=st.sampled_from(sorted(HEADER_FIELDS)),
    value=st.binary(min_size=1, max_size=12),
    header=st.integers(0, 6),
)
def test_fuzz_tar_headers(tmp_path, outputs, field, value, header):
    """A header field rewritten and the header's checksum fixed, so that the archive still parses."""
    root, out = fresh(tmp_path, outputs["webdataset"])
    path = out / "packs-000000.tar"
    data = bytearray(path.read_bytes())
    offsets = [int(o) for o in tar.read_index(path)][:-1]
    at = offsets[header % len(offsets)]
    start, width = HEADER_FIELDS[field]
    data[at + start : at + start + width] = value[:width].ljust(width, b"\0")
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + 512])
    write_shard(out, path.name, bytes(data))
    with guarded(root):
        read_all(out)


@FUZZ
@given(
    shape=st.lists(st.integers(-1, 1 << 40), max_size=3),
    descr=st.sampled_from(["<i4", "<i8", "|i1", "|O", ">f8", "V8", "<U4"]),
    fortran=st.booleans(),
    tail=st.binary(max_size=64),
)
def test_fuzz_npy_headers(tmp_path, descr, shape, fortran, tail):
    """``tar.npy_view`` on a member whose ``.npy`` header declares any shape and dtype: packtool's error
    or a view of the bytes there are, never an allocation of what the header claims."""
    header = io.BytesIO()
    d = {"descr": descr, "fortran_order": fortran, "shape": tuple(shape)}
    try:
        np.lib.format.write_array_header_1_0(header, d)
    except ValueError:
        return
    buf = header.getvalue() + tail
    with guarded(tmp_path):
        try:
            view = tar.npy_view(tmp_path / "x.tar", "k.npy", buf, 0, len(buf))
        except PacktoolError:
            return
    assert view.nbytes <= len(tail)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
PATHS = st.sampled_from(
    ["../outside-canary.parquet", "/dev/zero", "/etc/passwd", "../../../../../etc/passwd", "", "."]
)


@FUZZ
@given(data=st.data(), fmt=st.sampled_from(["parquet", "webdataset"]))
def test_fuzz_manifest(tmp_path, outputs, data, fmt):
    """Any field of the manifest (top level, a shard entry's, a stats') given any JSON value, or a path
    leading out of the output."""
    root, out = fresh(tmp_path, outputs[fmt])
    m = json.loads((out / "manifest.json").read_text())
    where = data.draw(st.sampled_from(["top", "shard", "stats", "path"]))
    if where == "path":
        entry = m["shards"][data.draw(st.integers(0, len(m["shards"]) - 1))]
        entry[data.draw(st.sampled_from(["path", "index"]))] = data.draw(PATHS)
    else:
        target = {"top": m, "shard": m["shards"][0], "stats": m["stats"]}[where]
        target[data.draw(st.sampled_from(sorted(target)))] = data.draw(JSON)
    (out / "manifest.json").write_text(json.dumps(m))
    with guarded(root):
        read_all(out)


@FUZZ
@given(edits=EDITS, cut=st.none() | st.integers(0, 64), shard=st.integers(0, 3))
def test_fuzz_tar_index(tmp_path, outputs, edits, cut, shard):
    """A shard's ``.tar.idx`` with any bytes (``inspect``'s summary and ``--pack`` read through it): an
    offset anywhere, a size that is not the packs', never an allocation of what an offset says."""
    root, out = fresh(tmp_path, outputs["webdataset"])
    indexes = sorted(out.glob("*.tar.idx"))
    idx = indexes[shard % len(indexes)]
    idx.write_bytes(mutated(idx.read_bytes(), edits, cut))
    with guarded(root):
        read_all(out)


# JSON arrays nested deeper than Python's parser recurses (a RecursionError, were it not refused)
DEEP = st.integers(500, 100_000).map(lambda depth: ("[" * depth + "]" * depth).encode())


@FUZZ
@given(record=JSON | st.binary(max_size=64) | DEEP, named=st.booleans())
def test_fuzz_content_record(tmp_path, outputs, record, named):
    """A Parquet shard whose footer's content record (``packtool.content``) is any JSON value or bytes, or
    arrays nested up to 100,000 deep, the manifest's ``content_digest`` naming it or not."""
    root, out = fresh(tmp_path, outputs["parquet"])
    path = out / "packs-000000.parquet"
    raw = record if isinstance(record, bytes) else json.dumps(record).encode()
    table = pq.read_table(path)
    table = table.replace_schema_metadata({**table.schema.metadata, CONTENT_KEY: raw})
    pq.write_table(table, path, row_group_size=1, compression="zstd")
    m = json.loads((out / "manifest.json").read_text())
    m["shards"][0].update(bytes=path.stat().st_size, row_groups=[1] * table.num_rows)
    if named:
        m["shards"][0]["content_digest"] = record_digest(raw)
    (out / "manifest.json").write_text(json.dumps(m))
    with guarded(root):
        read_all(out)
