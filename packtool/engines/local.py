"""``LocalEngine``: runs pipeline steps in this process (``num_proc == 1``) or in a pool of processes.

``map(fn, tasks)`` yields results in task order, with at most ``2 * num_proc`` tasks in flight, so a
stream of input chunks is never read far ahead of the workers (bounded memory). Workers never inherit
the driver's threads or tokenizer state: on Linux they are forked from a ``forkserver`` that has imported
``packtool.pipeline`` once (about 0.3 s of CPU per job instead of 0.3-0.4 s per worker with ``spawn``, on a
2-core machine where every worker's start-up is taken from the work), elsewhere they are spawned; each
runs ``initializer(*initargs)`` once. With several workers each tokenizer runs on one thread
(``TOKENIZERS_PARALLELISM=false`` unless set): ``num_proc`` processes are the parallelism, and the
tokenizer's own threads on top of them would oversubscribe the cores. A worker exits as soon as the
driver does, however it ends (``_exit_with``), so a killed job leaves no worker behind that could still
write into the output directory while the job is resumed; the forkserver then exits with its last worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any


class LocalEngine:
    name = "local"

    def __init__(
        self, num_proc: int = 1, initializer: Callable[..., None] | None = None, initargs: tuple = ()
    ) -> None:
        self.num_proc = num_proc
        self.workers = max(1, num_proc)  # how many tasks run at once
        self.initializer, self.initargs = initializer, initargs
        self._pool: ProcessPoolExecutor | None = None
        self._inline_ready = False
        self._started = False  # a pool task has finished: the workers are up

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def map(self, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        """Apply ``fn`` to every task; results come back in task order.

        While the pool's workers are still starting (no task of theirs has finished yet) and each has
        tasks queued, this process runs the next tasks itself instead of waiting: a worker's start-up
        (forking from the forkserver, the initializer, the first imports it touches) is time the job's
        first tasks would otherwise spend queued.
        """
        if self.num_proc <= 1:
            yield from self._map_inline(fn, tasks)
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.num_proc,
                mp_context=_context(),
                initializer=_start_worker,
                initargs=(os.getpid(), self.initializer, self.initargs),
            )
        cap = 2 * self.num_proc  # tasks queued on the pool at most (their inputs are held until they run)
        in_flight: deque[Future] = deque()  # pool futures and this process's finished ones, in task order

        def queue_full() -> bool:
            return sum(not isinstance(f, _RanHere) for f in in_flight) >= cap

        try:
            for task in tasks:
                self._started = self._started or any(
                    f.done() for f in in_flight if not isinstance(f, _RanHere)
                )
                if queue_full() and not self._started:
                    in_flight.append(self._run_here(fn, task))
                    continue
                in_flight.append(self._pool.submit(fn, task))
                # wait for the oldest task when the queue is full and the workers are up (else: run here)
                while in_flight and (in_flight[0].done() or (queue_full() and self._started)):
                    yield self._result(in_flight.popleft())
            while in_flight:
                yield self._result(in_flight.popleft())
        finally:
            for f in in_flight:
                f.cancel()

    def _result(self, f: Future) -> Any:
        result = f.result()
        self._started = self._started or not isinstance(f, _RanHere)
        return result

    def _map_inline(self, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        self._init_here()
        for task in tasks:
            yield fn(task)

    def _init_here(self) -> None:
        if not self._inline_ready and self.initializer is not None:
            self.initializer(*self.initargs)
        self._inline_ready = True

    def _run_here(self, fn: Callable[[Any], Any], task: Any) -> Future:
        """``fn(task)`` run in this process, as a finished future (its exception, if any, kept in it)."""
        self._init_here()
        f = _RanHere()
        try:
            f.set_result(fn(task))
        except Exception as e:
            f.set_exception(e)
        return f

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            _stop_forkserver()


class _RanHere(Future):
    """A task's result computed by the driver itself (``LocalEngine.map`` while the workers start)."""


def _stop_forkserver() -> None:
    """Stop the forkserver and reap it, so that its workers' CPU time counts in this process's children
    (``wait4``, ``time``) as spawned workers' does; a later pool starts a new one."""
    from multiprocessing import forkserver

    try:
        forkserver._forkserver._stop()
    except (AttributeError, OSError):  # no such private helper in this Python: it exits with the job
        pass


def start_forkserver(num_proc: int) -> None:
    """Start the workers' forkserver now (Linux, ``num_proc > 1``), before the caller imports the pipeline.

    The forkserver imports ``packtool.pipeline`` (numpy, pyarrow, tokenizers; ~0.3-0.45 s of CPU) before it
    can fork a worker. Started here, from a caller that has not imported them yet, it does that beside the
    caller's own imports instead of after them: ``packtool pack --num-proc 2`` starts encoding ~0.3 s sooner.
    The pool made later uses this server; it stops with the engine (``close``) or when this process exits.
    """
    if num_proc <= 1:
        return
    ctx = _context()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _context() -> mp.context.BaseContext:
    if "forkserver" in mp.get_all_start_methods() and sys.platform.startswith("linux"):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["packtool.pipeline"])
        return ctx
    return mp.get_context("spawn")


def _start_worker(job: int, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """Worker start-up: exit when the driver ``job`` (its pid) is gone, then run the engine's initializer."""
    _exit_with(job)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if initializer is not None:
        initializer(*initargs)


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
