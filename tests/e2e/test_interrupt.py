"""Ctrl-C on a real ``packtool pack --num-proc 2``: the signal goes to the whole process group, as a
terminal sends it. The job says "stopping" at once, exits within seconds (not after the chunks its workers
hold), a second Ctrl-C ends it at once, no traceback, no process left, and the same command resumes.

The encoder plugin holds every chunk after the first four for a minute while ``HOLD`` is set, so a job
that waited for its running chunks could not exit in time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, write_jsonl
from tests.e2e.test_resume import _descendants, _running

HOLDING_ENCODER = """
import os, time


def encode(records):
    if os.environ.get("HOLD") and any(t.startswith("later") for t in records["text"]):
        time.sleep(60)
    return {"input_ids": [[1 + len(w) for w in t.split()] for t in records["text"]]}
"""


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_within_seconds_and_resumes(tmp_path: Path, presses: int):
    plugin = tmp_path / "hold.py"
    plugin.write_text(HOLDING_ENCODER)
    rows = [{"text": f"{'first' if i < 200 else 'later'} record {i} " + "w " * (i % 30)} for i in range(400)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    args = ["pack", src, "-o", out, "--tokenizer", f"{plugin}:encode", "--packed-sequence-size", 64,
            "--chunk-size", 50, "--num-proc", 2]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOLD": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "packtool.cli", *map(str, args)],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group, which the test's "Ctrl-C" goes to
    )
    work = out.with_name("out.partial") / "_work"
    deadline = time.monotonic() + 120
    while not (work / "chunk-000003" / "meta.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the job ended before the Ctrl-C"
        time.sleep(0.01)
    time.sleep(0.5)  # the workers are now held in chunks 4 and 5
    started = _descendants(proc.pid)
    pressed = time.monotonic()
    for _ in range(presses):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.2)
    # 130, or killed by the second SIGINT itself once Python, exiting, has put back its default action
    # (a shell shows both as 130)
    assert proc.wait(timeout=10) in (130, -signal.SIGINT)
    assert time.monotonic() - pressed < 5, "Ctrl-C took more than a few seconds"
    stderr = proc.stderr.read()
    assert "packtool: stopping" in stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    deadline = time.monotonic() + 5
    while (alive := [p for p in started if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, "processes of the interrupted job are still running"
    assert not out.exists() and (work / "run.json").exists()
    resumed = run_cli(*args)
    assert "resumed: 4 of 8 chunks" in resumed.stderr
    if presses == 2:  # stopped at once: what is on disk is what a SIGKILL leaves, and it resumes whole
        run_cli("verify", out, "--source", "--tokenizer", f"{plugin}:encode")  # code runs only when named


def _group(pgid: int) -> dict[int, bytes]:
    """``{pid: command line}`` of the running (not zombie) processes of process group ``pgid``."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError, IndexError):
            continue
    return out


@pytest.mark.parametrize("when", ["0.5 s after start", "as the workers' server starts"])
def test_ctrl_c_early_in_a_run_leaves_no_traceback_and_no_process(tmp_path: Path, when: str):
    """A Ctrl-C while the workers' forkserver is still importing packtool (a second or more under load)
    printed a 60-line KeyboardInterrupt traceback of its own, and the job exited before reaping it (or,
    with the pool starting, waited on it for ever): now the job alone answers, with its one line, and
    exits 130 leaving no process of its group running."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": f"record {i} " + "w " * (i % 30)} for i in range(400)])
    args = ["pack", src, "-o", tmp_path / "out", "--tokenizer", ROOT / "data" / "demo" / "tokenizer.json",
            "--packed-sequence-size", 64, "--long-samples", "truncate", "--num-proc", 2]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "packtool.cli", *map(str, args)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group, which the test's "Ctrl-C" goes to
    )
    if when == "0.5 s after start":
        time.sleep(0.5)
    else:  # the moment the forkserver exists: it is importing numpy, pyarrow and packtool
        deadline = time.monotonic() + 60
        while not any(b"forkserver import main" in c for c in _group(proc.pid).values()):
            assert proc.poll() is None and time.monotonic() < deadline, "no forkserver started"
            time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)
    # 130, or killed by the SIGINT itself once Python, exiting, has put back its default action (a shell
    # shows both as 130)
    assert proc.wait(timeout=30) in (130, -signal.SIGINT)
    stderr = proc.stderr.read()
    for noise in ("Traceback", "KeyboardInterrupt", "Exception ignored", "Fatal Python error"):
        assert noise not in stderr, stderr
    assert stderr.strip().endswith("(run the same command again to resume)"), stderr
    deadline = time.monotonic() + 2  # the resource tracker ends as it sees the job's end of its pipe
    while (left := _group(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not left, f"processes of the interrupted job still run: {left}"
