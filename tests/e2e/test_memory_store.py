"""Pretokenized Parquet held in memory instead of scratch chunks (``pipeline.memory``): the same bytes as
through the chunks for any ``--num-proc``, resumable after a kill, bad input named and nothing left behind.

``PACKTOOL_MEMORY_STORE_BYTES=0`` sends a run through the scratch chunks, as an input too large for memory
would go."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli
from tests.unit.pipeline.test_memory import write_inputs

DISK = {"PACKTOOL_MEMORY_STORE_BYTES": "0"}
ARGS = [
    "--packed-sequence-size", "64", "--long-samples", "truncate", "--on-error", "skip", "--chunk-size", "50",
    "--shard-size", "8", "--row-group-size", "4",
]  # fmt: skip


def files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


def pack(inputs: list[str], out: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
    """``packtool pack`` with ``ARGS``: quiet, unless ``extra`` holds ``--no-quiet`` (notes wanted)."""
    quiet = [] if "--no-quiet" in extra else ["-q"]
    extra = tuple(a for a in extra if a != "--no-quiet")
    return run_cli("pack", *inputs, "-o", out, *ARGS, *quiet, *extra, **kw)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    return write_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> dict[str, bytes]:
    """Through the scratch chunks, one process: what every other way must write."""
    out = tmp_path_factory.mktemp("ref") / "out"
    pack(inputs, out, "--num-proc", "1", env=DISK)
    ref = files(out)
    assert len([n for n in ref if n.startswith("packs-")]) > 3 and "errors.jsonl" in ref
    return ref


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
@pytest.mark.parametrize("num_proc", ["1", "2", "3"])
def test_same_bytes_in_memory_and_through_chunks(inputs, tmp_path, num_proc, fmt):
    extra = ["--num-proc", num_proc, "--format", fmt]
    if fmt == "webdataset":
        extra = [*extra, "--no-energon-index"]
        args = [a for a in ARGS if a not in ("--row-group-size", "4")]
        disk = run_cli("pack", *inputs, "-o", tmp_path / "disk", *args, *extra, "-q", env=DISK)
        mem = run_cli("pack", *inputs, "-o", tmp_path / "mem", *args, *extra, "-q")
        # the same result line (but for its output path) and warnings: samples left out, records skipped
        assert disk.stderr.replace(str(tmp_path / "disk"), "OUT") == mem.stderr.replace(
            str(tmp_path / "mem"), "OUT"
        )
        assert files(tmp_path / "disk") == files(tmp_path / "mem")
        return
    pack(inputs, tmp_path / "mem", *extra)
    pack(inputs, tmp_path / "disk", *extra, env=DISK)
    assert files(tmp_path / "mem") == files(tmp_path / "disk")


def killed(inputs: list[str], out: Path, at: str, env: dict | None = None) -> None:
    proc = pack(inputs, out, "--num-proc", "2", check=False, env=env, kill_at=at)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("kills", "resumed"),
    [
        ([("encode:2", None)], None),  # killed while reading: nothing kept but the run's record
        ([("write:1", None)], 1),
        ([("write:2", None), ("write:1", None)], 3),
        ([("write:2", DISK)], 2),  # begun through chunks, finished in memory
        ([("write:1", None), ("write:1", DISK)], None),  # and the other way round
    ],
)
def test_a_killed_run_resumes_to_the_same_bytes(inputs, reference, tmp_path, kills, resumed):
    out = tmp_path / "out"
    for at, env in kills:
        killed(inputs, out, at, env)
        work = out.with_name("out.partial") / "_work"
        if env is None:
            assert not list(work.glob("chunk-*")), "a run in memory writes no chunk"
    proc = pack(inputs, out, "--num-proc", "2", "--no-quiet")
    assert "resuming the interrupted run" in proc.stderr
    if resumed:  # at least the shards handed back before each kill (others in flight may have finished)
        done = re.search(
            r"resumed: (\d+) of \d+ shards were already done \(the input was read into memory", proc.stderr
        )
        assert done and int(done[1]) >= resumed, proc.stderr
    assert files(out) == reference
    assert not out.with_name("out.partial").exists()


@pytest.mark.parametrize("num_proc", ["1", "2"])
def test_bad_records_are_named_and_nothing_is_left_behind(inputs, tmp_path, num_proc):
    table = pq.read_table(inputs[0])
    rows = table.to_pylist()
    i = next(i for i in range(40, len(rows)) if len(rows[i]["input_ids"]) > 2)
    rows[i]["input_ids"][2] = -7
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), bad, row_group_size=23)
    out = tmp_path / "out"
    args = [a for a in ARGS if a not in ("--on-error", "skip")]
    proc = run_cli("pack", bad, "-o", out, *args, "--num-proc", num_proc, "-q", check=False)
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1
    assert f"{bad}, row {i}, field 'input_ids'" in proc.stderr
    assert not out.exists() and not out.with_name("out.partial").exists()
    # a sample over N with --long-samples error: named by its file and row as well
    proc = run_cli(
        "pack", inputs[0], "-o", out, "--packed-sequence-size", "8", "--num-proc", num_proc, check=False
    )
    assert proc.returncode == 3 and f"{inputs[0]}, row " in proc.stderr and "more than" in proc.stderr
    assert not out.exists() and not out.with_name("out.partial").exists()


@pytest.mark.parametrize("num_proc", ["1", "2"])
def test_disk_full_while_the_threads_write(inputs, tmp_path, num_proc):
    """A file size limit (a full disk, to a writer) hit by a writer thread: one line, exit 1, nothing left,
    and no thread still writing (the other shards in flight finish before the error is reported)."""
    import os
    import sys

    from tests.conftest import ROOT
    from tests.unit.pipeline.test_run_errors import LIMIT_FSIZE, assert_clean_failure

    args = ["pack", *inputs, "-o", tmp_path / "out", *ARGS, "-q", "--num-proc", num_proc]
    proc = subprocess.run(
        [sys.executable, "-c", LIMIT_FSIZE, "4000", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    line = assert_clean_failure(proc, tmp_path, code=4)
    assert f"{tmp_path / 'out'}: cannot write the output" in line
    assert os.listdir(tmp_path) == []


def test_ctrl_c_while_the_threads_write(tmp_path):
    """SIGINT in the middle of the writes (--num-proc 2): exit 130 once the shards in flight are done,
    no half-written shard, nothing written after the exit, and the same command resumes to the bytes of a
    run through the chunks."""
    import glob
    import os
    import sys
    import time

    import numpy as np

    from tests.conftest import ROOT

    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 600, 15_000)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = rng.integers(0, 32000, int(offsets[-1])).astype(np.int32)
    src = tmp_path / "big.parquet"
    pq.write_table(
        pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(ids))}), src
    )
    out = tmp_path / "out"
    args = ["pack", src, "-o", out, "--packed-sequence-size", 1024, "--shard-size", 16, "--num-proc", 2, "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "packtool.cli", *map(str, args)], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not glob.glob(str(out.with_name("out.partial") / "_work" / "shards" / "*.json")):
        assert proc.poll() is None and time.monotonic() < deadline, "the job ended before any shard"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=60)
    if rc == 0:
        pytest.skip("the job finished before the signal came")
    assert rc == 130 and "interrupted" in proc.stderr.read()
    partial = out.with_name("out.partial")
    names = sorted(os.listdir(partial))
    assert not [n for n in names if ".tmp" in n]
    recorded = len(os.listdir(partial / "_work" / "shards"))
    assert len([n for n in names if n.startswith("packs-")]) == recorded
    time.sleep(0.5)
    assert sorted(os.listdir(partial)) == names, "something was written after the exit"
    resumed = run_cli(*args)
    assert resumed.returncode == 0
    run_cli(*[a if a != out else tmp_path / "ref" for a in args], env=DISK)
    assert files(out) == files(tmp_path / "ref")
