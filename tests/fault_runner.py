"""Run the ``packtool`` CLI with a fault injected at a chosen point: a real SIGKILL, for the resume tests.

    python -m tests.fault_runner STEP:N -- pack INPUTS ... -o OUT

kills the job's driver once the run reaches point ``N`` of ``STEP`` (``pipeline.progress.step_done``):
``encode:N`` once N new chunks are encoded, ``write:N`` once N new shards are written. ``worker:N`` kills
instead the local pool's worker that starts encoding chunk N (index from 0), as the out-of-memory killer
would; the driver goes on and reports the dead worker. Nothing in packtool reads the environment for
this: the hook is installed here, in ``progress.on_step``, and the local engine hands it to its workers
(they unpickle ``kill_at`` from this module by name).
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
import sys

from packtool.cli import main
from packtool.pipeline import progress


def kill_at(spec: str, step: str, n: int) -> None:
    """``progress.on_step``: SIGKILL this process when ``step:n`` matches ``spec`` (see the module doc)."""
    if spec.startswith("worker:"):
        hit = step == "encode_chunk" and spec == f"worker:{n}" and mp.parent_process() is not None
    else:
        hit = spec == f"{step}:{n}"
    if hit:
        os.kill(os.getpid(), signal.SIGKILL)


def run(argv: list[str]) -> None:
    """``argv`` is ``SPEC -- ARGS...``: install the hook for SPEC, then run ``packtool ARGS``."""
    if len(argv) < 2 or argv[1] != "--":
        sys.exit("usage: python -m tests.fault_runner STEP:N -- ARGS...")
    progress.on_step = functools.partial(kill_at, argv[0])
    main(argv[2:], prog_name="packtool")


if __name__ == "__main__":
    run(sys.argv[1:])
