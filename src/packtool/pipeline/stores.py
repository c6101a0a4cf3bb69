"""Where a pack run keeps its encoded samples between encode and write, chosen once per run (``open_store``).

Two stores do the same three things for the driver (``run._run``), so the driver has no branch on which:

* ``encode(records, on_chunk)``: encode the input in chunks of ``chunk_size`` records; afterwards
  ``metas`` holds every chunk's meta in order and ``chunks`` the ``ChunkStore`` the plan reads lengths
  from and the writers gather packs from;
* ``write_shards(tasks)``: write the shards of ``write.ShardTask`` tasks, entries in task order;
* ``resumed_note(shards)``: what a resumed run says it kept; ``resume_notes()``: what it found damaged
  (scratch chunks whose arrays do not give their digest, encoded again).

``ScratchChunks`` (``pipeline.chunks``): the engine's workers encode the chunks into the scratch directory
and write the shards from them; a resumed run keeps the chunks a killed attempt finished.
``InMemory`` (``pipeline.memory``): the driver encodes pretokenized Parquet into a ``MemoryStore`` and
``num_proc`` threads of it write the shards; a resumed run reads the input again. Both give the same
bytes (the same chunk boundaries, plan and gathers).

Example::

    store = open_store(spec, options, sample_format, work, engine, resumed=False)
    store.encode(records, on_chunk)
    lengths = store.chunks.lengths()  # int64 [num_samples]
    entries = list(store.write_shards(tasks))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from packtool.manifest import ShardEntry
from packtool.options import PackOptions
from packtool.pipeline.chunks import ChunkStore, chunk_intact, chunk_name, read_chunk_meta
from packtool.pipeline.encode import RunSpec, encode_to_chunks
from packtool.pipeline.engines.local import thread_map
from packtool.pipeline.memory import encode_in_memory, use_memory_store
from packtool.pipeline.write import ShardTask, write_shard
from packtool.readers.base import SourceBatch
from packtool.storage.scratch import Scratch, as_scratch

OnChunk = Callable[[dict, bool], None]  # (a chunk's meta, encoded now rather than kept from a killed run)


class EncodedStore(Protocol):
    """What the driver needs from where the encoded samples lie (module docstring)."""

    metas: list[dict]
    chunks: ChunkStore

    def encode(self, records: Iterator[SourceBatch], on_chunk: OnChunk) -> None: ...

    def write_shards(self, tasks: Iterable[ShardTask]) -> Iterator[ShardEntry]: ...

    def resumed_note(self, shards: str) -> str: ...

    def resume_notes(self) -> list[str]: ...


class ScratchChunks:
    """Encoded chunks in the scratch directory ``work``, encoded and read by ``engine``'s workers."""

    def __init__(
        self, spec: RunSpec, options: PackOptions, work: Scratch, engine: Any, resumed: bool
    ) -> None:
        self.spec, self.options, self.work, self.engine = spec, options, work, engine
        found = _chunk_metas(work) if resumed else {}
        self.damaged = [i for i, m in found.items() if not chunk_intact(work, m, i)]
        self.done = {i: _without_digest(m) for i, m in found.items() if i not in self.damaged}
        for i in self.damaged:  # not what was written (a disk fault, an edit): encode it again
            _remove(work, chunk_name(i))
        self.metas: list[dict] = []
        self.chunks: ChunkStore

    def encode(self, records: Iterator[SourceBatch], on_chunk: OnChunk) -> None:
        self.metas = encode_to_chunks(
            self.spec, self.options, records, self.work, self.engine, on_chunk, self.done
        )
        self.chunks = ChunkStore(self.work, self.metas)

    def write_shards(self, tasks: Iterable[ShardTask]) -> Iterator[ShardEntry]:
        return self.engine.map(_write_shard_task, tasks)

    def resumed_note(self, shards: str) -> str:
        return f"resumed: {len(self.done)} of {len(self.metas)} chunks and {shards}"

    def resume_notes(self) -> list[str]:
        if not self.damaged:
            return []
        return [
            f"{len(self.damaged)} scratch chunk(s) of the interrupted run are not what was encoded (chunk "
            f"{self.damaged[0]}: its meta or its arrays are damaged or do not give their digests, or an "
            "image file changed since); encoding them again"
        ]


class InMemory:
    """Encoded samples held in this process (``memory.MemoryStore``), written by ``num_proc`` threads."""

    def __init__(self, spec: RunSpec, options: PackOptions, work: Scratch) -> None:
        self.spec, self.options, self.work = spec, options, work
        self.metas: list[dict] = []
        self.chunks: ChunkStore

    def encode(self, records: Iterator[SourceBatch], on_chunk: OnChunk) -> None:
        self.chunks, self.metas = encode_in_memory(self.spec, self.options, records, self.work, on_chunk)

    def write_shards(self, tasks: Iterable[ShardTask]) -> Iterator[ShardEntry]:
        workers = self.options.running.num_proc
        return thread_map(lambda task: write_shard(task, store=self.chunks), tasks, workers)

    def resumed_note(self, shards: str) -> str:
        return f"resumed: {shards} (the input was read into memory again)"

    def resume_notes(self) -> list[str]:
        return []  # nothing kept from the killed run: the input is read again


def open_store(
    spec: RunSpec, options: PackOptions, sample_format: str, work: Scratch, engine: Any, resumed: bool
) -> EncodedStore:
    """The run's store: in memory when the input is pretokenized Parquet that fits
    (``memory.use_memory_store``), else scratch chunks."""
    work = as_scratch(work)
    if use_memory_store(options, sample_format):
        return InMemory(spec, options, work)
    return ScratchChunks(spec, options, work, engine, resumed)


def _write_shard_task(task: ShardTask) -> ShardEntry:
    return write_shard(task)


def _chunk_metas(work: Scratch) -> dict[int, object]:
    """The ``meta.json`` of each chunk a killed attempt of this run finished, by index (as read: None or
    anything else where it is not a chunk's whole meta, ``chunks.chunk_intact`` tells); locally, a
    ``meta.json`` that is no regular file (a FIFO) counts too, to be found damaged."""
    names = set(work.names())
    if work.local.is_dir():
        names |= {p.relative_to(work.local).as_posix() for p in work.local.glob("chunk-*/meta.json")}
    metas = {}
    for name in sorted(names):
        folder, _, file = name.partition("/")
        if file == "meta.json" and folder.startswith("chunk-") and folder[6:].isdigit():
            metas[int(folder[6:])] = read_chunk_meta(work, int(folder[6:]))
    return metas


def _without_digest(meta: dict) -> dict:
    """A kept chunk's meta as the run that wrote it returned it (``meta_digest`` is the file's)."""
    return {k: v for k, v in meta.items() if k != "meta_digest"}


def _remove(work: Scratch, name: str) -> None:
    """A damaged chunk removed, here and in the store (a link put in its folder's place too)."""
    if work.path(name).is_symlink():
        work.path(name).unlink()
    work.remove(name)
