"""``RayEngine``: runs the pipeline's encode and write steps as Ray tasks, on one machine or a cluster.

It has ``LocalEngine``'s interface, ``map(fn, tasks)`` yielding results in task order with a bounded number
of tasks in flight (``2 x`` the cluster's CPUs), so the pipeline does not change with the engine and the
output bytes do not either: chunk and shard boundaries come from the config, never from the cluster.

The pipeline hands every input out as ranges that the task reads itself: Parquet as row ranges
(``ParquetRows``), JSON Lines and ``.txt`` files as line ranges (``JsonlLines``, ``TextLines``: the driver
scans the file for newlines only, 8 bytes a line travel), directories of ``.txt`` files as file names
(``TextFiles``) and Hugging Face datasets on disk as row ranges of their Arrow files (``HfRows``). Their
data never goes through the driver and error messages keep the exact row or line. Only JSON arrays (one
document, not splittable) and datasets that are not exactly their Arrow files (an indices mapping, a
sliced split) are still parsed by the driver, their Arrow batches travelling in the task arguments (Ray's
object store). Why not Ray Data's ``read_*`` + ``map_batches``: its blocks carry no row numbers and follow
the file layout, while packtool's output bytes rest on chunks of exactly ``chunk_size`` records and its
errors name the file and row (docs/scaling.md, "Ray engine", has the measurements).

* ``ray_address`` given: join that cluster (``ray.init(address=...)``); packtool's own code is shipped with
  the job (``runtime_env py_modules``), so the cluster needs only packtool's dependencies. Inputs, the
  tokenizer and the output must be where every node reaches them: in an object store (URLs: the nodes
  then share nothing but the store; each reaches it with its own credentials, or the ``--storage-options``
  that travel with the job), or on a shared filesystem, where relative paths are taken from the driver's
  working directory, which every task enters.
* no address: start a local Ray with ``num_proc`` CPUs and no dashboard, shut down at the end.
* a Ray already initialized in this process (a notebook, a test) is used as it is.

A Ray worker process builds a run's state on its first task of that run (``pipeline.encode.worker``), as
local workers do. A task's ``PacktoolError`` (bad input naming its file and row) is raised again in the
driver as itself, so errors read the same with every engine. A worker or node that dies under a task (the
out-of-memory killer, a node lost: ``WorkerCrashedError``, ``NodeDiedError``, ...) is ``WorkerDied``
naming the step and what Ray says, as the local engine's is: the run keeps its finished work
for the same command to resume.

Example::

    with RayEngine(None, 2) as engine:
        results = list(engine.map(fn, tasks))
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import ray

from packtool.errors import ConfigError, PacktoolError, WorkerDied
from packtool.pipeline.engines.local import TASK_NAMES
from packtool.storage.scratch import set_node

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # packtool/, shipped to a cluster's workers


def _call(cwd: str, fn: Callable, task: Any) -> Any:
    """In a Ray worker: enter the driver's working directory (relative input, tokenizer and output paths
    mean the same there as in the driver; Ray workers serve one job), name the node it runs on (a scratch
    mirrored to a store keeps a local folder per node: nodes meet only in the store), then ``fn(task)``."""
    if os.getcwd() != cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    set_node(f"ray-{ray.get_runtime_context().get_node_id()[:16]}")
    return fn(task)


# what ray.get raises when the worker or node running a task died under it
DIED = (
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.LocalRayletDiedError,
    ray.exceptions.OutOfMemoryError,
    ray.exceptions.ObjectLostError,  # (OwnerDiedError among them: the result's holder died)
)


def _died(e: Exception) -> str:
    """What Ray says of a dead worker or node, on one line: its kind and first sentence.

    >>> _died(ray.exceptions.WorkerCrashedError())
    'WorkerCrashedError: The worker died unexpectedly while executing this task'
    """
    first = " ".join(str(e).split()).split(". ")[0]
    return f"{type(e).__name__}: {first[:200]}"


class RayEngine:
    name = "ray"

    def __init__(self, address: str | None = None, num_proc: int = 1) -> None:
        self._started = False
        if not ray.is_initialized():
            quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
            if address:
                try:
                    ray.init(
                        address=address,
                        runtime_env={"py_modules": [str(PACKAGE_DIR)]},
                        **quiet,
                    )
                except (ConnectionError, RuntimeError, ValueError) as e:
                    raise ConfigError(f"ray_address {address}: cannot join the Ray cluster: {e}") from None
            else:
                ray.init(address="local", num_cpus=num_proc, include_dashboard=False, **quiet)
            self._started = True
        self._cwd = os.getcwd()
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_call)
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))  # how many tasks run at once
        self.max_in_flight = 2 * self.workers

    def __enter__(self) -> RayEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def map(self, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        """Apply ``fn`` to every task as a Ray task; results come back in task order."""
        in_flight: deque = deque()
        submit = self._remote.remote
        try:
            for task in tasks:
                in_flight.append(submit(self._cwd, fn, task))
                if len(in_flight) >= self.max_in_flight:
                    yield self._get(in_flight.popleft(), fn)
            while in_flight:
                yield self._get(in_flight.popleft(), fn)
        finally:
            for ref in in_flight:
                ray.cancel(ref, force=True)

    def _get(self, ref: Any, fn: Callable) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, PacktoolError):
                raise e.cause from None
            raise
        except DIED as e:  # the process (or its node) under the task is gone: not the task's own error
            step = TASK_NAMES.get(fn.__name__, fn.__name__)
            raise WorkerDied(f"a Ray worker died while {step} ({_died(e)})") from None

    def close(self) -> None:
        if self._started:
            ray.shutdown()
            self._started = False
