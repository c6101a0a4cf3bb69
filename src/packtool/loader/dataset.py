"""``PackedDataset``: a packtool output directory as a stream of batches for ``torch.utils.data``.

**The stream.** sources -> order -> batches. The source (``loader.sources``: one output directory, or a
mixture of outputs at weights or repeats) gives each epoch's sequence of packs, drawn from ``(seed,
epoch)``; the order (``loader.order``) cuts it into each rank's batches, on pack indices only, before any
data is read: rank ``r`` of ``R`` takes a contiguous slice, every rank the same number of full batches
(the fewer than ``R * B`` packs left over sit out the epoch, from its head and its tail); the slice is cut
into ``lanes`` contiguous segments (a mixture's at its sources' units: ``order.lanes_by_unit``), lane ``l``
giving the rank's batches ``l, l + lanes, ...`` mixed by a shuffle buffer. A unit (what a reader decodes
at once: a Parquet row group, a whole tar shard) stays contiguous in the sequence. Resumed at another
world size or batch size (``PackedLoader.load_state_dict``), the stream follows the order of the world
size that started the run, cut into the new global batches (``order.recut``).

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
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packtool.errors import InputError
from packtool.formats.base import UNIT_ERRORS
from packtool.loader.batch import (
    MASKS,
    PackedBatch,
    SkipSample,
    default_batch,
    gather_batch,
    pack_dict,
    packed_batch,
)
from packtool.loader.fit import model_attention
from packtool.loader.order import (
    Layout,
    Units,
    draw_skip,
    epoch_size,
    flat_order,
    rank_positions,
    recut,
    resumed_size,
    take,
)
from packtool.loader.sources import Mixture, OutputSource, UnitTable, batch_columns, open_source
from packtool.packs import PackArrays

ON_ERROR = ("fail", "skip")
PARCEL_BATCHES = 4  # batches a DataLoader worker sends at once (one DataLoader item)
PREFETCH_UNITS = 2  # units whose shards a worker fetches ahead, from an output in a store


@dataclass
class _Item:
    """One batch of the stream: its position, the batch (or None if dropped) and what was counted."""

    epoch: int
    index: int
    batch: Any
    counts: dict
    bad_units: list
    sources: np.ndarray | None = None  # a mixture's (sources, 3) packs, tokens, laps begun of this batch


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
            batch = items[i].batch
            if isinstance(name, tuple):  # an entry of extra (a mixture's source)
                items[i].batch = dataclasses.replace(batch, extra={**batch.extra, name[1]: None})
            else:
                items[i].batch = dataclasses.replace(batch, **{name: None})
        return _rebuild_parcel, (self.worker, items, block, layout)


def _plain(t: Any) -> bool:
    """A CPU tensor that travels in a parcel's block: not one already in shared memory (a large tensor a
    stage put there: sent as it is)."""
    return (
        isinstance(t, torch.Tensor)
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.is_shared()
    )


def _host_tensors(batch: Any) -> list[tuple[str | tuple[str, str], torch.Tensor]]:
    """The plain CPU tensors of a ``PackedBatch``, its fields' and its ``extra``'s (``("extra", key)``):
    what travels in a parcel's block."""
    if not isinstance(batch, PackedBatch):
        return []
    fields = [(f.name, t) for f in dataclasses.fields(batch) if _plain(t := getattr(batch, f.name))]
    return fields + [(("extra", k), t) for k, t in batch.extra.items() if _plain(t)]


