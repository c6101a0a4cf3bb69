"""Engines decide who runs the pipeline's steps; the steps themselves do not change.

``make_engine(options)`` returns an object with ``map(fn, tasks) -> iterator of results in task order``,
``workers`` (tasks run at once) and ``close()``: ``LocalEngine`` (``engine: local``, a process pool) or
``RayEngine`` (``engine: ray``, Ray tasks on a local Ray or the cluster at ``ray_address``; needs the
``packtool[ray]`` extra). A task carries everything it needs (``pipeline.encode.RunSpec``), so no worker
is set up in advance.
"""

from __future__ import annotations

import glob
import os

from packtool.errors import ConfigError
from packtool.options import PackOptions
from packtool.pipeline.engines.local import LocalEngine

__all__ = ["LocalEngine", "make_engine", "may_need_workers", "resolve_num_proc"]

# below it one process, for inputs that need worker processes: starting them and moving the chunks
# between them costs more than the second core saves (docs/performance.md, "Default --num-proc")
SMALL_INPUT_BYTES = 48 << 20


def resolve_num_proc(options: PackOptions) -> int:
    """``options.running.num_proc``, or when unset the cores this process may use (its CPU affinity), or 1 for
    local inputs under ``SMALL_INPUT_BYTES`` in all that need worker processes (``may_need_workers``:
    pretokenized Parquet is written by the driver's threads, which cost nothing to start). (Sized with
    ``os`` alone: the CLI asks before it imports the pipeline, so that the workers' forkserver starts
    first.)"""
    if options.running.num_proc is not None:
        return options.running.num_proc
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not may_need_workers(options):
        return cores
    size = 0
    for spec in options.reading.inputs:
        if spec.startswith("hf:"):
            return cores  # a Hub dataset: its size is not known here
        for path in _paths(spec):
            if os.path.isdir(path):
                size += sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
            elif os.path.isfile(path):
                size += os.path.getsize(path)
        if size >= SMALL_INPUT_BYTES:
            return cores
    return 1


def may_need_workers(options: PackOptions) -> bool:
    """False when a local run will most likely not start worker processes: every input is a Parquet
    file and no tokenizer is given, so the input can only be pretokenized, which the driver reads and
    writes itself when it fits in memory (``pipeline.memory``). The CLI then does not start the workers'
    forkserver ahead of time (a run that makes a pool after all starts it then). Decided with ``os`` alone,
    as ``resolve_num_proc`` is; a directory counts as needing workers."""
    if options.running.engine != "local" or options.encoding.tokenizer:
        return True
    for spec in options.reading.inputs:
        if spec.startswith("hf:"):
            return True
        paths = _paths(spec)
        if not paths or not all(p.endswith(".parquet") and os.path.isfile(p) for p in paths):
            return True
    return False


def _paths(spec: str) -> list[str]:
    """The local paths an input names: itself if it exists, else what it matches as a glob."""
    return [spec] if os.path.lexists(spec) else glob.glob(spec)


def make_engine(options: PackOptions):
    if options.running.engine == "local":
        return LocalEngine(resolve_num_proc(options))
    if options.running.engine == "ray":
        try:  # ray is an optional extra (packtool[ray]): imported only by a run that asks for it
            from packtool.pipeline.engines.ray import RayEngine
        except ImportError as e:
            if e.name != "ray":
                raise
            raise ConfigError("--engine ray needs Ray: pip install 'packtool[ray]'") from None
        return RayEngine(options.running.ray.ray_address, resolve_num_proc(options))
    raise ConfigError(f"engine must be 'local' or 'ray', got {options.running.engine!r}")
