"""Bytes of input read by the encoding, reported as it goes, for the ``encode`` progress bar.

The encode step reports after each piece of input it has read and encoded (a range of lines or files,
at most 4 MiB of them, so that the bar moves as often on long documents as on short ones:
``readers.piece_bytes``) through ``report(nbytes)``, wherever it runs. In the driver
(``num_proc == 1``) the sink is a function that moves the bar at once; in a local pool's worker it is a
counter shared with the driver (``multiprocessing.RawValue``, given to each worker as it starts), which the
driver reads while it waits for results (``LocalEngine.on_wait``). Elsewhere (Ray) there is no sink and
the bar moves as each chunk is finished. Nothing here changes what is written.

The same places say when a step has reached a point (``step_done``: ``("encode", n)`` once the driver has n
new chunks, ``("write", n)`` once it has n new shards, ``("encode_chunk", i)`` as a process starts chunk i)
to ``on_step``, ``None`` unless a test installs a hook there (``tests/fault_runner.py`` kills the job at
a chosen point). The local engine hands the driver's ``on_step`` to its workers as they start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_SINK: list[Any] = []  # [] or [a function of the bytes, or a shared counter]
# a test's hook, called as on_step(step, n) by step_done; None (nothing happens) in production
on_step: Callable[[str, int], None] | None = None


def step_done(step: str, n: int) -> None:
    """Tell ``on_step`` (a test's hook, if one is installed) that ``step`` has reached point ``n``."""
    if on_step is not None:
        on_step(step, n)


def set_sink(sink: Callable[[int], None] | Any | None) -> None:
    """Where ``report`` goes from now on in this process: a function, a shared counter, or nowhere."""
    _SINK[:] = [] if sink is None else [sink]


def report(nbytes: int) -> None:
    """Add ``nbytes`` of input read to this process's sink, if it has one."""
    if not _SINK or not nbytes:
        return
    sink = _SINK[0]
    if callable(sink):
        sink(nbytes)
        return
    sink.value += nbytes  # a RawValue shared with the driver: for display only, so no lock
