"""Stream a packtool output directory into training: ``PackedDataset`` + ``get_loader``.

Example::

    from packtool.loader import PackedDataset, get_loader

    ds = PackedDataset("out/", batch_size=8, shuffle=True, seed=0, mask="flex")
    loader = get_loader(ds, num_workers=2)
    for batch in loader:                      # PackedBatch
        batch = batch.to("cuda")              # the mask is built here, on the device
        ...
    state = loader.state_dict()               # save with the checkpoint
    loader = get_loader(PackedDataset("out/", batch_size=8, shuffle=True, seed=0, mask="flex"), num_workers=3)
    loader.load_state_dict(state)             # continues with the next batch, nothing replayed

**The stream.** A *unit* is what a reader decodes at once: a Parquet row group (a whole shard for formats
without row groups). For epoch ``e`` the units are put in an order drawn from ``(seed, e)``; their packs,
in that order, form the epoch's sequence of ``P`` packs. Rank ``r`` of ``R`` takes the slice
``[S + r * M, S + (r + 1) * M)`` with ``M = (P // (R * B)) * B``, so every rank has the same number of full
batches; the ``P - R * M < R * B`` packs left over are left out of that epoch: the first ``S`` and the last
of the epoch's order, ``S`` drawn from ``(seed, e)`` in ``[0, P - R * M]`` when shuffling (0 otherwise), so
they differ from epoch to epoch even with one unit, and every unit stays contiguous. A rank's slice is cut
into ``lanes`` contiguous segments; lane ``l`` produces the rank's batches ``l, l + lanes, ...`` from its
segment, mixed by a shuffle buffer (each pack moves by less than ``shuffle_buffer`` places, drawn from
``(seed, e, r, l)``). Everything above is computed on pack indices only, before any data is read.

**Workers.** The DataLoader takes batch ``k`` of the stream from worker ``k % num_workers``; each worker
decodes only the units holding its batches' packs and drops a unit once its last pack is used. With
``num_workers == lanes`` (the default: ``get_loader`` sets ``lanes = max(1, num_workers)``) the workers read
disjoint units, every unit once per epoch in total.

**Resume.** The state is one global cursor: ``(epoch, batches consumed in it)`` plus ``lanes``. What may
change between save and restore: ``num_workers`` (and ``pin_memory``, ``prefetch_factor``, ``mask``, the
task encoder). What may not (``load_state_dict`` refuses): the data (``run_id``, pack count), ``seed``,
``batch_size``, ``world_size``, ``shuffle``, ``shuffle_buffer``; ``lanes`` is taken from the state, so the
stream continues exactly; with ``num_workers != lanes`` some units are decoded by more than one worker.

**Faults.** ``on_error="fail"`` (default) raises ``InputError`` naming the shard and row group when a unit
cannot be read (missing file, corrupt Parquet, wrong row count, a shard of another run).
``on_error="skip"`` drops that unit's packs from their batches and counts them in ``loader.stats``.
"""

from __future__ import annotations

import dataclasses
import io
import multiprocessing
import os
import pickle
import uuid
import warnings
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from packtool.errors import InputError, PacktoolError
from packtool.masks import SEQ_LENS_PAD, block_causal_mask, cu_seqlens_of, flex_block_mask
from packtool.parquet_pages import read_list_columns
from packtool.reading import FIXED_COLUMNS, list_arrays, load_manifest, table_arrays
from packtool.writers.chunks import ranges

MASKS = ("varlen", "dense", "flex")
ON_ERROR = ("fail", "skip")
STATE_VERSION = 1
PACK_COLUMNS = FIXED_COLUMNS  # the (N,) columns of a pack
WIDE_FIELDS = PACK_COLUMNS  # kept as stored (int32 / int8) on the host, widened to int64 by PackedBatch.to


class SkipSample(Exception):
    """Raise in ``encode_sample`` to drop a pack, or in ``batch`` / ``encode_batch`` to drop a batch.

    Dropped packs and batches are counted in ``loader.stats`` (``skipped_packs``, ``skipped_batches``).
    A dropped pack leaves its batch one pack shorter. Dropping whole batches gives ranks different batch
    counts, which hangs DDP: under ``torch.distributed`` prefer dropping packs.
    """


IgnoreSample = SkipSample  # Megatron-Energon's other name for it


# --- batching helpers --------------------------------------------------------------------------------
def _is_array(v: Any) -> bool:
    return isinstance(v, (np.ndarray, torch.Tensor))


def _torch_dtype(v: np.ndarray | torch.Tensor) -> torch.dtype:
    return v.dtype if isinstance(v, torch.Tensor) else torch.from_numpy(np.empty(0, dtype=v.dtype)).dtype


def _fill(out: torch.Tensor, values: Sequence[np.ndarray | torch.Tensor]) -> torch.Tensor:
    """Copy ``values[j]`` into ``out[j, :len]`` for every ``j`` (casting), one NumPy call when it can."""
    if not any(isinstance(v, torch.Tensor) for v in values):
        dst = out.numpy()
        if all(v.shape[0] == dst.shape[1] for v in values):
            np.stack(values, axis=0, out=dst, casting="unsafe")
        else:
            for j, v in enumerate(values):
                dst[j, : v.shape[0]] = v
        return out
    for j, v in enumerate(values):
        out[j, : v.shape[0]].copy_(torch.as_tensor(v))
    return out


