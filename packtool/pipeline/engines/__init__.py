"""Engines decide who runs the pipeline's steps; the steps themselves do not change.

``make_engine(config)`` returns an object with ``map(fn, tasks) -> iterator of results in task order``,
``workers`` (tasks run at once) and ``close()``: ``LocalEngine`` (``engine: local``, a process pool) or
``RayEngine`` (``engine: ray``, Ray tasks on a local Ray or the cluster at ``ray_address``; needs the
``packtool[ray]`` extra). A task carries everything it needs (``pipeline.encode.RunSpec``), so no worker
is set up in advance.
"""

from __future__ import annotations

from packtool.config import PackConfig
from packtool.errors import ConfigError
from packtool.pipeline.engines.local import LocalEngine

__all__ = ["LocalEngine", "make_engine"]


def make_engine(config: PackConfig):
    if config.engine == "local":
        return LocalEngine(config.num_proc)
    if config.engine == "ray":
        try:  # ray is an optional extra (packtool[ray]): imported only by a run that asks for it
            from packtool.pipeline.engines.ray import RayEngine
        except ImportError as e:
            if e.name != "ray":
                raise
            raise ConfigError("--engine ray needs Ray: pip install 'packtool[ray]'") from None
        return RayEngine(config.ray_address, config.num_proc)
    raise ConfigError(f"engine must be 'local' or 'ray', got {config.engine!r}")
