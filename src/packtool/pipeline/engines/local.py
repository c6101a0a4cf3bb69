"""``LocalEngine``: runs pipeline steps in this process (``num_proc == 1``) or in a pool of processes.

``map(fn, tasks)`` yields results in task order, with at most ``2 * num_proc`` tasks in flight, so a
stream of input chunks is never read far ahead of the workers (bounded memory). Workers never inherit
the driver's threads or tokenizer state: on Linux they are forked from a ``forkserver`` that has imported
``packtool.pipeline`` once (so each worker does not import it again, as with ``spawn``; on a 2-core
machine every worker's start-up is taken from the work), elsewhere they are spawned. With several
workers each tokenizer runs on one thread
(``TOKENIZERS_PARALLELISM=false`` unless set): ``num_proc`` processes are the parallelism, and the
tokenizer's own threads on top of them would oversubscribe the cores. A worker exits as soon as the
driver does, however it ends (``_exit_with``), so a killed job leaves no worker behind that could still
write into the output directory while the job is resumed; the forkserver then exits with its last worker.
Workers ignore SIGINT; when the run fails or is interrupted the engine kills them instead of waiting for
their tasks (``close(now=True)``; ``pipeline.interrupt``).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import select
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import forkserver, resource_tracker
from typing import Any

from packtool.errors import WorkerDied
from packtool.pipeline import progress

WAIT_TICK = 0.25  # seconds between on_wait calls while the driver waits for a result
# what each pipeline step is called in a message about a worker that died running it
TASK_NAMES = {
    "describe_encoder": "loading the encoder",
    "encode_chunks": "encoding chunks",
    "_write_shard_task": "writing a shard",
}


class LocalEngine:
    name = "local"

    def __init__(self, num_proc: int = 1, preload: tuple[str, ...] = ()) -> None:
        self.num_proc, self.preload = num_proc, preload
        self.workers = max(1, num_proc)  # how many tasks run at once
        self._pool: ProcessPoolExecutor | None = None
        # bytes of input the workers have read (pipeline.progress), and what the driver calls about every
        # WAIT_TICK seconds while it waits for a result (the progress bar reads the counter)
        # (no lock: a worker killed while holding one would leave the driver waiting on it forever; an
        # increment lost to a race only holds the bar back until the chunk or the step ends)
        self.progress = _context().RawValue("q", 0) if num_proc > 1 else None
        self.on_wait: Callable[[], None] | None = None

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(now=exc_type is not None)

    def map(self, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        """Apply ``fn`` to every task; results come back in task order."""
        if self.num_proc <= 1:
            for task in tasks:
                yield fn(task)
            return
        if self._pool is None:
            start_forkserver(self.num_proc, self.preload)  # with SIGINT held off (unless started already)
            self._pool = ProcessPoolExecutor(
                self.num_proc,
                mp_context=_context(self.preload),
                initializer=_start_worker,
                initargs=(os.getpid(), self.progress, progress.on_step),
            )
        in_flight: deque[Future] = deque()
        try:
            for task in tasks:
                in_flight.append(self._pool.submit(_run_task, fn, task))
                if len(in_flight) >= 2 * self.num_proc:
                    yield self._wait(in_flight.popleft())
            while in_flight:
                yield self._wait(in_flight.popleft())
        except BrokenProcessPool:
            raise self._worker_died(fn) from None
        finally:
            for f in in_flight:
                f.cancel()

    def _wait(self, future: Future) -> Any:
        """``future``'s result, calling ``on_wait`` about every ``WAIT_TICK`` seconds until it comes."""
        while self.on_wait is not None:
            try:
                return future.result(timeout=WAIT_TICK)
            except FutureTimeout:
                self.on_wait()
        return future.result()

    def _worker_died(self, fn: Callable) -> WorkerDied:
        """Which worker died, how, and during which step (a worker killed by a signal: the out-of-memory
        killer, most often), when the pool broke. The pool's own thread reaps its workers first: a worker's
        exit status, read from the forkserver, can be read once, and a second reader at the same time
        would take it for a lost forkserver (``exited with code 255``)."""
        manager = getattr(self._pool, "_executor_manager_thread", None)
        if manager is not None:
            manager.join(timeout=10)
        dead = [p for p in (getattr(self._pool, "_processes", None) or {}).values() if p.exitcode]
        how = ", ".join(f"pid {p.pid} {_exit_reason(p.exitcode)}" for p in dead) or "a worker exited"
        return WorkerDied(f"a worker process died while {TASK_NAMES.get(fn.__name__, fn.__name__)} ({how})")

    def close(self, now: bool = False) -> None:
        """Shut the pool down once its tasks are done or, with ``now`` (the run is failing or was
        interrupted), at once: the workers are killed rather than left to finish the chunks they hold
        (a chunk or shard is whole on disk or absent, so a resume is not harmed), and the driver stops
        within a moment instead of after the slowest running task. A worker the forkserver had forked but
        the pool not yet counted (a Ctrl-C as the pool starts) is killed too: the forkserver, which outlives
        its last worker, would otherwise keep the driver waiting for it."""
        if self._pool is not None:
            if now:
                for process in list((getattr(self._pool, "_processes", None) or {}).values()):
                    process.kill()
                _kill_forkserver_children()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            _stop_forkserver(now)


