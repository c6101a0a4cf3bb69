"""LocalEngine: results in task order, errors in task order, and a run's worker state built once."""

from __future__ import annotations

import os

import pytest

from packtool import run_pack
from packtool.options import PackOptions
from packtool.pipeline.engines.local import LocalEngine
from tests.conftest import DEMO, DEMO_TOKENIZER


def _square(task: int) -> tuple[int, int]:
    return task * task, os.getpid()


def _fails_on_3(task: int) -> int:
    if task == 3:
        raise ValueError(f"task {task} failed")
    return task


@pytest.mark.parametrize("num_proc", [1, 2])
def test_results_come_back_in_task_order(num_proc):
    with LocalEngine(num_proc) as engine:
        results = list(engine.map(_square, range(40)))
    assert [r for r, _ in results] == [t * t for t in range(40)]
    in_driver = {pid == os.getpid() for _, pid in results}
    assert in_driver == ({True} if num_proc == 1 else {False})


@pytest.mark.parametrize("num_proc", [1, 2])
def test_a_failing_task_raises_in_task_order(num_proc):
    got = []
    with LocalEngine(num_proc) as engine, pytest.raises(ValueError, match="task 3 failed"):
        for r in engine.map(_fails_on_3, range(20)):
            got.append(r)
    assert got == [0, 1, 2]


def test_a_run_builds_its_encoder_once_in_the_driver(monkeypatch, tmp_path):
    """The driver builds the run's encoder to fail fast on a bad tokenizer; with --num-proc 1 it also runs
    the tasks, and finds that state built (``pipeline.encode.worker``) instead of loading the tokenizer
    again."""
    from packtool.pipeline import encode

    built = []
    real = encode.build_encoder
    monkeypatch.setattr(encode, "build_encoder", lambda *a: built.append(a) or real(*a))
    config = PackOptions.from_dict(
        {
            "inputs": [str(DEMO / "train.jsonl")],
            "output": str(tmp_path / "out"),
            "tokenizer": str(DEMO_TOKENIZER),
            "packed_sequence_size": 1024,
            "long_samples": "truncate",
            "num_proc": 1,
            "quiet": True,
        }
    )
    run_pack(config, progress=False)
    assert len(built) == 1


def _slow_square(task: int) -> tuple[int, str]:
    import threading
    import time

    time.sleep(0.01 * (task % 3))  # finish out of order
    return task * task, threading.current_thread().name


@pytest.mark.parametrize("workers", [1, 2])
def test_thread_map_results_in_task_order(workers):
    from packtool.pipeline.engines.local import thread_map

    results = list(thread_map(_slow_square, range(12), workers))
    assert [r for r, _ in results] == [t * t for t in range(12)]
    names = {n for _, n in results}
    assert names == ({"MainThread"} if workers == 1 else {n for n in names if n.startswith("packtool")})


def test_thread_map_stops_at_a_failure_with_no_task_left_running():
    """A failing task raises in task order; the tasks queued behind it are dropped and the running ones
    have finished when the error reaches the caller (no thread writes after it)."""
    import threading
    import time

    from packtool.pipeline.engines.local import thread_map

    started, finished = [], []
    lock = threading.Lock()

    def task(i: int) -> int:
        with lock:
            started.append(i)
        if i == 3:
            raise ValueError("task 3 failed")
        time.sleep(0.05)
        with lock:
            finished.append(i)
        return i

    got = []
    with pytest.raises(ValueError, match="task 3 failed"):
        for r in thread_map(task, range(100), 2):
            got.append(r)
    assert got == [0, 1, 2]
    done = set(started) - {3}
    assert set(finished) == done  # every task begun ran to its end before the error came back
    assert len(started) <= 3 + 2 * 2  # at most 2 * workers in flight beyond what was handed back


def test_workers_are_needed_unless_every_input_is_parquet_without_a_tokenizer(tmp_path):
    from packtool.pipeline.engines import may_need_workers

    (tmp_path / "a.parquet").write_bytes(b"")
    (tmp_path / "b.parquet").write_bytes(b"")
    (tmp_path / "c.jsonl").write_text("")

    def cfg(*inputs: str, **kw) -> dict:
        return PackOptions.from_dict({"inputs": [str(tmp_path / i) for i in inputs], **kw}).to_dict()

    assert not may_need_workers(cfg("a.parquet", "*.parquet"))
    assert may_need_workers(cfg("a.parquet", tokenizer=str(DEMO_TOKENIZER)))  # text, or ids to check
    assert may_need_workers(cfg("a.parquet", "c.jsonl"))
    assert may_need_workers(cfg("*"))
    assert may_need_workers(cfg("."))  # a folder: whatever it holds
    assert may_need_workers(cfg("a.parquet", engine="ray"))
    assert may_need_workers({"inputs": ["hf:org/set"]})


def test_keep_freed_memory_takes_effect_where_glibc_runs():
    """The writers' arrays are reused only where ``mallopt`` exists (glibc); elsewhere it changes nothing."""
    import platform

    from packtool.pipeline.engines.local import keep_freed_memory

    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")


GIVE_BACK = """
import numpy as np
from packtool.pipeline.engines.local import give_back_freed_memory, keep_freed_memory
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
keep_freed_memory()  # 1 MiB blocks come from the heap and stay there once freed
blocks = [np.ones(1 << 20, np.uint8) for _ in range(200)]
del blocks
kept = rss()
print(give_back_freed_memory(), kept - rss())
"""


def test_give_back_freed_memory_returns_what_the_heap_kept():
    """What ``keep_freed_memory`` keeps (200 MiB freed, under its 256 MiB) goes back to the OS at once."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    out = subprocess.run([sys.executable, "-c", GIVE_BACK], capture_output=True, text=True, check=True)
    given, freed = out.stdout.split()
    assert given == "True" and int(freed) >= 150, out.stdout


def test_a_ctrl_c_in_the_forkserver_s_stop_leaves_it_reaped_by_the_next_stop(monkeypatch):
    """A Ctrl-C as a finished run shuts its pool down lands in the forkserver's stop, which has closed the
    server's pipe and waits for it: the CLI's own stop after it closed that pipe again (``TypeError``, a
    traceback and exit 1 instead of the interrupted run's line and 130). The next stop now reaps it."""
    from multiprocessing import forkserver

    from packtool.pipeline.engines import local

    with LocalEngine(2) as engine:
        list(engine.map(_square, range(4)))
        server = forkserver._forkserver
        pid = server._forkserver_pid
        assert pid is not None
        real_waitpid = os.waitpid

        def interrupted(p, options):
            monkeypatch.setattr(os, "waitpid", real_waitpid)
            raise KeyboardInterrupt

        monkeypatch.setattr(os, "waitpid", interrupted)
        with pytest.raises(KeyboardInterrupt):
            engine.close()
    local.stop_helpers()  # the CLI's, as a run ends interrupted
    assert server._forkserver_pid is None
    with pytest.raises(ChildProcessError):  # reaped
        os.waitpid(pid, os.WNOHANG)


def _imported(name: str) -> bool:
    import sys

    return name in sys.modules


def test_the_workers_have_the_preload_imported_before_their_first_task():
    """An engine's ``preload`` (a vision run's encoder, ``engines.worker_preload``) is imported by the
    forkserver the engine starts, so each worker has it at its first task instead of importing it then."""
    with LocalEngine(2, preload=("colorsys",)) as engine:
        assert all(engine.map(_imported, ["colorsys"] * 4))
