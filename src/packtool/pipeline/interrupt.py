"""Ctrl-C during ``packtool pack``: say "stopping" at once, stop within a second or two, and stop at once on
a second Ctrl-C.

The first SIGINT prints ``packtool: stopping ...`` and raises ``KeyboardInterrupt`` in the driver as
Python's default handler would: the run unwinds, the engine kills its workers instead of letting the
chunks they hold finish (``LocalEngine.close``), and the ``.partial`` directory is kept for a resume.
A second SIGINT while that unwinds ends the process at once (``os._exit(130)``): what is on disk is what a
SIGKILL would leave, which a resume handles (finished chunks and shards are whole or absent), and the
workers exit with the driver (``engines.local._exit_with``).

Workers ignore SIGINT (``engines.local._start_worker``): a Ctrl-C in a terminal reaches every process of
the job, and the driver alone decides how the job ends, so no worker prints a traceback of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

from packtool.errors import EXIT_INTERRUPTED

STOPPING = "packtool: stopping (Ctrl-C again to stop at once); the finished work is kept for a resume\n"
STOPPED = "packtool: stopped at once; run the same command again to resume\n"
GRACE = 5.0  # seconds after an interrupted run returns during which a second Ctrl-C still exits at once


@contextlib.contextmanager
def stop_on_interrupt() -> Iterator[None]:
    """Within it, SIGINT behaves as the module says; the previous handler is restored on exit.

    Only in the main thread and when SIGINT has Python's default handler: a caller of ``run_pack`` that
    installed its own handler keeps it. After an interrupted run the handler stays for ``GRACE`` seconds,
    so that a second Ctrl-C while the caller finishes stopping (the CLI prints its message and exits)
    still exits at once; a Ctrl-C after that is Python's ``KeyboardInterrupt`` again.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    interrupted, ended = [], []

    def handler(signum, frame) -> None:
        # os.write, not print: a handler may run while the main thread is inside sys.stderr's own write
        if interrupted and ended and time.monotonic() - ended[0] > GRACE:  # long after: Python's own again
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        if interrupted:
            _write(STOPPED)
            os._exit(EXIT_INTERRUPTED)
        interrupted.append(True)
        _write(STOPPING)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        if interrupted:  # the caller is still stopping (the CLI's message, the exit): a second Ctrl-C
            ended.append(time.monotonic())  # then ends it at once, for GRACE seconds
        else:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _write(text: str) -> None:
    # a progress bar leaves the cursor at the end of its line on a terminal: start a line of our own
    prefix = "\n" if sys.stderr.isatty() else ""
    try:
        os.write(sys.stderr.fileno(), (prefix + text).encode())
    except (OSError, ValueError):  # stderr closed or not a file: nothing to say it on
        pass