def thread_map(fn: Callable[[Any], Any], tasks: Iterable[Any], workers: int) -> Iterator[Any]:
    """``fn`` over ``tasks`` in ``workers`` threads of this process (in this thread if ``workers <= 1``),
    results in task order, at most ``2 * workers`` tasks in flight: for tasks that leave the GIL most of
    their time (Arrow's encoding and compression) over data this process holds.

    When a task fails or the caller stops early (an exception, Ctrl-C), the tasks not started are dropped
    and the running ones finish before this returns, so that no thread still writes after it.
    """
    if workers <= 1:
        for task in tasks:
            yield fn(task)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="packtool") as pool:
        in_flight: deque[Future] = deque()
        try:
            for task in tasks:
                in_flight.append(pool.submit(fn, task))
                if len(in_flight) >= 2 * workers:
                    yield in_flight.popleft().result()
            while in_flight:
                yield in_flight.popleft().result()
        finally:
            for f in in_flight:
                f.cancel()


STOP_WAIT = 2.0  # seconds a stopping job gives the forkserver to reap the workers it killed


def _stop_forkserver(now: bool = False) -> None:
    """Stop the forkserver and reap it, so that its workers' CPU time counts in this process's children
    (``wait4``, ``time``) as spawned workers' does; a later pool starts a new one. It is ended by SIGTERM
    once it has reaped its workers: nothing it holds needs an orderly exit, and a vision run's forkserver
    (torch and transformers imported) took a second to exit. With ``now`` (a job
    stopping) it is killed, its workers first (it reaps them, within ``STOP_WAIT`` seconds): it may be in
    the middle of its imports (a Ctrl-C early in a run), when it would see its pipe close only after them,
    or still serve a worker the pool has not counted, which it would wait for."""
    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    if now:
        _kill_forkserver_children()
    deadline = time.monotonic() + STOP_WAIT
    while _children_of(pid) and time.monotonic() < deadline:  # it reaps them as they die
        time.sleep(0.01)
    with contextlib.suppress(OSError):  # its workers reaped (their CPU counted), nothing of it to keep:
        os.kill(pid, signal.SIGKILL if now else signal.SIGTERM)  # no second of exiting torch's imports
    if getattr(server, "_forkserver_alive_fd", 0) is None:  # a stop interrupted in its wait (a Ctrl-C)
        _reap_forkserver(server, pid)
        return
    try:
        server._stop()  # closes its pipe and waits for it
    except (AttributeError, OSError):  # no such private helper in this Python: it exits with the job
        pass


def _reap_forkserver(server: Any, pid: int) -> None:
    """Finish a stop of the forkserver that a Ctrl-C cut short after it closed the server's pipe (the
    server is exiting or was killed): reap it and forget it, as the stop would have, so that a second
    stop does not close the pipe again (``TypeError`` from the stop itself)."""
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)
    address = getattr(server, "_forkserver_address", None)
    if isinstance(address, str) and address and not address.startswith("\0"):  # a socket file
        with contextlib.suppress(OSError):
            os.unlink(address)
    server._forkserver_pid = server._forkserver_address = None


def _kill_forkserver_children() -> None:
    """SIGKILL every process the forkserver forked (workers, counted by a pool or not yet); Linux, where
    it is used, tells them from ``/proc``."""
    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    for child in _children_of(pid) if pid is not None else ():
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)


def _children_of(pid: int) -> list[int]:
    """The live (not yet reaped) children of process ``pid``, from ``/proc`` (none where there is none)."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(name))
    return out


def stop_helpers() -> None:
    """End at once, and reap, the workers' forkserver and any worker it forked, for a job that stops
    (Ctrl-C) before or while its engine starts, so that it exits leaving no process behind. (The resource
    tracker, which unlinks the pool's semaphores, exits on its own as this process does.)"""
    _stop_forkserver(now=True)


def _exit_reason(code: int) -> str:
    """``killed by SIGKILL (signal 9: often the out-of-memory killer)`` or ``exited with code N``."""
    if code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
    oom = ": often the out-of-memory killer" if -code == signal.SIGKILL else ""
    return f"killed by {name} (signal {-code}{oom})"


def start_forkserver(num_proc: int, preload: tuple[str, ...] = ()) -> None:
    """Start the workers' forkserver now (Linux, ``num_proc > 1``), before the caller imports the pipeline.

    The forkserver imports ``packtool.pipeline`` (numpy, pyarrow, tokenizers) before it can fork a worker.
    Started here, from a caller that has not imported them yet, it does that beside the caller's own
    imports instead of after them, so ``packtool pack --num-proc 2`` starts encoding sooner.
    The pool made later uses this server; it stops with the engine (``close``) or when this process exits.
    ``preload``: modules it imports too (``engines.worker_preload``: a vision run's encoder).
    """
    if num_proc <= 1:
        return
    ctx = _context(preload)
    if ctx.get_start_method() == "forkserver":
        # the resource tracker first: starting it, multiprocessing unblocks SIGINT, whatever was blocked
        resource_tracker.ensure_running()
        with _sigint_held():
            forkserver.ensure_running()


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT blocked in this thread while a helper process is started (as ``multiprocessing``'s resource
    tracker starts its own): the process starts with it blocked, so a Ctrl-C while it imports
    ``packtool.pipeline`` (a second or more, under load) is not a ``KeyboardInterrupt`` traceback of its
    own, and once it has set SIGINT aside, as the forkserver does, it never is. Here a Ctrl-C that came
    meanwhile is delivered as the block is lifted."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _context(preload: tuple[str, ...] = ()) -> mp.context.BaseContext:
    """The workers' start method: a forkserver that has imported the pipeline (and ``preload``), else
    spawn."""
    if "forkserver" in mp.get_all_start_methods() and sys.platform.startswith("linux"):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["packtool.pipeline.run", *preload])
        return ctx
    return mp.get_context("spawn")


