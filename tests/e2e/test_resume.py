"""Resumable jobs: a job killed at any point and started again writes the same bytes; one job per output.

Every test runs the real CLI in child processes. Kills are real SIGKILLs: either the job kills itself at a
chosen step (``tests/fault_runner.py``: ``STEP:N``) or the test kills it when a given chunk file appears.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DEMO, DEMO_TOKENIZER, ROOT, run_cli

# sequential: the kill points below (chunk and shard numbers) are those of its 15 shards
ARGS = [
    "--strategy", "sequential", "--tokenizer", str(DEMO_TOKENIZER), "--packed-sequence-size", "512",
    "--long-samples", "truncate",
    "--chunk-size", "100", "--shard-size", "20",
]  # fmt: skip


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def pack(out: Path, *extra: str, inputs: list[str] | None = None, **kw) -> subprocess.CompletedProcess:
    return run_cli("pack", *(inputs or [str(DEMO / "train.jsonl")]), "-o", str(out), *ARGS, *extra, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """An uninterrupted run's files; the output path is part of the manifest, so runs reuse it."""
    root = tmp_path_factory.mktemp("resume")
    pack(root / "out")
    ref = files(root / "out")
    assert "manifest.json" in ref and "README.md" in ref and len(ref) == 17  # 15 shards, manifest, card
    return root, ref


@pytest.fixture
def out(reference) -> Path:
    root, _ = reference
    path = root / "out"
    for p in (path, path.with_name("out.partial")):
        if p.exists():
            subprocess.run(["rm", "-rf", str(p)], check=True)
    return path


def killed(out: Path, at: str, *extra: str) -> subprocess.CompletedProcess:
    proc = pack(out, *extra, check=False, kill_at=at)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not out.exists(), "a killed job must not leave a complete-looking output"
    assert not (out.with_name("out.partial") / "manifest.json").exists()
    return proc


@pytest.mark.parametrize(
    "kills",
    [["encode:1"], ["encode:7"], ["write:1"], ["write:14"], ["encode:3", "encode:2", "write:5"]],
)
def test_kill_and_resume_gives_identical_output(reference, out, kills):
    _, ref = reference
    for at in kills:
        killed(out, at)
    proc = pack(out)
    assert "resuming the interrupted run" in proc.stderr
    assert files(out) == ref
    assert not out.with_name("out.partial").exists()