def _views(block: torch.Tensor, layout: list) -> list[torch.Tensor]:
    return [
        block[at : at + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
        for _, _, at, dtype, shape in layout
    ]


def _rebuild_parcel(worker: int, items: list[_Item], block: torch.Tensor, layout: list) -> _Parcel:
    for (i, name, *_), view in zip(layout, _views(block, layout), strict=True):
        if isinstance(name, tuple):
            items[i].batch.extra[name[1]] = view
        else:
            setattr(items[i].batch, name, view)
    return _Parcel(worker, items)


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class PackedDataset(IterableDataset):
    """Batches of packs from a packtool output directory, or a mixture of them (see the module docstring
    for the stream).

    Args:
        source: the output directory (with ``manifest.json``); or a mixture (``loader.sources``): a
            mixture file (``mixture.yaml``), ``{directory: weight, ...}`` (each pack drawn from a source
            with probability ``weight / sum(weights)``, deterministic from ``(seed, epoch)``; an epoch holds
            as many packs as the sources together, each source cycling through its own epochs), or
            ``[{"path": directory, "repeat": r}, ...]`` (an epoch holds exactly ``floor(r * packs)`` of
            each source's packs, a fraction another part each epoch). A mixture's batches say each pack's
            source (``batch.source``, ``(B,)`` int64, an index into ``dataset.outputs``) and
            ``loader.stats["sources"]`` counts each one's packs, tokens and epochs begun.
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
            tensors); it needs a task encoder with ``encode_sample`` (``packtool.vision.loader``). A task
            encoder whose batches hold M-RoPE position ids says so with ``mrope = True`` (``attention=``
            then checks the model's code with them).
        mask: ``"varlen"`` (default), ``"dense"``, ``"additive"`` or ``"flex"``: built by ``PackedBatch.to``.
        attention: the model's attention, required for the ``"dense"``, ``"additive"`` and ``"flex"``
            masks (they are built for it): its transformers config (``model.config``), which also checks
            that ``mask`` trains that model exactly (``loader.fit``: its layers, its
            ``attn_implementation``, its code; else a one-line ``ValueError`` naming what works), or a
            declaration for a model of your own, taken on your word: ``"causal"`` (full causal attention
            on every layer) or a ``masks.AttentionPattern`` (``sliding_window``, ``layer_types``). With a
            sliding window the masks keep each query inside it too, one mask per layer type
            (``PackedBatch.attention``). ``"varlen"`` without it gives the ``cu_seqlens`` of a kernel of
            your own; for a transformers model pass its config, to have the flattened path checked.
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
        source: Any,
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
        self.source = open_source(source, split)
        self.outputs = self.source.outputs  # the output directories read, in the source's order
        self.mixture = isinstance(self.source, Mixture)
        # one output's: its directory and manifest; a mixture's: the first source's (their shared fields)
        self.manifest = self.outputs[0].manifest
        self.directory = self.outputs[0].directory if isinstance(self.source, OutputSource) else None
        self.packed_sequence_size = self.manifest.packed_sequence_size
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
        row = self.packed_sequence_size * (batch_size if mask == "varlen" else 1)  # the model's rows
        mrope = getattr(task_encoder, "mrope", False)
        self.attention = model_attention(mask, attention, mrope=mrope, row_tokens=row)
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if lanes is not None and (not isinstance(lanes, int) or lanes <= 0):
            raise ValueError(f"lanes must be a positive integer, got {lanes!r}")
        self.batch_size, self.shuffle, self.seed = batch_size, bool(shuffle), int(seed)
        self.task_encoder, self.mask, self.shuffle_buffer = task_encoder, mask, int(shuffle_buffer)
        self.infinite, self.on_error, self.lanes = bool(infinite), on_error, lanes
        self.drop_last, self.verify_checksums = bool(drop_last), bool(verify_checksums)
        self.split = split
        self.table = UnitTable.of(self.source)
        self.num_packs = self.source.epoch_packs  # packs of an epoch
        self.batches_per_epoch = epoch_size(self.num_packs, self.world_size, self.batch_size, self.drop_last)[
            0
        ]
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"{self.source.name}: {self.num_packs} packs cannot fill one batch of {batch_size} "
                f"on each of {self.world_size} rank(s); pass drop_last=False to use them in a short batch"
            )
        # as readers give them, whatever the layout stores (packtool.layout rebuilds the rest); a vision-
        # language output's images and their runs too (docs/vision.md), for a task encoder that turns them
        # into the model's inputs (packtool.vision.loader): the default stages would drop them
        self.columns = batch_columns(self.outputs)
        with_images = next((o for o in self.outputs if o.manifest.image_columns), None)
        if with_images is not None and getattr(task_encoder, "encode_sample", None) is None:
            raise ValueError(
                f"{with_images.name}: the packs hold images; read them with packtool.vision.loader's "
                "vision_dataset (or a task encoder whose encode_sample takes the image columns)"
            )
        if self.on_error == "fail":  # before the first batch; under skip, reading the shard counts it
            for output in self.outputs:
                output.require_files()
        self._epoch = 0  # where plain iteration starts (set_epoch)
        # resumed at another world size or batch size (PackedLoader.load_state_dict): the world size and
        # batch size whose order the stream follows, and (epoch, place) where it continues that order
        self.order_layout = (self.world_size, self.batch_size)
        self.resume_at: tuple[int, int] | None = None

    # the stream -------------------------------------------------------------------------------------
    def layout(self, lanes: int | None = None, world_size: int | None = None, batch_size: int | None = None):
        """The ``order.Layout`` of this stream (or of another world size and batch size)."""
        return Layout(
            world_size or self.world_size, batch_size or self.batch_size, lanes or self.lanes or 1,
            self.drop_last, self.seed, self.shuffle, self.shuffle_buffer,
        )  # fmt: skip

    def continue_order(self, order_layout: tuple[int, int], resume_at: tuple[int, int] | None) -> None:
        """Follow the order of ``order_layout`` (``(world_size, batch_size)`` of the run that started it),
        continuing it in epoch ``resume_at[0]`` from place ``resume_at[1]`` of its flat order
        (``order.flat_order``); the loader's ``load_state_dict`` calls it."""
        self.order_layout, self.resume_at = tuple(order_layout), resume_at
        self.batches_per_epoch = self.epoch_batches(None)  # a whole epoch of this stream

    def _start(self, epoch: int | None) -> int | None:
        """Where ``epoch`` (None: any whole epoch) continues the flat order of ``order_layout``; None: this
        layout's own order."""
        if self.resume_at is not None and self.resume_at[0] == epoch:
            return self.resume_at[1]
        if self.order_layout == (self.world_size, self.batch_size):
            return None
        return 0

    def epoch_batches(self, epoch: int | None) -> int:
        """This rank's batches in ``epoch`` (``batches_per_epoch``, but for an epoch in which the stream
        was resumed at another world size or batch size); None: in a whole epoch."""
        origin = self.layout(1, *self.order_layout)
        return resumed_size(self.num_packs, origin, self.layout(), self._start(epoch))

    def plan(self, epoch: int, lanes: int | None = None) -> np.ndarray:
        """This rank's batches of ``epoch`` as packs, int64 ``(batches, batch_size)``, ``-1`` where a short
        batch has none: the pack's index in its output directory for one output; for a mixture, its index
        in the stream's numbering (the sources' packs one after the other: ``table``)."""
        return self._plan(epoch, lanes)[0]

    def _plan(self, epoch: int, lanes: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """``plan`` and each pack's lap in its source's cycle (a mixture's; None for one output)."""
        ids, laps, rng = self.source.sequence(epoch, self.seed, self.shuffle)
        origin = self.layout(lanes, *self.order_layout)
        skip = draw_skip(rng, len(ids), origin)
        start = self._start(epoch)
        units = None
        if self.mixture:  # its lanes cut at its units (order.lanes_by_unit)
            unit = self.table.unit_of(ids)
            units = Units(self.table.output[unit], unit)
        if start is None:
            places = rank_positions(len(ids), skip, origin, epoch=epoch, rank=self.rank, units=units)
        else:  # the order of the world size that started the run, cut into this one's global batches
            flat = flat_order(len(ids), skip, origin, epoch=epoch, units=units)
            places = take(flat, recut(len(flat), start, self.layout(lanes), rank=self.rank))
        return take(ids, places), (take(laps, places) if laps is not None else None)

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
        """The stream from ``start`` = ``(epoch, batch)``: this DataLoader worker's batches (batch ``s`` of
        the stream from ``start`` is worker ``s % num_workers``'s), ``per_parcel`` at a time."""
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, first = start
        reader = _UnitDecoder(self)
        s, items = 0, []  # s: the stream position of batch `first` of `epoch`
        while self.infinite or epoch == start[0]:
            nb = self.epoch_batches(epoch)
            mine = np.arange(first, nb)
            mine = mine[(s + mine - first) % nw == wid]
            if len(mine):
                reader.start_epoch(epoch, *self._plan(epoch), mine)
                for index in mine.tolist():
                    items.append(reader.item(epoch, index))
                    if len(items) == per_parcel:
                        yield _Parcel(wid, items)
                        items = []
            s += max(nb - first, 0)
            epoch, first = epoch + 1, 0
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
        self.ds, self.table, self.epoch, self.plan, self.laps = ds, ds.table, None, None, None
        self.cache: dict[int, PackArrays | None] = {}
        self.readers: dict[int, Any] = {}  # per output, opened when first read
        self.columns = [o.columns(ds.columns) for o in ds.outputs]
        # a mixture counts each source's tokens (the packs' samples' own): from sample_index, read with a
        # unit the first time this worker decodes it, kept while the worker runs (4 bytes a pack)
        self.counted = [ds.mixture and "sample_index" in o.manifest.columns for o in ds.outputs]
        self.tokens: dict[int, np.ndarray] = {}
        self.new_bad: list[int] = []  # units found unreadable since the last item
        self.upcoming: dict[int, int] = {}  # the epoch's units this worker reads, in order of first use
        self.order: list[int] = []
        te = ds.task_encoder
        self.encode_sample = getattr(te, "encode_sample", None)
        self.batch_fn = getattr(te, "batch", None) or default_batch
        self.encode_batch = getattr(te, "encode_batch", None) or self.default_encode_batch
        # no per-pack stage: batches are gathered from the decoded units with array ops
        self.fast = self.encode_sample is None and self.batch_fn is default_batch
        self.default_stages = self.fast and getattr(te, "encode_batch", None) is None
        self.alloc: Callable[[tuple[int, ...], Any], np.ndarray] = np.empty  # for the gathered arrays

    def start_epoch(self, epoch: int, plan: np.ndarray, laps: np.ndarray | None, batches: np.ndarray) -> None:
        self.epoch, self.plan, self.laps = epoch, plan, laps
        ids = plan[batches].reshape(-1)
        units = self.table.unit_of(ids[ids >= 0])
        self.remaining = np.bincount(units, minlength=len(self.table.sizes))
        self.cache.clear()
        self.upcoming = {u: k for k, u in enumerate(dict.fromkeys(units.tolist()))}  # in order of first use
        self.order = list(self.upcoming)

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()

    def unit(self, u: int) -> PackArrays | None:
        if u in self.cache:
            return self.cache[u]
        o = int(self.table.output[u])
        output = self.ds.outputs[o]
        unit = output.units[int(self.table.local[u])]
        if o not in self.readers:
            self.readers[o] = output.open_reader(self.ds.verify_checksums)
        self.prefetch_after(u)
        count = self.counted[o] and u not in self.tokens
        try:
            arrays = self.readers[o].read(unit.shard, unit.part, self.columns[o] + ["sample_index"] * count)
        except UNIT_ERRORS as e:
            if self.ds.on_error == "fail":
                kind = output.unit_kind
                raise InputError(
                    f"cannot read packs ({type(e).__name__}: {e})",
                    source=str(output.shard_path(unit)),
                    row=unit.part if kind else None,
                    row_kind=kind or "row",
                ) from None
            arrays = None
            self.new_bad.append(u)
        self.cache[u] = arrays
        if count and arrays is not None:
            self.tokens[u] = arrays.real_tokens().astype(np.int32)
        return arrays

    def prefetch_after(self, u: int, ahead: int = PREFETCH_UNITS) -> None:
        """Outputs in a store: have the shards of the ``ahead`` units this worker reads after ``u`` fetched in
        the background (``OutputSource.prefetch``)."""
        k = self.upcoming.get(u)
        if k is None:
            return
        for v in self.order[k + 1 : k + 1 + ahead]:
            output = self.ds.outputs[int(self.table.output[v])]
            output.prefetch([output.units[int(self.table.local[v])]])

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
        ds, table = self.ds, self.table
        counts = {"skipped_packs": 0, "skipped_batches": 0, "bad_packs": 0}
        ids = self.plan[index]
        laps = self.laps[index][ids >= 0] if self.laps is not None else None
        ids = ids[ids >= 0]  # the short last batch (drop_last=False)
        units = table.unit_of(ids)
        decoded = self.units_of_batch(units)
        good = np.array([decoded[u] is not None for u in units.tolist()], dtype=bool)
        counts["bad_packs"] = int(len(ids) - good.sum())
        ids, units = ids[good], units[good]
        rows = ids - table.first[units]
        pack_index = table.pack_base[units] + rows  # in the output directory, whatever the split
        source = table.output[units] if ds.mixture else None
        raw = None
        if self.fast and len(ids):
            raw = gather_batch(decoded, units, rows, pack_index, self.alloc)  # = default_batch, no pack dicts
            if source is not None:
                raw["source"] = torch.from_numpy(source)
        elif len(ids):
            packs = []
            for k, (pid, u, row) in enumerate(
                zip(pack_index.tolist(), units.tolist(), rows.tolist(), strict=True)
            ):
                pack = pack_dict(decoded[u], row, pid, tensors=self.encode_sample is not None)
                if source is not None:
                    pack["source"] = int(source[k])
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
        if isinstance(batch, PackedBatch) and isinstance(batch.extra.get("source"), list):  # from pack dicts
            batch.extra["source"] = torch.tensor(batch.extra["source"], dtype=torch.int64)
        if batch is None:
            counts["skipped_batches"] += 1
        names = [self._unit_name(u) for u in self.new_bad]
        self.new_bad = []
        sources = self._drawn(source, units, rows, laps[good]) if source is not None else None
        return _Item(epoch, index, batch, counts, names, sources)

    def _drawn(self, source: np.ndarray, units: np.ndarray, rows: np.ndarray, laps: np.ndarray) -> np.ndarray:
        """Per source of a mixture: the packs of a batch, their tokens (0 where not counted), and the laps
        of its own begun (the highest lap + 1): ``(sources, 3)`` int64. A batch has a few packs: a loop."""
        out = [[0, 0, 0] for _ in self.ds.outputs]
        places = zip(source.tolist(), units.tolist(), rows.tolist(), laps.tolist(), strict=True)
        for s, u, r, lap in places:
            counts = out[s]
            counts[0] += 1
            counts[1] += int(self.tokens[u][r]) if u in self.tokens else 0
            counts[2] = max(counts[2], lap + 1)
        return np.array(out, dtype=np.int64)

    def _unit_name(self, u: int) -> str:
        output = self.ds.outputs[int(self.table.output[u])]
        name = output.unit_name(output.units[int(self.table.local[u])])
        return f"{output.name}/{name}" if self.ds.mixture else name

    def default_encode_batch(self, raw: dict) -> PackedBatch:
        return packed_batch(raw, self.ds.mask, self.ds.manifest.labels, self.ds.attention)