_DRIVER: list[int] = []  # in a worker: the pid of the job it works for


def _run_task(fn: Callable[[Any], Any], task: Any) -> Any:
    """Run one task in a worker, unless the job is gone: a task queued before the driver died is not
    started (the worker is about to exit with it; see ``_exit_with``)."""
    if _DRIVER and not _alive(_DRIVER[0]):
        os._exit(1)
    return fn(task)


# glibc malloc settings for a packing process (``keep_freed_memory``), in bytes
MMAP_THRESHOLD = 64 << 20  # blocks under this come from the heap, not from a fresh mapping each
TRIM_THRESHOLD = 256 << 20  # free heap at the top kept for reuse, up to this


def keep_freed_memory() -> bool:
    """Let this process reuse the memory it frees instead of giving it back to the OS at once (glibc's
    ``mallopt``; returns False elsewhere, where nothing changes).

    The writers allocate the same arrays for every row group: ``(row_group_size, N)`` tokens, labels and
    positions and their temporaries, 2 MiB each at N = 4096. glibc serves blocks over 128 KiB (its
    threshold moves up only to the size of a block freed from the main heap) from fresh mappings and
    unmaps them when freed, so every row group page-faulted its arrays in again: about a quarter of the
    gather's CPU time (docs/performance.md). Served from the heap and kept there, they are reused. The cost
    is that up to ``TRIM_THRESHOLD`` of freed memory stays with the process until it exits. ``packtool
    pack`` calls it in its own process and in every worker; ``run_pack`` called from Python does not, so
    that a caller's process keeps its own settings.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
        return bool(libc.mallopt(m_mmap_threshold, MMAP_THRESHOLD)) and bool(
            libc.mallopt(m_trim_threshold, TRIM_THRESHOLD)
        )
    except (OSError, AttributeError):
        return False


def give_back_freed_memory() -> bool:
    """Return the memory this process has freed to the OS now (glibc's ``malloc_trim``; False elsewhere,
    where nothing changes): what ``keep_freed_memory`` keeps, and the free holes of the heap, which glibc
    keeps until the heap's top is free."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _start_worker(job: int, counter: Any = None, on_step: Callable[[str, int], None] | None = None) -> None:
    """Worker start-up: exit when the driver ``job`` (its pid) is gone; one tokenizer thread per worker;
    freed memory kept for reuse (``keep_freed_memory``); SIGINT ignored, as a Ctrl-C in a terminal
    reaches every process of the job and the driver alone ends it (``pipeline.interrupt``); the bytes of
    input it reads counted in ``counter`` (``pipeline.progress``); the driver's ``progress.on_step`` (a
    test's hook, picklable) installed here too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _DRIVER[:] = [job]
    progress.set_sink(counter)
    progress.on_step = on_step
    keep_freed_memory()
    _exit_with(job)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _exit_with(job: int) -> None:
    """End this process as soon as process ``job`` ends, whatever ends it (SIGKILL included).

    A worker's parent is the forkserver, not the driver, so ``PR_SET_PDEATHSIG`` cannot tie it to the
    driver, and nothing else ends it: the forkserver waits for every holder of its "alive" pipe, which
    each worker holds, and the pool's task pipe never reads EOF because the workers hold its write end
    too. Without this a killed job's workers went on encoding its queued chunks into the output's
    partial directory (the README promises no stray writer outlives a killed job). A daemon thread waits
    on a pidfd of the driver (Linux 5.3+; else it polls every 0.2 s).
    """
    try:
        pidfd = os.pidfd_open(job)
    except ProcessLookupError:  # gone already
        os._exit(1)
    except (AttributeError, OSError):
        pidfd = None

    def watch() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])  # readable once the process has ended
        else:
            while _alive(job):
                time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="packtool-exit-with-driver", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
