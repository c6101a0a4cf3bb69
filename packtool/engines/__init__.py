"""Engines decide who runs the pipeline's steps; the steps themselves do not change.

``make_engine(config, initializer, initargs)`` returns an object with ``map(fn, tasks) -> iterator of
results in task order`` and ``close()``: ``LocalEngine`` (``engine: local``, a process pool) or
``RayEngine`` (``engine: ray``, Ray tasks on a local Ray or the cluster at ``ray_address``; needs the
``packtool[ray]`` extra).
"""

from __future__ import annotations

from collections.abc import Callable

from packtool.config import PackConfig
from packtool.engines.local import LocalEngine
from packtool.errors import ConfigError

__all__ = ["LocalEngine", "make_engine"]


def make_engine(config: PackConfig, initializer: Callable[..., None] | None = None, initargs: tuple = ()):
    if config.engine == "local":
        return LocalEngine(config.num_proc, initializer, initargs)
    if config.engine == "ray":
        from packtool.engines.ray_engine import RayEngine

        return RayEngine(config.ray_address, config.num_proc, initializer, initargs)
    raise ConfigError(f"engine must be 'local' or 'ray', got {config.engine!r}")
