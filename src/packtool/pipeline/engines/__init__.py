"""Engines decide who runs the pipeline's steps; the steps themselves do not change.

``make_engine(running, num_proc)`` returns an object with ``map(fn, tasks) -> iterator of results in
task order``, ``workers`` (tasks run at once) and ``close()``: ``LocalEngine`` (``engine: local``, a
process pool) or
``RayEngine`` (``engine: ray``, Ray tasks on a local Ray or the cluster at ``ray_address``; needs the
``packtool[ray]`` extra). A task carries everything it needs (``pipeline.encode.RunSpec``), so no worker
is set up in advance.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from typing import Any

from packtool.errors import ConfigError
from packtool.pipeline.engines.local import LocalEngine
from packtool.pipeline.options import RunningOptions

__all__ = ["LocalEngine", "make_engine", "may_need_workers", "resolve_num_proc", "worker_preload"]

# below it one process, for inputs that need worker processes: starting them and moving the chunks
# between them costs more than the second core saves (docs/performance.md, "Default --num-proc")
SMALL_INPUT_BYTES = 48 << 20


def resolve_num_proc(values: Mapping[str, Any]) -> int:
    """``num_proc`` of the flat option ``values`` (``PackOptions.to_dict()``, or the CLI's values before
    it builds the options), or when unset the cores this process may use (its CPU affinity), or 1 for
    local inputs under ``SMALL_INPUT_BYTES`` in all that need worker processes (``may_need_workers``:
    pretokenized Parquet is written by the driver's threads, which cost nothing to start). (Sized with
    ``os`` alone: the CLI asks before it imports the pipeline, so that the workers' forkserver starts
    first.)"""
    if values.get("num_proc") is not None:
        return values["num_proc"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not may_need_workers(values):
        return cores
    size = 0
    for spec in values.get("inputs") or []:
        if spec.startswith("hf:"):
            return cores  # a Hub dataset: its size is not known here
        for path in _paths(spec):
            if os.path.isdir(path):
                files = (os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)
                size += sum(os.path.getsize(f) for f in files if os.path.isfile(f))  # (a broken link: 0)
            elif os.path.isfile(path):
                size += os.path.getsize(path)
        if size >= SMALL_INPUT_BYTES:
            return cores
    return 1


def may_need_workers(values: Mapping[str, Any]) -> bool:
    """False when a local run will most likely not start worker processes: every input is a Parquet
    file and no tokenizer is given, so the input can only be pretokenized, which the driver reads and
    writes itself when it fits in memory (``pipeline.memory``). The CLI then does not start the workers'
    forkserver ahead of time (a run that makes a pool after all starts it then). Decided with ``os`` alone,
    as ``resolve_num_proc`` is; a directory counts as needing workers."""
    if values.get("engine", "local") != "local" or values.get("tokenizer"):
        return True
    for spec in values.get("inputs") or []:
        if spec.startswith("hf:"):
            return True
        paths = _paths(spec)
        if not paths or not all(p.endswith(".parquet") and os.path.isfile(p) for p in paths):
            return True
    return False


def _paths(spec: str) -> list[str]:
    """The local paths an input names: itself if it exists, else what it matches as a glob."""
    return [spec] if os.path.lexists(spec) else glob.glob(spec)


def worker_preload(values: Mapping[str, Any]) -> tuple[str, ...]:
    """What a local run's worker processes import before their first task besides the pipeline, from the
    flat option ``values`` (with ``os`` alone, as ``resolve_num_proc``): a vision run's encoder (Pillow,
    transformers: seconds to import), imported once by the forkserver (the driver of such a run never
    imports them: ``pipeline.run.start_run``)."""
    vision = values.get("processor") is not None or values.get("sample_format") == "vision"
    return ("packtool.encoders.vision",) if vision else ()


def make_engine(running: RunningOptions, num_proc: int, preload: tuple[str, ...] = ()):
    """The engine ``running.engine`` names, running ``num_proc`` tasks at once (``preload``: what a local
    engine's workers import first, ``worker_preload``)."""
    if running.engine == "local":
        return LocalEngine(num_proc, preload)
    if running.engine == "ray":
        try:  # ray is an optional extra (packtool[ray]): imported only by a run that asks for it
            from packtool.pipeline.engines.ray import RayEngine
        except ImportError as e:
            if e.name != "ray":
                raise
            raise ConfigError("--engine ray needs Ray: pip install 'packtool[ray]'") from None
        return RayEngine(running.ray.ray_address, num_proc)
    raise ConfigError(f"engine must be 'local' or 'ray', got {running.engine!r}")
