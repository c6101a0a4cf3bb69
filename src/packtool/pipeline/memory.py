"""Encoded samples held in memory: pretokenized Parquet input skips the scratch chunks.

Through scratch chunks (``pipeline.chunks``) every token is moved twice: from the input into a chunk file,
then from the chunk into a pack. For pretokenized Parquet input on the local engine the driver instead
reads and checks the records itself, chunk by chunk as a worker would (``encode.encode_records``), and
keeps the encoded arrays in a ``MemoryStore``: views of the reader's and the encoder's Arrow buffers, one
part per read batch, never copied. The plan is made from their offsets, and the shards are gathered from
them by ``num_proc`` threads of the driver (``engines.local.thread_map``: a shard's time is mostly Arrow's
Parquet encoding and zstd, which run without the GIL), so no worker process is started either.

The output is the same bytes: the same chunk boundaries (``chunk_size`` records) decide the same
``loss_mask`` of a chunk (``chunks.chunk_parts``), the same records are checked, skipped and counted, and
the plan and the shards do not depend on where the tokens lie. A killed run resumes from the shards it
finished (``_work/shards/``); it reads the input again, which costs less than writing the chunks did.

The cost is memory: the encoded input is held whole, about 8 bytes a token (9 with a ``loss_mask``) and
20 a sample, where the scratch chunks kept the writers' memory flat. So a run holds it only when
``memory_store_bytes`` (from the Parquet footers) fits in ``MEMORY_FRACTION`` of this machine's memory
and in half of the memory available as it starts; larger inputs, other inputs (text, JSON Lines,
``save_to_disk``, the Hub), a ``module:callable`` encoder and the Ray engine go through the scratch
chunks. ``PACKTOOL_MEMORY_STORE_BYTES`` sets the limit in bytes instead (0: always the scratch chunks).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq

from packtool.errors import ConfigError
from packtool.options import PackOptions
from packtool.pipeline.chunks import ChunkStore, chunk_parts, labels_rule
from packtool.pipeline.encode import RunSpec, chunk_records, chunked, encode_records
from packtool.pipeline.policy_chunks import policy_chunk
from packtool.plugins import is_plugin_spec
from packtool.readers.base import SourceBatch
from packtool.readers.inputs import expand_inputs
from packtool.storage.scratch import Scratch, as_scratch
from packtool.threads import prefetch

MEMORY_STORE_ENV = "PACKTOOL_MEMORY_STORE_BYTES"
MEMORY_FRACTION = 4  # the encoded input is held in memory when it takes at most a quarter of it
BYTES_PER_SAMPLE = 20  # offsets (int64), rows (int64) and source_ids (int32)
TOKEN_FIELDS = ("input_ids", "labels", "loss_mask")


def memory_store_bytes(options: PackOptions, sample_format: str) -> int | None:
    """Bytes a ``MemoryStore`` of this run's encoded input would take, from the Parquet footers (tokens
    as the input holds them, before an ``attention_mask`` strips any); ``None`` when the run cannot hold
    it (not pretokenized Parquet on the local engine with packtool's own encoder)."""
    if (
        options.running.engine != "local"
        or sample_format != "pretokenized"
        or is_plugin_spec(options.encoding.tokenizer)
    ):
        return None
    total = 0
    for kind, source, _ in expand_inputs(options.reading.inputs, options.reading.files):
        if kind != "parquet":
            return None
        try:
            md = pq.ParquetFile(source).metadata
        except Exception:  # the reader names a damaged file
            return None
        names = md.schema.to_arrow_schema().names
        per_token = 8 + (1 if "loss_mask" in names else 0)
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            tokens = max(
                (
                    rg.column(j).num_values
                    for j in range(rg.num_columns)
                    if rg.column(j).path_in_schema.split(".")[0] in TOKEN_FIELDS
                ),
                default=0,
            )
            total += tokens * per_token + rg.num_rows * BYTES_PER_SAMPLE
    return total


def memory_limit() -> int:
    """Bytes the encoded input may take in memory: ``PACKTOOL_MEMORY_STORE_BYTES`` if set, else
    ``1 / MEMORY_FRACTION`` of this machine's memory, and at most half of what is available now (other
    jobs' memory counts); 0 where neither is known."""
    value = os.environ.get(MEMORY_STORE_ENV, "").strip()
    if value:
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{MEMORY_STORE_ENV} must be a number of bytes, got {value!r}") from None
    try:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MEMORY_FRACTION
    except (ValueError, OSError, AttributeError):
        return 0
    available = _available_bytes()
    return limit if available is None else min(limit, available // 2)


def _available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (Linux), else ``None``."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def use_memory_store(options: PackOptions, sample_format: str) -> bool:
    """Whether this run holds its encoded input in memory instead of scratch chunks (module docstring)."""
    need = memory_store_bytes(options, sample_format)
    return need is not None and need <= memory_limit()


@dataclass
class MemoryStore(ChunkStore):
    """A ``ChunkStore`` whose chunks are arrays in this process's memory: ``units[c]`` holds what chunk
    ``c``'s files would (``input_ids``, ``labels``, ``loss_mask`` if any, ``offsets`` from 0, ``rows``,
    ``source_ids``; ``origin`` for packs of a custom policy) and ``metas[c]`` its meta. Every gather and
    lookup of ``ChunkStore`` works on it unchanged; ``scratch`` is the run's, for the shard records."""

    units: list[dict[str, np.ndarray]] = field(default_factory=list)

    _begins: np.ndarray | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.max_open = sys.maxsize  # nothing to open: every chunk is at hand
        self._begins = None
        super().__post_init__()

    def sample_begins(self, chunk: np.ndarray, sample: np.ndarray) -> np.ndarray:
        if self._begins is None:  # every sample's start in its part, 8 bytes a sample: one lookup
            self._begins = np.concatenate([u["offsets"][:-1] for u in self.units] or [np.zeros(0, np.int64)])
        return self._begins[sample]

    def arrays(self, c: int) -> dict[str, np.ndarray]:
        return self.units[c]

    def offsets(self, c: int) -> np.ndarray:
        return self.units[c]["offsets"]

    def _small(self, c: int, name: str) -> np.ndarray:
        return self.units[c][name]

    def release(self, c: int) -> None:
        pass

    def append_packs(self, packs: list[dict[str, np.ndarray]]) -> np.ndarray:
        """Keep packs made by a custom ``pack_selected_samples`` as one more chunk (in memory); returns
        their new sample numbers, as ``ChunkStore.append_packs`` does."""
        first = self.num_samples
        arrays, meta = policy_chunk(packs, self.labels_rule)
        self.units.append(arrays)
        self.metas.append({"index": len(self.metas), **meta})
        self.__post_init__()
        return first + np.arange(meta["num_samples"], dtype=np.int64)


def encode_in_memory(
    spec: RunSpec,
    options: PackOptions,
    batches: Iterator[SourceBatch],
    scratch: Scratch,
    on_chunk: Callable[[dict, bool], None] = lambda meta, new: None,
) -> tuple[MemoryStore, list[dict]]:
    """Read and encode ``batches`` in this process, in chunks of ``chunk_size`` records as the workers
    would; returns the ``MemoryStore`` of the encoded samples and every chunk's meta, in order (what
    ``encode.encode_to_chunks`` returns, with nothing written). ``on_chunk(meta, True)`` is called as each
    chunk is done."""
    units: list[dict[str, np.ndarray]] = []
    unit_metas: list[dict] = []
    metas = []
    # a thread reads the next chunk's rows (Arrow, without the GIL) while this one is encoded
    loaded = prefetch(
        ((pieces, _load(pieces)) for pieces in chunked(batches, chunk_records(options, spec.sample_format))),
        depth=2,
    )
    start = 0  # input rows before the chunk (as a scratch chunk's meta records it)
    for index, (pieces, records) in enumerate(loaded):
        kept, encoded, extra = encode_records(spec, records)
        extra["input_rows"] = sum(p.num_rows for p in pieces)
        extra["input_start"], start = start, start + extra["input_rows"]
        parts, meta = chunk_parts(kept, encoded, labels_rule(options))
        meta = {"index": index, **meta, **extra}
        rule = {k: meta[k] for k in ("labels_rule", "labels_follow_rule") if k in meta}
        for part in parts:
            unit_metas.append(
                {
                    "index": len(units),
                    "num_samples": len(part["offsets"]) - 1,
                    "has_loss_mask": "loss_mask" in part,
                    "sources": meta["sources"],
                    "row_kinds": meta["row_kinds"],
                    **rule,
                }
            )
            units.append(part)
        metas.append(meta)
        on_chunk(meta, True)
    return MemoryStore(as_scratch(scratch), unit_metas, units=units), metas


def _load(pieces: list[SourceBatch]) -> list[SourceBatch]:
    """The records of a chunk's pieces (``ParquetRows`` read here; errors are raised where they are used)."""
    return [b for piece in pieces for b in piece.load()]