def batch_stack(
    values: Sequence[np.ndarray | torch.Tensor], dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Stack same-shape arrays/tensors into one tensor ``(len(values), *shape)``, cast to ``dtype``.

    Example::

        >>> batch_stack([np.arange(3), np.arange(3)], torch.int64).shape
        torch.Size([2, 3])
    """
    dtype = dtype or _torch_dtype(values[0])
    return _fill(torch.empty((len(values), *values[0].shape), dtype=dtype), values)


def batch_pad_stack(
    values: Sequence[np.ndarray | torch.Tensor], pad_value: int | float = 0, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Stack 1-D (or leading-dim ragged) arrays, padding each to the longest with ``pad_value``.

    Example::

        >>> batch_pad_stack([np.array([3, 2, 1]), np.array([6])]).tolist()
        [[3, 2, 1], [6, 0, 0]]
    """
    dtype = dtype or _torch_dtype(values[0])
    longest = max(v.shape[0] for v in values)
    out = torch.empty((len(values), longest, *values[0].shape[1:]), dtype=dtype)
    out.fill_(pad_value)
    return _fill(out, values)


def batch_list(values: Sequence[Any]) -> list:
    """Keep values as a plain list (for strings, ints, dicts...)."""
    return list(values)


def default_batch(packs: list[dict]) -> dict[str, Any]:
    """The default ``batch`` stage: a dict with one entry per key of the packs.

    Arrays/tensors are stacked (pad-stacked when their lengths differ), keeping their dtype: ``input_ids``,
    ``labels``, ``position_ids`` int32 and ``loss_mask`` int8 ``(B, N)`` as stored (``PackedBatch.to``
    widens them to int64 on the device); ``seq_lens`` as int32 ``(B, max_seqs)`` padded with
    ``SEQ_LENS_PAD`` (0). Everything else becomes a list.
    """
    out: dict[str, Any] = {}
    for key in packs[0]:
        values = [p[key] for p in packs]
        if not all(_is_array(v) for v in values):
            out[key] = batch_list(values)
            continue
        dtype = torch.int32 if key == "seq_lens" else None
        if all(v.shape == values[0].shape for v in values):
            out[key] = batch_stack(values, dtype)
        else:
            out[key] = batch_pad_stack(values, SEQ_LENS_PAD if key == "seq_lens" else 0, dtype)
    return out


@dataclass
class PackedBatch:
    """One batch of ``B`` packs of ``N`` tokens.

    On the host (as the loader yields it) the token tensors keep the stored dtypes, half the bytes to move
    between processes and to the device; ``to(device)`` widens them to int64 there, as trainers expect:

    * ``input_ids``, ``labels``, ``position_ids``: ``(B, N)`` int32 on the host, int64 after ``to()``
      (``labels`` is ``-100`` where no loss);
    * ``seq_lens``: ``(B, max_seqs)`` int32, each row the pack's sequence lengths (the padding, if any, is
      the last one) then ``SEQ_LENS_PAD`` = 0; every row sums to ``N``;
    * ``cu_seqlens``: ``(T + 1,)`` int32 and ``max_seqlen`` (int): the ``T`` non-empty sequences of the
      batch flattened to ``B * N`` tokens, for varlen kernels (FlashAttention, TE THD);
    * ``loss_mask``: ``(B, N)`` int8 on the host, int64 after ``to()``; ``None`` when the data has none;
    * ``pack_index``: ``(B,)`` int64, each pack's index in the output directory (shard order);
    * ``mask``: which mask ``to()`` / ``build_mask()`` builds: ``"varlen"`` (none beyond ``cu_seqlens``),
      ``"dense"`` (``attention_mask``, bool ``[B, 1, N, N]``) or ``"flex"`` (``block_mask``, a
      ``flex_attention.BlockMask``).

    Example::

        >>> batch = next(iter(loader))  # doctest: +SKIP
        >>> batch.input_ids.dtype, batch.to("cuda").input_ids.dtype  # doctest: +SKIP
        (torch.int32, torch.int64)
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    loss_mask: torch.Tensor | None = None
    pack_index: torch.Tensor | None = None
    mask: str = "varlen"
    attention_mask: torch.Tensor | None = None
    block_mask: Any = None
    extra: dict = field(default_factory=dict)

    @property
    def packed_sequence_size(self) -> int:
        return self.input_ids.shape[1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def _map(self, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> PackedBatch:
        changes = {
            f.name: fn(f.name, getattr(self, f.name))
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **changes)

    def pin_memory(self) -> PackedBatch:
        """A copy with every tensor in pinned memory (``DataLoader(pin_memory=True)`` calls this)."""
        return self._map(lambda name, t: t.pin_memory())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        """A copy on ``device``, with the mask of kind ``self.mask`` built there.

        ``input_ids``, ``labels``, ``position_ids`` and ``loss_mask`` arrive as int64 (copied at their
        host dtype, widened on the device); the other tensors keep their dtype.
        """

        def move(name: str, t: torch.Tensor) -> torch.Tensor:
            t = t.to(device, non_blocking=non_blocking)
            return t.to(torch.int64) if name in WIDE_FIELDS else t

        moved = self._map(move)
        # built again on the device, not moved: BlockMask.to moves its block tensors but not the tensors
        # its mask_mod captured (the per-token sequence ids), which flex_attention would index on the host
        moved.block_mask = None
        return moved.build_mask()

    def build_mask(self) -> PackedBatch:
        """Build the ``dense`` or ``flex`` mask (if not built yet) on the batch's device; returns self."""
        if self.mask not in MASKS:
            raise ValueError(f"mask must be one of {', '.join(MASKS)}, got {self.mask!r}")
        n = self.packed_sequence_size
        if self.mask == "dense" and self.attention_mask is None:
            self.attention_mask = block_causal_mask(self.seq_lens, n)
        elif self.mask == "flex" and self.block_mask is None:
            self.block_mask = flex_block_mask(self.seq_lens, n)
        return self


# --- the epoch's order, from pack indices only -------------------------------------------------------
def epoch_plan(
    unit_sizes: np.ndarray,
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
    shuffle_buffer: int,
    rank: int,
    world_size: int,
    batch_size: int,
    lanes: int,
) -> np.ndarray:
    """The packs of each batch of ``rank`` in ``epoch``: int64 ``(batches_per_epoch, batch_size)``.

    Pack ``p`` is the ``p``-th pack of the output directory (shards in manifest order, units in order).
    Depends only on the arguments (see the module docstring for the construction).

    Example::

        >>> epoch_plan(np.array([4, 4]), epoch=0, seed=0, shuffle=False, shuffle_buffer=0, rank=0,
        ...            world_size=1, batch_size=2, lanes=1).tolist()
        [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    sizes = np.asarray(unit_sizes, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(sizes)])
    nb = int(first[-1]) // (world_size * batch_size)
    m = nb * batch_size
    order, skip = np.arange(len(sizes)), 0
    if shuffle:  # the unit order, and how many of the packs left over come off its head (the rest: its tail)
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(len(sizes))
        skip = int(rng.integers(0, int(first[-1]) - world_size * m + 1))
    mine = ranges(first[:-1][order], sizes[order])[skip + rank * m : skip + (rank + 1) * m]
    out = np.empty((nb, batch_size), dtype=np.int64)
    counts = np.maximum(0, -(-(nb - np.arange(lanes)) // lanes))  # batches of each lane
    seg = np.concatenate([[0], np.cumsum(counts)]) * batch_size
    for lane in range(lanes):
        packs = mine[seg[lane] : seg[lane + 1]]
        if shuffle and shuffle_buffer > 1 and len(packs):
            rng = np.random.default_rng([seed, epoch, rank, lane, 1])
            keys = np.arange(len(packs)) + rng.uniform(0, shuffle_buffer, len(packs))
            packs = packs[np.argsort(keys, kind="stable")]
        out[lane::lanes] = packs.reshape(-1, batch_size)
    return out


# --- reading units -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unit:
    """What one reader call decodes: part ``part`` (a row group) of shard ``shard`` with ``num_packs``."""

    shard: int
    part: int
    num_packs: int


def units_of(manifest: dict) -> list[Unit]:
    """The manifest's units in order: each shard's ``row_groups``, or the whole shard if it has none."""
    out = []
    for s, shard in enumerate(manifest["shards"]):
        parts = shard.get("row_groups") or [shard["num_packs"]]
        out.extend(Unit(s, p, int(k)) for p, k in enumerate(parts) if k > 0)
    return out


class _ParquetFiles:
    """Open ``ParquetFile`` handles (with a file descriptor for ``parquet_pages``), the least recently used
    closed past ``limit``."""

    def __init__(self, run_id: str | None, limit: int = 8) -> None:
        self.run_id, self.limit, self.open = run_id, limit, OrderedDict()

    def get(self, path: Path) -> tuple[Any, int]:
        import json

        import pyarrow.parquet as pq

        if path in self.open:
            self.open.move_to_end(path)
            return self.open[path]
        pf = pq.ParquetFile(path)
        meta = (pf.schema_arrow.metadata or {}).get(b"packtool")
        if self.run_id is not None and meta is not None:
            found = json.loads(meta).get("run_id")
            if found != self.run_id:
                raise ValueError(f"shard of run {found}, manifest is run {self.run_id}")
        self.open[path] = (pf, os.open(path, os.O_RDONLY))
        while len(self.open) > self.limit:
            os.close(self.open.popitem(last=False)[1][1])
        return self.open[path]

    def __del__(self) -> None:
        for _pf, fd in self.open.values():
            try:
                os.close(fd)
            except OSError:  # pragma: no cover
                pass


def read_parquet_unit(reader: _ParquetFiles, path: Path, unit: Unit, n: int, columns: list[str]) -> dict:
    """Row group ``unit.part`` of a Parquet shard as ``table_arrays`` (``(k, N)`` views + ragged seq_lens).

    Decoded from the pages by ``parquet_pages`` when the layout allows (packtool's own files), else by
    Arrow; both give the same arrays.
    """
    pf, fd = reader.get(path)
    parts = read_list_columns(pf, fd, unit.part, columns)
    if parts is None:
        table = pf.read_row_group(unit.part, columns=columns, use_threads=False)
        if table.num_rows != unit.num_packs:
            raise ValueError(f"{table.num_rows} packs, the manifest says {unit.num_packs}")
        return table_arrays(table, n)
    k = len(parts["seq_lens"][0]) - 1
    if k != unit.num_packs:
        raise ValueError(f"{k} packs, the manifest says {unit.num_packs}")
    return list_arrays(parts, k, n)


def read_tar_unit(run_id: str | None, path: Path, unit: Unit, n: int, columns: list[str]) -> dict:
    """A whole tar shard (tar shards have no row groups: one unit each), in ``table_arrays``' layout;
    a shard of another run than the manifest's (``run_id``) cannot be read, as for Parquet."""
    from packtool.writers.webdataset import read_tar_packs

    packs = list(read_tar_packs(path, n, run_id=run_id))
    if len(packs) != unit.num_packs:
        raise ValueError(f"{len(packs)} packs, the manifest says {unit.num_packs}")
    out = {
        name: np.stack([p[name] for p in packs])
        for name in columns
        if name != "seq_lens" and name in packs[0]
    }
    seq_lens = [p["seq_lens"] for p in packs]
    out["seq_lens_offsets"] = np.concatenate([[0], np.cumsum([len(s) for s in seq_lens])]).astype(np.int64)
    out["seq_lens"] = np.concatenate(seq_lens)
    return out


# One function per shard format: (opener state, path, unit, N, columns) -> arrays.
UNIT_READERS: dict[str, Callable] = {"parquet": read_parquet_unit, "webdataset": read_tar_unit}
_OPENERS: dict[str, Callable] = {
    "parquet": lambda manifest: _ParquetFiles(manifest.get("run_id")),
    "webdataset": lambda manifest: manifest.get("run_id"),
}

# Errors that mean "this unit cannot be read" (anything else is a bug and always raised); PacktoolError is
# what the tar reader raises for a damaged shard or one of another run.
_UNIT_ERRORS: tuple[type[BaseException], ...] = (
    OSError, ValueError, KeyError, IndexError, EOFError, PacktoolError,
)  # fmt: skip
try:  # pyarrow's own errors derive from these mostly, but not all
    import pyarrow as _pa

    _UNIT_ERRORS = (*_UNIT_ERRORS, _pa.ArrowException)
except ImportError:  # pragma: no cover
    pass


# --- the dataset -------------------------------------------------------------------------------------
PARCEL_BATCHES = 4  # batches a DataLoader worker sends at once (one DataLoader item)


@dataclass
class _Item:
    """One batch of the stream: its position, the batch (or None if dropped) and what was counted."""

    epoch: int
    index: int
    batch: Any
    counts: dict
    bad_units: list


@dataclass
class _Parcel:
    """What a worker sends in one DataLoader item: its next ``PARCEL_BATCHES`` batches (fewer at the end).

    Every DataLoader item costs the main process a fixed amount (index and result queues, their feeder
    threads, a thread switch): sending a few batches at once divides it. The main process puts the
    batches back in stream order. Pickled with all CPU tensors copied into a free slot of the worker's
    ``_Ring`` (see there); without a ring (a plain ``DataLoader`` over the dataset) or a free slot big
    enough, into one new shared-memory block instead (one file descriptor per parcel, not one per tensor,
    but each still costs the main process a connection to the worker, ~1-3 ms).
    """

    worker: int
    items: list[_Item]
    held: list | None = None  # in the worker: the ring slot the parcel was built in ([slot, bytes used])

    def pin_memory(self) -> _Parcel:
        for item in self.items:
            if hasattr(item.batch, "pin_memory"):
                item.batch = item.batch.pin_memory()
        return self

    def __reduce__(self):
        state = (self.worker, self.items)
        if _RING is not None:
            sent = _RING.send(state, self.held)
            if sent is not None:
                return _rebuild_ring_parcel, sent
        return _rebuild_parcel, _pack_tensors(state)


class _Ring:
    """A worker's shared-memory slots that carry parcels to the main process.

    Sharing a new block per parcel costs a file-descriptor transfer each time, through a connection from
    the main process to the worker (~1-3 ms, which capped the loader at a few hundred batches/s). A
    ring is allocated once per worker and iteration (its descriptor sent once, with the first parcel);
    each parcel's tensors are copied into a free slot and only ``(slot, layout)`` goes through the queue.
    In the main process the batches' tensors are views of the slot (no copy); when the last of them is
    freed, the slot goes back to the worker through ``free`` (a pipe, which also orders the training
    loop's reads before the worker's next write), so a batch never sees memory the worker reuses. With
    no free slot (the training loop keeps many batches alive) or a parcel bigger than a slot, the parcel
    goes the per-parcel way instead: slower, same result.
    """

    def __init__(self, token: str, worker: int, free: Any, slots: int, slot_bytes: int) -> None:
        self.token, self.worker, self.free, self.slots = token, worker, free, slots
        self.slot_bytes = -(-slot_bytes // 4096) * 4096
        self.buf: torch.Tensor | None = None
        self.array: np.ndarray | None = None  # the same memory, for NumPy views
        self.cur: list | None = None  # [slot, bytes used] of the parcel being built
        self.announced = False

    def reserve(self) -> list | None:
        """Worker's main thread, as a parcel starts: take a free slot (``[slot, 0]``), or None if none."""
        if self.buf is None:
            self.buf = torch.empty(self.slots * self.slot_bytes, dtype=torch.uint8).share_memory_()
            self.array = self.buf.numpy()
        self.cur = None if self.free.empty() else [self.free.get(), 0]
        return self.cur

    def alloc(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialized array for the parcel being built: in its slot if there is room (so that
        sending it is no copy), else in ordinary memory."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        cur = self.cur
        if cur is None or cur[1] + nbytes > self.slot_bytes:
            return np.empty(shape, dtype=dtype)
        base = cur[0] * self.slot_bytes + cur[1]
        cur[1] += -(-nbytes // 64) * 64
        return self.array[base : base + nbytes].view(dtype).reshape(shape)

    def send(self, obj: Any, held: list | None) -> tuple | None:
        """Feeder thread: ``obj``'s tensors placed in slot ``held`` (those built there stay, the others
        are copied after them) and what the main process needs to view them; None if no slot or room."""
        if held is None:
            return None
        slot, used = held
        payload, tensors = _split_tensors(obj)
        lo, base = slot * self.slot_bytes, self.buf.data_ptr()
        layout, copies, end = [], [], used
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            at = t.data_ptr() - base - lo
            if t.is_contiguous() and 0 <= at and at + nbytes <= used:  # built in this slot
                layout.append((at, nbytes, t.dtype, tuple(t.shape)))
            else:
                layout.append((end, nbytes, t.dtype, tuple(t.shape)))
                copies.append(t)
                end += -(-nbytes // 64) * 64
        if end > self.slot_bytes:
            self.free.put(slot)  # give the slot back: this parcel goes the per-parcel way
            return None
        block = self.buf[lo : lo + end]
        moved = [entry for entry in layout if entry[0] >= used]
        for view, t in zip(_views(block, moved), copies, strict=True):
            view.copy_(t)
        ring = None if self.announced else self.buf
        self.announced = True
        return payload, self.token, self.worker, ring, lo, end, layout, slot


_RING: _Ring | None = None  # in a DataLoader worker of a PackedLoader: its ring
_MAIN_RINGS: dict[tuple[str, int], np.ndarray] = {}  # in the main process: (token, worker) -> ring
_MAIN_FREE: dict[str, list] = {}  # in the main process: token -> each worker's free-slot queue


def _rebuild_ring_parcel(
    payload: bytes,
    token: str,
    worker: int,
    ring: torch.Tensor | None,
    base: int,
    nbytes: int,
    layout: list,
    slot: int,
) -> _Parcel:
    if ring is not None:
        _MAIN_RINGS[(token, worker)] = ring.numpy()
    ring = _MAIN_RINGS.get((token, worker))
    free = _MAIN_FREE.get(token)
    if ring is None or free is None:
        raise RuntimeError("a batch of a loader iteration that has ended")
    # the batches are views of the slot, through one NumPy array made for this parcel: the slot goes
    # back to the worker when the last tensor viewing it is freed
    block = ring[base : base + nbytes]
    weakref.finalize(block, free[worker].put, slot)
    own = torch.from_numpy(block)
    return _Parcel(*_TensorUnpickler(io.BytesIO(payload), _views(own, layout)).load())


class _TensorPickler(pickle.Pickler):
    def __init__(self, file) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []

    def persistent_id(self, obj: Any) -> Any:
        if (
            isinstance(obj, torch.Tensor)
            and obj.device.type == "cpu"
            and obj.layout == torch.strided
            and not obj.requires_grad
            and type(obj) is torch.Tensor
        ):
            self.tensors.append(obj)
            return len(self.tensors) - 1
        return None


class _TensorUnpickler(pickle.Unpickler):
    def __init__(self, file, views: list[torch.Tensor]) -> None:
        super().__init__(file)
        self.views = views

    def persistent_load(self, pid: Any) -> torch.Tensor:
        return self.views[pid]


def _split_tensors(obj: Any) -> tuple[bytes, list[torch.Tensor]]:
    """``obj`` pickled without its (plain CPU) tensors, and those tensors in pickling order."""
    buf = io.BytesIO()
    pickler = _TensorPickler(buf)
    pickler.dump(obj)
    return buf.getvalue(), pickler.tensors


def _layout(tensors: list[torch.Tensor]) -> tuple[list, int]:
    """Where each tensor goes in one block (64-byte aligned offsets, dtype, shape) and the block's size."""
    layout, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        layout.append((offset, nbytes, t.dtype, tuple(t.shape)))
        offset += -(-nbytes // 64) * 64
    return layout, offset


def _pack_tensors(obj: Any) -> tuple[bytes, torch.Tensor | None, list]:
    """``obj`` pickled without its tensors, the tensors' bytes in one shared block, and their layout."""
    payload, tensors = _split_tensors(obj)
    layout, offset = _layout(tensors)
    arena = None
    if tensors:
        storage = torch.empty(0, dtype=torch.uint8)._typed_storage()._new_shared(max(offset, 1))
        arena = torch.empty(0, dtype=torch.uint8).new(storage)
        for view, t in zip(_views(arena, layout), tensors, strict=True):
            view.copy_(t)
    return payload, arena, layout


def _views(arena: torch.Tensor, layout: list) -> list[torch.Tensor]:
    return [arena[off : off + nbytes].view(dtype).view(shape) for off, nbytes, dtype, shape in layout]


def _rebuild_parcel(payload: bytes, arena: torch.Tensor | None, layout: list) -> _Parcel:
    views = _views(arena, layout) if arena is not None else []
    return _Parcel(*_TensorUnpickler(io.BytesIO(payload), views).load())


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class PackedDataset(IterableDataset):
    """Batches of packs from a packtool output directory (see the module docstring for the stream).

    Args:
        directory: the output directory (with ``manifest.json``).
        batch_size: packs per batch (every batch is full).
        shuffle, seed: deterministic order from ``(seed, epoch)``; ``shuffle=False`` keeps the file order
            within each lane.
        task_encoder: an object with any of ``encode_sample(pack) -> pack``, ``batch(packs) -> raw`` and
            ``encode_batch(raw) -> batch`` (missing ones use the defaults: ``default_batch`` then a
            ``PackedBatch``). A pack is a dict of ``(N,)`` tensors ``input_ids``, ``labels``,
            ``position_ids`` (int32), ``loss_mask`` (int8, if present), ``seq_lens`` (int32) and the int
            ``pack_index``; the tensors are views of the decoded row group: copy before editing in place.
        mask: ``"varlen"`` (default), ``"dense"`` or ``"flex"``: the mask ``PackedBatch.to`` builds.
        shuffle_buffer: how far (in packs) the shuffle moves a pack inside its lane.
        infinite: iterate epochs forever (one ``iter``) instead of one epoch per ``iter``.
        rank, world_size: default from ``torch.distributed`` when initialized, else 0 and 1.
        on_error: ``"fail"`` raises on an unreadable unit; ``"skip"`` drops its packs and counts them.
        lanes: advanced; reading lanes (``get_loader`` sets ``max(1, num_workers)`` when None).
    """

    def __init__(
        self,
        directory: str | Path,
        batch_size: int = 8,
        shuffle: bool = True,
        seed: int = 0,
        task_encoder: Any = None,
        *,
        mask: str = "varlen",
        shuffle_buffer: int = 512,
        infinite: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: str = "fail",
        lanes: int | None = None,
    ) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.manifest = load_manifest(self.directory)
        self.packed_sequence_size = int(self.manifest["packed_sequence_size"])
        self.shard_format = self.manifest.get("shard_format", "parquet")
        if self.shard_format not in UNIT_READERS:
            raise PacktoolError(
                f"{self.directory}: shard_format {self.shard_format!r} is not readable by packtool.loader "
                f"(known: {', '.join(UNIT_READERS)})"
            )
        d_rank, d_world = _dist_rank_world()
        self.rank = d_rank if rank is None else rank
        self.world_size = d_world if world_size is None else world_size
        for name, value in (("batch_size", batch_size), ("world_size", self.world_size)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if mask not in MASKS:
            raise ValueError(f"mask must be one of {', '.join(MASKS)}, got {mask!r}")
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if lanes is not None and (not isinstance(lanes, int) or lanes <= 0):
            raise ValueError(f"lanes must be a positive integer, got {lanes!r}")
        self.batch_size, self.shuffle, self.seed = batch_size, bool(shuffle), int(seed)
        self.task_encoder, self.mask, self.shuffle_buffer = task_encoder, mask, int(shuffle_buffer)
        self.infinite, self.on_error, self.lanes = bool(infinite), on_error, lanes
        self.units = units_of(self.manifest)
        self.unit_sizes = np.array([u.num_packs for u in self.units], dtype=np.int64)
        self.unit_first = np.concatenate([[0], np.cumsum(self.unit_sizes)])
        self.num_packs = int(self.unit_first[-1])
        self.batches_per_epoch = self.num_packs // (self.world_size * self.batch_size)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"{self.directory}: {self.num_packs} packs cannot fill one batch of {batch_size} "
                f"on each of {self.world_size} rank(s)"
            )
        columns = self.manifest.get("columns") or ["input_ids", "labels", "position_ids", "seq_lens"]
        self.columns = [c for c in (*PACK_COLUMNS, "seq_lens") if c in columns]
        self._start = (0, 0)  # (epoch, batch) where the next iteration starts; set by the loader
        self._transport: tuple | None = None  # (token, free-slot queue per worker, slots); set by the loader
        self._parcel_batches = 1  # batches per DataLoader item; set by the loader

    # the stream -------------------------------------------------------------------------------------
    def plan(self, epoch: int, lanes: int | None = None) -> np.ndarray:
        """This rank's batches of ``epoch`` as pack indices, ``(batches_per_epoch, batch_size)``."""
        return epoch_plan(
            self.unit_sizes,
            epoch=epoch,
            seed=self.seed,
            shuffle=self.shuffle,
            shuffle_buffer=self.shuffle_buffer,
            rank=self.rank,
            world_size=self.world_size,
            batch_size=self.batch_size,
            lanes=lanes or self.lanes or 1,
        )

    def __iter__(self) -> Iterator[_Parcel]:
        global _RING
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        ring = None
        if info is not None and self._transport is not None and len(self._transport[1]) == nw:
            token, free, slots = self._transport
            # a slot holds a parcel of 4-byte token columns, with room for seq_lens and the rest
            row_bytes = 4 * len(self.columns) * self.packed_sequence_size * self.batch_size
            ring = _RING = _Ring(
                token, wid, free[wid], slots, 5 * row_bytes * self._parcel_batches // 4 + 65536
            )
        e0, i0 = self._start
        nb = self.batches_per_epoch
        reader = _UnitReader(self)
        s, done = wid, False
        while not done:
            held = ring.reserve() if ring is not None else None
            # the default stages build the batch straight into the parcel's slot
            reader.alloc = ring.alloc if held is not None and reader.default_stages else np.empty
            items = []
            while len(items) < self._parcel_batches:
                e, i = e0 + (i0 + s) // nb, (i0 + s) % nb
                if e != e0 and not self.infinite:
                    done = True
                    break
                if e != reader.epoch:
                    g0 = (e - e0) * nb - i0  # stream position of batch 0 of epoch e
                    mine = np.arange(max(g0, 0), g0 + nb)
                    reader.start_epoch(e, self.plan(e), mine[mine % nw == wid] - g0)
                items.append(reader.item(e, i))
                s += nw
            if items:
                yield _Parcel(wid, items, held)
            elif held is not None:
                ring.free.put(held[0])


class _UnitReader:
    """Per worker: decodes units on demand, keeps each until its last needed pack of the epoch is used."""

    def __init__(self, ds: PackedDataset) -> None:
        self.ds, self.epoch, self.plan = ds, None, None
        self.cache: dict[int, dict | None] = {}
        self.opener = _OPENERS[ds.shard_format](ds.manifest)
        self.reader = UNIT_READERS[ds.shard_format]
        self.new_bad: list[int] = []  # units found unreadable since the last item
        te = ds.task_encoder
        self.encode_sample = getattr(te, "encode_sample", None)
        self.batch_fn = getattr(te, "batch", None) or default_batch
        self.encode_batch = getattr(te, "encode_batch", None) or self.default_encode_batch
        # no per-pack stage: batches are gathered from the decoded units with array ops
        self.fast = self.encode_sample is None and self.batch_fn is default_batch
        self.default_stages = self.fast and getattr(te, "encode_batch", None) is None
        self.alloc: Callable[[tuple[int, ...], Any], np.ndarray] = np.empty  # for the gathered arrays

    def start_epoch(self, epoch: int, plan: np.ndarray, batches: np.ndarray) -> None:
        self.epoch, self.plan = epoch, plan
        units = np.searchsorted(self.ds.unit_first, plan[batches].reshape(-1), side="right") - 1
        self.remaining = np.bincount(units, minlength=len(self.ds.units))
        self.cache.clear()

    def unit(self, u: int) -> dict | None:
        if u in self.cache:
            return self.cache[u]
        unit = self.ds.units[u]
        path = self.ds.directory / self.ds.manifest["shards"][unit.shard]["path"]
        try:
            arrays = self.reader(self.opener, path, unit, self.ds.packed_sequence_size, self.ds.columns)
        except _UNIT_ERRORS as e:
            if self.ds.on_error == "fail":
                raise InputError(
                    f"cannot read packs ({type(e).__name__}: {e})",
                    source=str(path),
                    row=unit.part,
                    row_kind="row group",
                ) from None
            arrays = None
            self.new_bad.append(u)
        self.cache[u] = arrays
        return arrays

    def units_of_batch(self, units: np.ndarray) -> dict[int, dict | None]:
        """Decode (or take from the cache) each unit of a batch once, in order of first use; drop a unit
        from the cache once its last pack of the epoch is used."""
        listed = units.tolist()
        out = {}
        for u in dict.fromkeys(listed):  # a batch's few units, in order of first use
            out[u] = self.unit(u)
            self.remaining[u] -= listed.count(u)
            if self.remaining[u] == 0:
                self.cache.pop(u, None)
        return out

    def item(self, epoch: int, index: int) -> _Item:
        ds = self.ds
        counts = {"skipped_packs": 0, "skipped_batches": 0, "bad_packs": 0}
        ids = self.plan[index]
        units = np.searchsorted(ds.unit_first, ids, side="right") - 1
        decoded = self.units_of_batch(units)
        good = np.array([decoded[u] is not None for u in units.tolist()], dtype=bool)
        counts["bad_packs"] = int(len(ids) - good.sum())
        ids, units = ids[good], units[good]
        rows = ids - ds.unit_first[units]
        raw = None
        if self.fast and len(ids):
            raw = gather_batch(decoded, units, rows, ids, self.alloc)  # = default_batch, no pack dicts
        elif len(ids):
            packs = []
            for pid, u, row in zip(ids.tolist(), units.tolist(), rows.tolist(), strict=True):
                pack = _pack(decoded[u], row, pid, tensors=self.encode_sample is not None)
                if self.encode_sample is not None:
                    try:
                        pack = self.encode_sample(pack)
                    except SkipSample:
                        counts["skipped_packs"] += 1
                        continue
                packs.append(pack)
            if packs:
                try:
                    raw = self.batch_fn(packs)
                except SkipSample:
                    raw = None
        batch = None
        if raw is not None:
            try:
                batch = self.encode_batch(raw)
            except SkipSample:
                batch = None
        if batch is None:
            counts["skipped_batches"] += 1
        names = [self._unit_name(u) for u in self.new_bad]
        self.new_bad = []
        return _Item(epoch, index, batch, counts, names)

    def _unit_name(self, u: int) -> str:
        unit = self.ds.units[u]
        return f"{self.ds.manifest['shards'][unit.shard]['path']}#{unit.part}"

    def default_encode_batch(self, raw: dict) -> PackedBatch:
        seq_lens = raw["seq_lens"]
        cu, max_seqlen = _host_cu_seqlens(seq_lens)
        pack_index = raw.get("pack_index")
        return PackedBatch(
            input_ids=raw["input_ids"],
            labels=raw["labels"],
            position_ids=raw["position_ids"],
            seq_lens=seq_lens,
            cu_seqlens=cu,
            max_seqlen=max_seqlen,
            loss_mask=raw.get("loss_mask"),
            pack_index=torch.tensor(pack_index, dtype=torch.int64) if pack_index is not None else None,
            mask=self.ds.mask,
            extra={k: v for k, v in raw.items() if k not in _BATCH_KEYS},
        )


_BATCH_KEYS = {"input_ids", "labels", "position_ids", "seq_lens", "loss_mask", "pack_index"}


def gather_batch(
    decoded: dict[int, dict],
    units: np.ndarray,
    rows: np.ndarray,
    ids: np.ndarray,
    alloc: Callable[[tuple[int, ...], Any], np.ndarray] = np.empty,
) -> dict:
    """The default raw batch of packs ``rows`` of ``units`` (``default_batch`` of their pack dicts).

    ``decoded`` maps a unit to its ``table_arrays``. No per-pack dicts: each ``(B, N)`` column is filled
    with one row copy per pack (fancy indexing would copy every row twice, through a temporary; measured
    2x slower), keeping its stored dtype; ``seq_lens`` is int32 ``(B, max_seqs)`` padded with
    ``SEQ_LENS_PAD``; ``pack_index`` is the list of pack indices. The arrays are made by
    ``alloc(shape, dtype)`` (a worker passes its ring's, to build the batch in shared memory).
    """
    k = len(units)
    first = decoded[int(units[0])]
    out: dict[str, Any] = {}
    unit_list, row_list = units.tolist(), rows.tolist()
    for name in PACK_COLUMNS:
        if name in first:
            col = alloc((k, first[name].shape[1]), first[name].dtype)
            for j in range(k):
                col[j] = decoded[unit_list[j]][name][row_list[j]]
            out[name] = torch.from_numpy(col)
    pieces = []  # each pack's seq_lens: a slice of its unit's flat values (a few per batch)
    for u, r in zip(unit_list, row_list, strict=True):
        off = decoded[u]["seq_lens_offsets"]
        pieces.append(decoded[u]["seq_lens"][off[r] : off[r + 1]])
    width = max(1, max(len(p) for p in pieces))
    seq_lens = alloc((k, width), np.int32)
    for j, piece in enumerate(pieces):
        seq_lens[j, : len(piece)] = piece
        seq_lens[j, len(piece) :] = SEQ_LENS_PAD
    out["seq_lens"] = torch.from_numpy(seq_lens)
    out["pack_index"] = ids.tolist()
    return out


def _host_cu_seqlens(seq_lens: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``cu_seqlens_of`` for a CPU tensor, in NumPy (a few times cheaper for one batch)."""
    if seq_lens.device.type != "cpu" or seq_lens.dim() != 2:
        return cu_seqlens_of(seq_lens)
    flat = seq_lens.numpy().reshape(-1)
    flat = flat[flat > 0]
    cu = np.zeros(flat.size + 1, dtype=np.int32)
    np.cumsum(flat, out=cu[1:])
    return torch.from_numpy(cu), int(flat.max()) if flat.size else 0


def _pack(arrays: dict, row: int, pack_index: int, tensors: bool) -> dict:
    """Row ``row`` of a decoded unit as a pack dict (NumPy views, or tensor views for task encoders)."""
    off = arrays["seq_lens_offsets"]
    pack: dict[str, Any] = {name: arrays[name][row] for name in PACK_COLUMNS if name in arrays}
    pack["seq_lens"] = arrays["seq_lens"][off[row] : off[row + 1]]
    if tensors:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only Arrow memory: documented as views
            pack = {k: torch.from_numpy(v) for k, v in pack.items()}
    pack["pack_index"] = pack_index
    return pack


# --- the loader --------------------------------------------------------------------------------------
def _identity(x: Any) -> Any:
    return x


class PackedLoader:
    """Iterates a ``PackedDataset`` through a ``torch.utils.data.DataLoader`` and keeps the global cursor.

    ``iter(loader)`` continues from the cursor: in epoch mode it yields the rest of the current epoch
    (a new epoch each time it is exhausted); in infinite mode it never ends. ``stats`` counts dropped and
    unreadable packs: ``skipped_packs``, ``skipped_batches``, ``bad_packs`` and ``bad_units``.
    """

    def __init__(self, dataset: PackedDataset, num_workers: int, **dataloader_kwargs: Any) -> None:
        if dataloader_kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers is not supported: workers are restarted at each iter()")
        self.dataset, self.num_workers = dataset, num_workers
        self.lanes = dataset.lanes or max(1, num_workers)
        # ring slots per worker: the parcels a worker may have in flight (prefetch_factor), the one being
        # yielded, one waiting in stream order, then slack for batches the training loop still holds
        self.ring_slots = (dataloader_kwargs.get("prefetch_factor") or 2) + 4
        self.dataloader = DataLoader(
            dataset, batch_size=None, num_workers=num_workers, collate_fn=_identity, **dataloader_kwargs
        )
        self.epoch, self.batch = 0, 0
        self.stats: dict[str, Any] = {
            "skipped_packs": 0,
            "skipped_batches": 0,
            "bad_packs": 0,
            "bad_units": [],
        }
        self._iterating = False

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.dataset.batches_per_epoch

    def __iter__(self) -> Iterator[Any]:
        ds = self.dataset
        ds._start, ds.lanes = (self.epoch, self.batch), self.lanes
        ds._parcel_batches = PARCEL_BATCHES if self.num_workers > 0 else 1
        nb = ds.batches_per_epoch
        token = None
        if self.num_workers > 0:
            token = uuid.uuid4().hex
            ctx = self.dataloader.multiprocessing_context or multiprocessing.get_context()
            free = [ctx.SimpleQueue() for _ in range(self.num_workers)]
            for q in free:
                for slot in range(self.ring_slots):
                    q.put(slot)
            _MAIN_FREE[token] = free
            ds._transport = (token, free, self.ring_slots)
        self._iterating = True
        try:
            for item in self._items():
                if (item.epoch, item.index) != (self.epoch, self.batch):
                    raise RuntimeError(
                        f"loader stream out of order: got batch {item.index} of epoch {item.epoch}, "
                        f"expected {self.batch} of {self.epoch}"
                    )
                self.batch += 1
                if self.batch == nb:
                    self.epoch, self.batch = self.epoch + 1, 0
                for k, v in item.counts.items():
                    self.stats[k] += v
                for name in item.bad_units:
                    if name not in self.stats["bad_units"]:
                        self.stats["bad_units"].append(name)
                if item.batch is not None:
                    yield item.batch
        finally:
            self._iterating = False
            ds._transport = None
            if token is not None and _MAIN_FREE is not None:  # (None when finalized at interpreter exit)
                _MAIN_FREE.pop(token, None)
                for key in [k for k in _MAIN_RINGS if k[0] == token]:
                    del _MAIN_RINGS[key]

    def _items(self) -> Iterator[_Item]:
        """The DataLoader's parcels unpacked in stream order: batch ``s`` (from the start of this
        iteration) comes from worker ``s % num_workers``, whose parcels hold its batches in order."""
        nw = max(1, self.num_workers)
        pending: list[deque] = [deque() for _ in range(nw)]
        s = 0
        for parcel in self.dataloader:
            pending[parcel.worker].extend(parcel.items)
            while pending[s % nw]:
                yield pending[s % nw].popleft()
                s += 1

    def state_dict(self) -> dict:
        """The global cursor and what defines the stream (a small JSON-able dict)."""
        ds = self.dataset
        return {
            "format": "packtool-loader",
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "batch": self.batch,
            "lanes": self.lanes,
            "run_id": ds.manifest.get("run_id"),
            "num_packs": ds.num_packs,
            "seed": ds.seed,
            "batch_size": ds.batch_size,
            "world_size": ds.world_size,
            "shuffle": ds.shuffle,
            "shuffle_buffer": ds.shuffle_buffer,
            "rank": ds.rank,
            "stats": {**self.stats, "bad_units": list(self.stats["bad_units"])},
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from ``state_dict``); refuses a state whose stream differs."""
        if self._iterating:
            raise RuntimeError("load_state_dict during iteration: call it before iterating the loader")
        if state.get("format") != "packtool-loader" or state.get("version") != STATE_VERSION:
            raise ValueError("not a packtool loader state (or from another version)")
        ds = self.dataset
        mine = self.state_dict()
        fixed = ("run_id", "num_packs", "seed", "batch_size", "world_size", "shuffle", "shuffle_buffer")
        diff = [f"{k}: saved {state.get(k)!r}, now {mine[k]!r}" for k in fixed if state.get(k) != mine[k]]
        if diff:
            raise ValueError("loader state does not match this dataset: " + "; ".join(diff))
        if not 0 <= state["batch"] < ds.batches_per_epoch:
            raise ValueError(f"loader state batch {state['batch']} out of range")
        self.epoch, self.batch, self.lanes = int(state["epoch"]), int(state["batch"]), int(state["lanes"])
        stats = state.get("stats") or {}
        self.stats = {
            "skipped_packs": int(stats.get("skipped_packs", 0)),
            "skipped_batches": int(stats.get("skipped_batches", 0)),
            "bad_packs": int(stats.get("bad_packs", 0)),
            "bad_units": list(stats.get("bad_units", [])),
        }


def get_loader(dataset: PackedDataset, num_workers: int = 2, **dataloader_kwargs: Any) -> PackedLoader:
    """A ``PackedLoader`` over ``dataset`` with ``num_workers`` DataLoader workers.

    ``dataloader_kwargs`` go to ``torch.utils.data.DataLoader`` (``pin_memory``, ``prefetch_factor``,
    ``multiprocessing_context``, ``timeout``...); ``batch_size`` / ``collate_fn`` / ``persistent_workers``
    are the loader's own.

    Example::

        >>> loader = get_loader(PackedDataset("out/", batch_size=8), num_workers=2)  # doctest: +SKIP
        >>> batch = next(iter(loader))  # doctest: +SKIP
    """
    return PackedLoader(dataset, num_workers, **dataloader_kwargs)
