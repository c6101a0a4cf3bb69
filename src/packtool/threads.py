"""A background thread that computes items ahead of their consumer: ``prefetch``.

Generic (no format or pipeline knowledge): the Parquet writer overlaps gathering tokens with Arrow's
compression through it, the in-memory pipeline overlaps loading chunks.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def prefetch(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """Yield ``items`` in order while a background thread computes up to ``depth`` of them ahead.

    For a pipeline whose two halves leave the GIL to each other: the Parquet writer encodes and compresses
    row group ``i`` in Arrow's C++ (no GIL) while the thread gathers row group ``i + 1``'s tokens. An
    exception raised by ``items`` is raised here, at the item it replaced. When the consumer stops early
    (or fails), the thread is told to stop and is joined before this generator returns.

    >>> list(prefetch(iter(range(5)), depth=2))
    [0, 1, 2, 3, 4]
    """
    done = object()
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        slots.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put((done, None))
        except BaseException as e:  # handed to the consumer, raised there
            slots.put((done, e))

    thread = threading.Thread(target=produce, name="packtool-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = slots.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                slots.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)
