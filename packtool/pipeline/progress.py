"""Bytes of input read by the encoding, reported as it goes, for the ``encode`` progress bar.

The encode step reports after each piece of input it has read and encoded (a range of about 2,048 lines
or files: ``readers.piece_bytes``) through ``report(nbytes)``, wherever it runs. In the driver
(``num_proc == 1``) the sink is a function that moves the bar at once; in a local pool's worker it is a
counter shared with the driver (``multiprocessing.RawValue``, given to each worker as it starts), which the
driver reads while it waits for results (``LocalEngine.on_wait``). Elsewhere (Ray) there is no sink and
the bar moves as each chunk is finished. Nothing here changes what is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_SINK: list[Any] = []  # [] or [a function of the bytes, or a shared counter]


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
