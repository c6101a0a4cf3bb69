"""``PackedDataset``: a packtool output directory as a stream of batches for ``torch.utils.data``.

**The stream.** A *unit* is what a reader decodes at once (a Parquet row group, a whole tar shard; the
shard format says). For epoch ``e`` the units are put in an order drawn from ``(seed, e)``; their packs,
in that order, form the epoch's sequence of ``P`` packs. Rank ``r`` of ``R`` takes the slice
``[S + r * M, S + (r + 1) * M)`` with ``M = (P // (R * B)) * B``, so every rank has the same number of full
batches; the ``P - R * M < R * B`` packs left over are left out of that epoch: the first ``S`` and the last
of the epoch's order, ``S`` drawn from ``(seed, e)`` in ``[0, P - R * M]`` when shuffling (0 otherwise), so
they differ from epoch to epoch even with one unit, and every unit stays contiguous. A rank's slice is cut
into ``lanes`` contiguous segments; lane ``l`` produces the rank's batches ``l, l + lanes, ...`` from its
segment, mixed by a shuffle buffer (each pack moves by less than ``shuffle_buffer`` places, drawn from
``(seed, e, r, l)``). Everything above is computed on pack indices only (``loader.order``), before any
data is read.

**Workers.** The DataLoader takes batch ``k`` of the stream from worker ``k % num_workers``; each worker
decodes only the units holding its batches' packs and drops a unit once its last pack is used. With
``num_workers == lanes`` (the default) the workers read disjoint units, every unit once per epoch. Under
``PackedLoader`` a worker sends ``PARCEL_BATCHES`` batches per DataLoader item (``_Parcel``, through the
DataLoader's own transport, iterating ``ParcelStream``); iterating the dataset itself, or a plain
``DataLoader(dataset, batch_size=None)``, yields the batches one by one.

**Faults.** ``on_error="fail"`` (default) raises ``InputError`` naming the shard and unit when a unit
cannot be read (missing file, corrupt data, wrong pack count, a shard of another run).
``on_error="skip"`` drops that unit's packs from their batches and counts them in ``loader.stats``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packtool.errors import InputError
from packtool.formats.base import UNIT_ERRORS
from packtool.formats.registry import get_format
from packtool.loader.batch import (
    MASKS,
    PackedBatch,
    SkipSample,
    check_mask_for_model,
    default_batch,
    gather_batch,
    pack_dict,
    packed_batch,
)
from packtool.loader.order import epoch_plan, epoch_size, units_of
from packtool.manifest import TRAINING_COLUMNS, Manifest
from packtool.masks import attention_pattern
from packtool.packs import PackArrays
from packtool.reading import require_shard_files

ON_ERROR = ("fail", "skip")
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
    threads, a thread switch), and torch's transport shares every tensor through its own file descriptor,
    which the main process fetches from the worker one connection at a time. So a parcel carries a few
    batches, and the tensors of its ``PackedBatch`` objects travel as one shared-memory block (one
    descriptor per parcel) that the main process views them in (``__reduce__``). Other batches (a task
    encoder's own type) go as torch pickles them. The main process puts the batches back in stream order.
    """

    worker: int
    items: list[_Item]

    def pin_memory(self) -> _Parcel:
        for item in self.items:
            if hasattr(item.batch, "pin_memory"):
                item.batch = item.batch.pin_memory()
        return self

    def __reduce__(self):
        fields = [(i, name, t) for i, item in enumerate(self.items) for name, t in _host_tensors(item.batch)]
        if not fields:
            return _Parcel, (self.worker, self.items)
        layout, end = [], 0
        for i, name, t in fields:
            layout.append((i, name, end, t.dtype, tuple(t.shape)))
            end += -(-t.numel() * t.element_size() // 64) * 64
        block = torch.empty(max(end, 1), dtype=torch.uint8).share_memory_()
        for (_, _, t), view in zip(fields, _views(block, layout), strict=True):
            view.copy_(t)
        items = [dataclasses.replace(item) for item in self.items]
        for i, name, _ in fields:
            items[i].batch = dataclasses.replace(items[i].batch, **{name: None})
        return _rebuild_parcel, (self.worker, items, block, layout)


def _host_tensors(batch: Any) -> list[tuple[str, torch.Tensor]]:
    """The plain CPU tensors of a ``PackedBatch`` (what travels in a parcel's block)."""
    if not isinstance(batch, PackedBatch):
        return []
    return [
        (f.name, t)
        for f in dataclasses.fields(batch)
        if isinstance(t := getattr(batch, f.name), torch.Tensor)
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.is_shared()  # already in shared memory (a large tensor a stage put there): sent as it is
    ]


def _views(block: torch.Tensor, layout: list) -> list[torch.Tensor]:
    return [
        block[at : at + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
        for _, _, at, dtype, shape in layout
    ]


def _rebuild_parcel(worker: int, items: list[_Item], block: torch.Tensor, layout: list) -> _Parcel:
    for (i, name, *_), view in zip(layout, _views(block, layout), strict=True):
        setattr(items[i].batch, name, view)
    return _Parcel(worker, items)


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class PackedDataset(IterableDataset):
    """Batches of packs from a packtool output directory (see the module docstring for the stream).

    Args:
        directory: the output directory (with ``manifest.json``).
        batch_size: packs per batch.
        drop_last: ``True`` (default): every batch is full, and the packs left over (fewer than
            ``world_size * batch_size``) sit out the epoch. ``False``: every pack is used; packs repeat
            so that every rank has as many (as torch's ``DistributedSampler``), and the last batch of a
            rank may be short.
        shuffle, seed: deterministic order from ``(seed, epoch)``; ``shuffle=False`` keeps the file order
            within each lane.
        task_encoder: an object with any of ``encode_sample(pack) -> pack``, ``batch(packs) -> raw`` and
            ``encode_batch(raw) -> batch`` (missing ones use the defaults: ``default_batch`` then a
            ``PackedBatch``). A pack is a dict of ``(N,)`` tensors ``input_ids``, ``labels``,
            ``position_ids`` (int32), ``loss_mask`` (int8, if present), ``seq_lens`` (int32) and the int
            ``pack_index``; the tensors are views of the decoded row group: copy before editing in place.
            A vision-language output's packs also hold its image columns (``images``: a list of
            ``{"bytes", "path"}``; ``image_offset``, ``image_length``, ...: ``(num_images,)`` int32
            tensors); it needs a task encoder with ``encode_sample`` (``packtool.vision.loader``).
        mask: ``"varlen"`` (default), ``"dense"``, ``"additive"`` or ``"flex"``: built by ``PackedBatch.to``.
        attention: the model's attention, for the masks: its transformers config (``model.config``), or
            a ``masks.AttentionPattern`` (``sliding_window``, ``layer_types``); None (default): full
            attention on every layer. With a sliding window the masks keep each query inside it too, one
            mask per layer type (``PackedBatch.attention``); a config also checks that ``mask`` fits its
            ``attn_implementation`` (``eager`` takes ``"additive"``, ``sdpa`` ``"dense"``...). The
            ``"varlen"`` path needs no window here: the model's attention applies its own to each sequence.
        shuffle_buffer: how far (in packs) the shuffle moves a pack inside its lane.
        infinite: iterate epochs forever (one ``iter``) instead of one epoch per ``iter``.
        rank, world_size: default from ``torch.distributed`` when initialized, else 0 and 1.
        on_error: ``"fail"`` raises on an unreadable unit; ``"skip"`` drops its packs and counts them.
        lanes: advanced; reading lanes (``get_loader`` sets ``max(1, num_workers)`` when None).
        verify_checksums: check every unit decoded against the checksums written with it (Parquet page
            CRCs, a tar shard's CRC-32): a damaged unit raises ``InputError`` (``on_error="skip"``: counted
            and dropped). The shard set (every shard there, with its size; the pack count) is checked
            when the dataset is made, under ``on_error="fail"``.
        split: ``"train"`` (default: every pack, unless the run held some out with ``--val-fraction``),
            ``"val"`` (the held-out packs) or None (all). ``pack_index`` is the pack's index in the
            output directory whatever the split (as the tar key, ``first_pack`` and ``inspect --pack``).
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
        drop_last: bool = True,
        verify_checksums: bool = True,
        split: str | None = "train",
        attention: Any = None,
    ) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.manifest = Manifest.load(self.directory)
        self.packed_sequence_size = self.manifest.packed_sequence_size
        self.shard_reader = get_format(self.manifest.shard_format).reader
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
        self.attention = attention_pattern(attention) if attention is not None else None
        check_mask_for_model(mask, attention)
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if lanes is not None and (not isinstance(lanes, int) or lanes <= 0):
            raise ValueError(f"lanes must be a positive integer, got {lanes!r}")
        self.batch_size, self.shuffle, self.seed = batch_size, bool(shuffle), int(seed)
        self.task_encoder, self.mask, self.shuffle_buffer = task_encoder, mask, int(shuffle_buffer)
        self.infinite, self.on_error, self.lanes = bool(infinite), on_error, lanes
        self.drop_last, self.verify_checksums = bool(drop_last), bool(verify_checksums)
        self.split = split
        self.units = units_of(self.manifest, split)
        self.unit_sizes = np.array([u.num_packs for u in self.units], dtype=np.int64)
        self.unit_first = np.concatenate([[0], np.cumsum(self.unit_sizes)])
        self.num_packs = int(self.unit_first[-1])
        # each unit's first pack as an index in the output directory (all splits, shard order): pack_index,
        # from the shards' pack counts (which the run_id binds and the shards' own metadata confirm)
        first_in_shard: dict[int, int] = {}
        shard_starts = self.manifest.shard_starts
        self.unit_pack_base = np.empty(len(self.units), dtype=np.int64)
        for j, unit in enumerate(self.units):
            base = first_in_shard.get(unit.shard, shard_starts[unit.shard])
            self.unit_pack_base[j] = base
            first_in_shard[unit.shard] = base + unit.num_packs
        self.batches_per_epoch = epoch_size(self.num_packs, self.world_size, self.batch_size, self.drop_last)[
            0
        ]
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"{self.directory}: {self.num_packs} packs cannot fill one batch of {batch_size} "
                f"on each of {self.world_size} rank(s); pass drop_last=False to use them in a short batch"
            )
        # as readers give them, whatever the layout stores (packtool.layout rebuilds the rest)
        self.columns = (
            [*TRAINING_COLUMNS, "loss_mask"] if self.manifest.has_loss_mask else [*TRAINING_COLUMNS]
        ) + (["cp_padding"] if "cp_padding" in self.manifest.columns else [])
        # a vision-language output's images and their runs (docs/vision.md): for a task encoder that turns
        # them into the model's inputs (packtool.vision.loader); the default stages would drop them
        image_columns = list(self.manifest.image_columns or ())
        if image_columns and getattr(task_encoder, "encode_sample", None) is None:
            raise ValueError(
                f"{self.directory}: the packs hold images; read them with packtool.vision.loader's "
                "vision_dataset (or a task encoder whose encode_sample takes the image columns)"
            )
        self.columns += image_columns
        if self.on_error == "fail":  # before the first batch; under skip, reading the shard counts it
            require_shard_files(self.directory, self.manifest)
        self._epoch = 0  # where plain iteration starts (set_epoch)

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
            drop_last=self.drop_last,
        )

    def __len__(self) -> int:
        """Batches per epoch on this rank (an infinite dataset has no length: ``TypeError``, as Python
        asks of ``len``)."""
        if self.infinite:
            raise TypeError("an infinite PackedDataset has no len(); batches_per_epoch is one epoch")
        return self.batches_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """The epoch that plain iteration (``iter(dataset)``, a plain ``DataLoader``) starts at; trainers
        call it each epoch (accelerate's and transformers' loaders do), so the order changes per epoch."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self._epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        """This rank's batches of one epoch (``set_epoch``; every epoch on with ``infinite=True``), in
        stream order: ``PackedBatch`` objects (or the task encoder's batches).

        What ``for batch in dataset`` and a plain ``torch.utils.data.DataLoader(dataset, batch_size=None,
        num_workers=k)`` give (with ``k`` workers, pass ``lanes=k`` to read every unit once); dropped
        batches are left out. ``get_loader`` adds the exact resume cursor and the counts in
        ``loader.stats``.
        """
        for parcel in self._parcels((self._epoch, 0), 1):
            for item in parcel.items:
                if item.batch is not None:
                    yield item.batch

    def _parcels(self, start: tuple[int, int], per_parcel: int) -> Iterator[_Parcel]:
        """The stream from ``start`` = ``(epoch, batch)``: this DataLoader worker's batches, ``per_parcel``
        at a time."""
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        e0, i0 = start
        nb = self.batches_per_epoch
        reader = _UnitDecoder(self)
        s, done = wid, False
        while not done:
            items = []
            while len(items) < per_parcel:
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
                yield _Parcel(wid, items)
        reader.close()


class ParcelStream(IterableDataset):
    """The stream of ``dataset`` from ``start`` as parcels (what ``PackedLoader``'s DataLoader iterates)."""

    def __init__(self, dataset: PackedDataset) -> None:
        super().__init__()
        self.dataset = dataset
        self.start = (0, 0)
        self.per_parcel = 1

    def __iter__(self) -> Iterator[_Parcel]:
        return self.dataset._parcels(self.start, self.per_parcel)


class _UnitDecoder:
    """Per worker: decodes units on demand, keeps each until its last needed pack of the epoch is used."""

    def __init__(self, ds: PackedDataset) -> None:
        self.ds, self.epoch, self.plan = ds, None, None
        self.cache: dict[int, PackArrays | None] = {}
        self.reader = ds.shard_reader.open_reader(ds.directory, ds.manifest, ds.verify_checksums)
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
        ids = plan[batches].reshape(-1)
        units = np.searchsorted(self.ds.unit_first, ids[ids >= 0], side="right") - 1
        self.remaining = np.bincount(units, minlength=len(self.ds.units))
        self.cache.clear()

    def close(self) -> None:
        self.reader.close()

    def unit(self, u: int) -> PackArrays | None:
        if u in self.cache:
            return self.cache[u]
        unit = self.ds.units[u]
        path = self.ds.directory / self.ds.manifest.shards[unit.shard].path
        try:
            arrays = self.reader.read(unit.shard, unit.part, self.ds.columns)
        except UNIT_ERRORS as e:
            if self.ds.on_error == "fail":
                kind = self.ds.shard_reader.unit_kind
                raise InputError(
                    f"cannot read packs ({type(e).__name__}: {e})",
                    source=str(path),
                    row=unit.part if kind else None,
                    row_kind=kind or "row",
                ) from None
            arrays = None
            self.new_bad.append(u)
        self.cache[u] = arrays
        return arrays

    def units_of_batch(self, units: np.ndarray) -> dict[int, PackArrays | None]:
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
        ids = ids[ids >= 0]  # the short last batch (drop_last=False)
        units = np.searchsorted(ds.unit_first, ids, side="right") - 1
        decoded = self.units_of_batch(units)
        good = np.array([decoded[u] is not None for u in units.tolist()], dtype=bool)
        counts["bad_packs"] = int(len(ids) - good.sum())
        ids, units = ids[good], units[good]
        rows = ids - ds.unit_first[units]
        pack_index = ds.unit_pack_base[units] + rows  # in the output directory, whatever the split
        raw = None
        if self.fast and len(ids):
            raw = gather_batch(decoded, units, rows, pack_index, self.alloc)  # = default_batch, no pack dicts
        elif len(ids):
            packs = []
            for pid, u, row in zip(pack_index.tolist(), units.tolist(), rows.tolist(), strict=True):
                pack = pack_dict(decoded[u], row, pid, tensors=self.encode_sample is not None)
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
        if isinstance(batch, PackedBatch) and batch.attention is None:  # a task encoder's batch: the model's
            batch.attention = ds.attention
        if batch is None:
            counts["skipped_batches"] += 1
        names = [self._unit_name(u) for u in self.new_bad]
        self.new_bad = []
        return _Item(epoch, index, batch, counts, names)

    def _unit_name(self, u: int) -> str:
        unit = self.ds.units[u]
        return f"{self.ds.manifest.shards[unit.shard].path}#{unit.part}"

    def default_encode_batch(self, raw: dict) -> PackedBatch:
        return packed_batch(raw, self.ds.mask, self.ds.manifest.labels, self.ds.attention)
