"""``LocalEngine``: runs pipeline steps in this process (``num_proc == 1``) or in a pool of processes.

``map(fn, tasks)`` yields results in task order, with at most ``2 * num_proc`` tasks in flight, so a
stream of input chunks is never read far ahead of the workers (bounded memory). Workers are started
with ``spawn`` (no inherited threads or tokenizer state) and run ``initializer(*initargs)`` once. On
Linux a worker is killed when its parent dies (``PR_SET_PDEATHSIG``), so a killed job leaves no worker
behind that could still write into the output directory while the job is resumed.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
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
        self.initializer, self.initargs = initializer, initargs
        self._pool: ProcessPoolExecutor | None = None
        self._inline_ready = False

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def map(self, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        """Apply ``fn`` to every task; results come back in task order."""
        if self.num_proc <= 1:
            if not self._inline_ready and self.initializer is not None:
                self.initializer(*self.initargs)
            self._inline_ready = True
            for task in tasks:
                yield fn(task)
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.num_proc,
                mp_context=mp.get_context("spawn"),
                initializer=_start_worker,
                initargs=(os.getpid(), self.initializer, self.initargs),
            )
        in_flight: deque[Future] = deque()
        try:
            for task in tasks:
                in_flight.append(self._pool.submit(fn, task))
                if len(in_flight) >= 2 * self.num_proc:
                    yield in_flight.popleft().result()
            while in_flight:
                yield in_flight.popleft().result()
        finally:
            for f in in_flight:
                f.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _start_worker(parent: int, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """Worker start-up: die with the parent (Linux), then run the engine's initializer."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    if initializer is not None:
        initializer(*initargs)