def test_resume_does_not_redo_finished_chunks_or_shards(reference, out):
    _, ref = reference
    killed(out, "encode:4")
    work = out.with_name("out.partial") / "_work"
    before = {p.parent.name: os.stat(p) for p in work.glob("chunk-*/meta.json")}
    assert sorted(before) == [f"chunk-{i:06d}" for i in range(4)]
    proc = killed(out, "write:3")
    assert "resumed: 4 of 10 chunks and 0 of 15 shards were already done" in proc.stderr
    for name, st in before.items():  # the same files, never rewritten
        after = os.stat(work / name / "meta.json")
        assert (after.st_ino, after.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    shard0 = os.stat(out.with_name("out.partial") / "packs-000000.parquet")
    proc = pack(out)
    assert "resumed: 10 of 10 chunks and 3 of 15 shards were already done" in proc.stderr
    assert (os.stat(out / "packs-000000.parquet").st_ino) == shard0.st_ino
    assert files(out) == ref


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_external_kill_of_a_multiprocess_job(reference, out, sig):
    """Kill (or Ctrl-C) the driver of a ``--num-proc 2`` job when chunk 3 appears: no process it started
    (forkserver, workers, resource tracker) outlives it, no chunk is written after it; resume it."""
    _, ref = reference
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(DEMO / "train.jsonl"), "-o", str(out), *ARGS]
    proc = subprocess.Popen([*cmd, "--num-proc", "2", "-q", "--chunk-size", "100"], env=env)
    work = out.with_name("out.partial") / "_work"
    deadline = time.monotonic() + 120
    while not (work / "chunk-000002" / "meta.json").exists() and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    assert proc.poll() is None, "the job ended before it could be killed"
    started = _descendants(proc.pid)
    assert len(started) >= 3  # forkserver and two workers at least
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == {signal.SIGINT: 130}.get(sig, -sig)
    # chunks begun by then (a chunk-N.tmp-PID directory counts): a worker busy with one as the driver died
    # may finish it in the moment before it exits, but no worker may begin another
    begun = {p.name.split(".")[0] for p in work.glob("chunk-*")}
    deadline = time.monotonic() + 10
    while (alive := [p for p in started if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, "processes of the killed job are still running"
    after = {p.name.split(".")[0] for p in work.glob("chunk-*")}
    assert after <= begun, f"chunks begun after the kill: {sorted(after - begun)}"
    assert (work / "run.json").exists() and not out.exists()
    proc = pack(out, "--num-proc", "2")
    assert "resumed:" in proc.stderr
    assert files(out) == ref


def _descendants(pid: int) -> list[int]:
    """Pids of the live processes below ``pid`` (children, grandchildren, ...), from /proc."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_changed_config_starts_afresh(reference, out):
    _, ref = reference
    killed(out, "encode:2", "--pad-token-id", "3")
    proc = pack(out)
    assert "holds an interrupted run of another job" in proc.stderr
    assert "resuming the interrupted run" not in proc.stderr
    assert files(out) == ref


def test_bad_input_removes_the_partial_directory(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "also fine"}\nnot json\n')
    out = tmp_path / "out"
    proc = pack(out, inputs=[str(bad)], check=False)
    assert proc.returncode == 3
    assert "bad.jsonl, line 3" in proc.stderr
    assert not out.exists() and not out.with_name("out.partial").exists()


SLOW_ENCODER = """
import pathlib, time

GO = pathlib.Path(__file__).with_name("go")


def encode(records):
    deadline = time.monotonic() + 120
    while not GO.exists() and time.monotonic() < deadline:  # hold the job until the test says go
        time.sleep(0.01)
    return {"input_ids": [[1, 2, 3] for _ in records["text"]]}
"""


def test_second_job_on_the_same_output_is_refused(tmp_path):
    plugin = tmp_path / "slow.py"
    plugin.write_text(SLOW_ENCODER)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(DEMO / "train.jsonl"), "-o", str(out),
           "--tokenizer", f"{plugin}:encode", "--packed-sequence-size", "64", "-q"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        # it holds the output once its pid is in the lock (its run.json comes later: the driver runs the
        # encoder on the first records for the run's identity, and this one waits for "go")
        lock = out.with_name("out.lock")

        def holding() -> bool:
            return lock.exists() and lock.read_text().strip() == str(first.pid)

        deadline = time.monotonic() + 60
        while not holding() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert holding(), "the first job did not start"
        second = run_cli(*cmd[3:], check=False)
        assert second.returncode == 2
        assert second.stderr.count("\n") == 1
        assert f"another packtool job (pid {first.pid}) is writing this output directory" in second.stderr
        assert str(out) in second.stderr
        (tmp_path / "go").touch()
        assert first.wait(timeout=120) == 0, first.stderr.read()
    finally:
        (tmp_path / "go").touch()
        if first.poll() is None:
            first.kill()
    assert (out / "manifest.json").exists()
    assert not out.with_name("out.lock").exists()
    # the lock is free again: a third job runs (and is refused only because the output now exists)
    third = run_cli(*cmd[3:], check=False)
    assert third.returncode == 2 and "output directory exists" in third.stderr


def test_resume_keeps_the_skipped_records_of_finished_chunks(tmp_path):
    """Under --on-error skip, the chunks an earlier attempt finished are reused and still count their bad
    records (JSON Lines are parsed by the workers, so every bad line is counted in its chunk's meta.json):
    the resumed run's manifest and errors.jsonl are those of an uninterrupted run."""
    rows = (DEMO / "train.jsonl").read_text().splitlines()
    # bad lines in several chunks of 100 lines: two the reader rejects, two the encoder does
    for i, bad in zip(
        (3, 150, 420, 777), ("{not json", '"not an object"', '{"txt": "a"}', '{"x": 1}'), strict=True
    ):
        rows[i] = bad
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(rows) + "\n")
    root = tmp_path / "ref"
    root.mkdir()
    pack(root / "out", "--on-error", "skip", inputs=[str(data)])
    ref = files(root / "out")
    out = tmp_path / "out"
    proc = pack(out, "--on-error", "skip", inputs=[str(data)], check=False, kill_at="encode:6")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    again = pack(out, "--on-error", "skip", inputs=[str(data)])
    assert "resumed: 6 of 10 chunks" in again.stderr  # reused, not encoded again
    got = files(out)
    ref_manifest = json.loads(ref.pop("manifest.json"))
    got_manifest = json.loads(got.pop("manifest.json"))
    assert got_manifest["stats"]["skipped_samples"] == 4
    assert got_manifest["stats"] == ref_manifest["stats"]
    assert got == ref  # every shard and errors.jsonl
