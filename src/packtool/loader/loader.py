"""``PackedLoader`` / ``get_loader``: a ``PackedDataset`` through ``torch.utils.data.DataLoader``, with one
global cursor that makes resuming exact.

Example::

    from packtool.loader import PackedDataset, get_loader

    ds = PackedDataset("out/", batch_size=8, shuffle=True, seed=0, mask="flex", attention=model.config)
    loader = get_loader(ds, num_workers=2)
    for batch in loader:                      # PackedBatch
        batch = batch.to("cuda")              # the mask is built here, on the device
        ...
    state = loader.state_dict()               # save with the checkpoint
    loader = get_loader(PackedDataset("out/", batch_size=8, shuffle=True, seed=0, mask="flex",
                                      attention=model.config), num_workers=3)
    loader.load_state_dict(state)             # continues with the next batch, nothing replayed

**Resume.** The state (``loader.state``) is one global cursor: ``(epoch, batches consumed in it)`` plus
``lanes`` and what defines the stream. What may change between save and restore: ``num_workers`` (and
``pin_memory``, ``prefetch_factor``, ``mask``, the task encoder), and ``world_size`` and ``batch_size``:
the stream then follows the order of the run that started it, cut into the new global batches
(docs/loader.md, resume semantics). What may not (``load_state_dict`` refuses, naming the field): the
data (one output's ``run_id``, split, pack count and ``shards``, a digest of the split's shard paths and
sha256s, so the state of one run never resumes another run's packs, even one with the same ``run_id``; a
mixture's sources and their shares), ``seed``, ``shuffle``, ``shuffle_buffer``, ``drop_last``. ``lanes``
is taken from the state, so the stream continues exactly; with ``num_workers != lanes`` some units are
decoded by more than one worker.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from packtool.loader.dataset import PARCEL_BATCHES, PackedDataset, ParcelStream, _Item
from packtool.loader.state import (
    FIXED,
    STAT_COUNTS,
    STATE_VERSION,
    check_state,
    data_fields,
    resume_point,
    source_differences,
)


# --- the loader --------------------------------------------------------------------------------------
def _identity(x: Any) -> Any:
    return x


class PackedLoader:
    """Iterates a ``PackedDataset`` through a ``torch.utils.data.DataLoader`` and keeps the global cursor.

    ``iter(loader)`` continues from the cursor: in epoch mode it yields the rest of the current epoch
    (a new epoch each time it is exhausted); in infinite mode it never ends. ``stats`` counts dropped and
    unreadable packs: ``skipped_packs``, ``skipped_batches``, ``bad_packs`` and ``bad_units``.
    """

    def __init__(
        self,
        dataset: PackedDataset,
        num_workers: int,
        device: torch.device | str | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        if dataloader_kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers is not supported: workers are restarted at each iter()")
        self.dataset, self.num_workers, self.device = dataset, num_workers, device
        self.lanes = dataset.lanes or max(1, num_workers)
        self.stream = ParcelStream(dataset)
        self.dataloader = DataLoader(
            self.stream, batch_size=None, num_workers=num_workers, collate_fn=_identity, **dataloader_kwargs
        )
        self.epoch, self.batch = 0, 0
        self.stats: dict[str, Any] = {**dict.fromkeys(STAT_COUNTS, 0), "bad_units": []}
        if dataset.mixture:  # per source: packs and tokens drawn (tokens None where an output has no
            # sample_index to count them from), and the epochs of its own it has begun
            self.stats["sources"] = [
                {"name": o.name, "packs": 0, "tokens": 0 if "sample_index" in o.manifest.columns else None,
                 "epochs": 0}
                for o in dataset.outputs
            ]  # fmt: skip
        self._iterating = False
        self._epoch_size = (-1, 0)  # (epoch, its batches): _batches

    def __len__(self) -> int:
        """Batches per epoch on this rank (also in infinite mode: what an LR schedule counts in)."""
        return self.dataset.batches_per_epoch

    @property
    def drop_last(self):
        """Not a torch ``DataLoader`` setting: what asks for it (accelerate's ``skip_first_batches``, which
        ``Trainer.train(resume_from_checkpoint=...)`` calls) would rebuild a torch ``DataLoader`` over the
        dataset and read the skipped batches again instead of resuming from this loader's state."""
        raise AttributeError(
            "PackedLoader is not a torch DataLoader that accelerate's skip_first_batches can rebuild: give "
            "transformers.Trainer packtool.loader.hf_trainer.trainer_dataloader(trainer, dataset), which "
            "resumes from the checkpoint's loader state"
        )

    def __iter__(self) -> Iterator[Any]:
        ds = self.dataset
        ds.lanes = self.lanes
        self.stream.start = (self.epoch, self.batch)
        self.stream.per_parcel = PARCEL_BATCHES if self.num_workers > 0 else 1
        self._iterating = True
        try:
            for item in self._items():
                if (item.epoch, item.index) != (self.epoch, self.batch):
                    raise RuntimeError(
                        f"loader stream out of order: got batch {item.index} of epoch {item.epoch}, "
                        f"expected {self.batch} of {self.epoch}"
                    )
                self.batch += 1
                self._next_epoch_if_done()
                self._count(item)
                if item.batch is not None:
                    yield item.batch if self.device is None else item.batch.to(self.device)
        finally:
            self._iterating = False

    def _next_epoch_if_done(self) -> None:
        """Move the cursor past the end of its epoch (past an epoch with no batch left, too)."""
        while self.batch >= self._batches(self.epoch):
            self.epoch, self.batch = self.epoch + 1, 0

    def _batches(self, epoch: int) -> int:
        """``dataset.epoch_batches(epoch)``, kept for the epoch the cursor is in (asked every batch)."""
        if self._epoch_size[0] != epoch:
            self._epoch_size = (epoch, self.dataset.epoch_batches(epoch))
        return self._epoch_size[1]

    def _count(self, item: _Item) -> None:
        for k, v in item.counts.items():
            self.stats[k] += v
        for name in item.bad_units:
            if name not in self.stats["bad_units"]:
                self.stats["bad_units"].append(name)
        if item.sources is not None:
            for counts, (packs, tokens, laps) in zip(
                self.stats["sources"], item.sources.tolist(), strict=True
            ):
                counts["packs"] += packs
                counts["tokens"] = None if counts["tokens"] is None else counts["tokens"] + tokens
                counts["epochs"] = max(counts["epochs"], laps)

    def _items(self) -> Iterator[_Item]:
        """The DataLoader's parcels unpacked in stream order: batch ``s`` (from the start of this
        iteration) comes from worker ``s % num_workers``, whose parcels hold its batches in order."""
        nw = max(1, self.num_workers)
        pending: list[deque] = [deque() for _ in range(nw)]
        s = 0
        parcels = iter(self.dataloader)
        try:
            for parcel in parcels:
                pending[parcel.worker].extend(parcel.items)
                while pending[s % nw]:
                    yield pending[s % nw].popleft()
                    s += 1
        finally:  # the workers stopped now: after an error the iterator is in a reference cycle of its
            # traceback, and the garbage collector may close its queues before torch's __del__ sends the
            # workers their last message, which then waits 5 s a worker before it terminates them
            stop = getattr(parcels, "_shutdown_workers", None)
            if stop is not None:
                stop()

    def state_dict(self) -> dict:
        """The global cursor and what defines the stream (a small JSON-able dict)."""
        ds = self.dataset
        resume = ds.resume_at
        stats = {**self.stats, "bad_units": list(self.stats["bad_units"])}
        if "sources" in stats:
            stats["sources"] = [{k: s[k] for k in ("packs", "tokens", "epochs")} for s in stats["sources"]]
        return {
            "format": "packtool-loader",
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "batch": self.batch,
            "lanes": self.lanes,
            **data_fields(ds.source),
            "seed": ds.seed,
            "batch_size": ds.batch_size,
            "world_size": ds.world_size,
            "shuffle": ds.shuffle,
            "shuffle_buffer": ds.shuffle_buffer,
            "drop_last": ds.drop_last,
            "rank": ds.rank,
            "order": {"world_size": ds.order_layout[0], "batch_size": ds.order_layout[1]},
            "start": resume[1] if resume is not None and resume[0] == self.epoch else 0,
            "stats": stats,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from ``state_dict``, at this or another world size and batch size);
        refuses a state whose stream differs, naming what differs."""
        if self._iterating:
            raise RuntimeError("load_state_dict during iteration: call it before iterating the loader")
        state = check_state(state)
        ds = self.dataset
        mine = self.state_dict()
        diff = source_differences(state, mine)
        diff += [
            f"{k}: saved {state[k]!r}, now {mine[k]!r}" for k in FIXED if state[k] != mine[k] and not diff
        ]
        if diff:
            raise ValueError("loader state does not match this dataset: " + "; ".join(diff))
        order, epoch, consumed = resume_point(state, ds.num_packs)
        own = order == (ds.world_size, ds.batch_size) and consumed % (ds.world_size * ds.batch_size) == 0
        self.lanes = ds.lanes = state["lanes"]
        self._epoch_size = (-1, 0)  # the epochs' sizes change with the order
        if own:  # this world size's own order, at a global batch of it
            ds.continue_order(order, None)
            self.epoch, self.batch = epoch, consumed // (ds.world_size * ds.batch_size)
        else:  # the order of the run that started the stream, cut into this world size's batches
            ds.continue_order(order, (epoch, consumed))
            self.epoch, self.batch = epoch, 0
        self._next_epoch_if_done()
        stats = state["stats"]
        self.stats = {
            **self.stats,
            **{k: stats.get(k, 0) for k in STAT_COUNTS},
            "bad_units": list(stats.get("bad_units", [])),
        }
        if "sources" in self.stats and len(stats.get("sources", [])) == len(self.stats["sources"]):
            self.stats["sources"] = [
                {**now, **saved} for now, saved in zip(self.stats["sources"], stats["sources"], strict=True)
            ]


def get_loader(
    dataset: PackedDataset,
    num_workers: int = 2,
    device: torch.device | str | None = None,
    **dataloader_kwargs: Any,
) -> PackedLoader:
    """A ``PackedLoader`` over ``dataset`` with ``num_workers`` DataLoader workers; with ``device``, each
    batch is yielded as ``batch.to(device)`` (int64 tokens, the mask built there: what a trainer that does
    not move batches itself needs, e.g. ``transformers.Trainer`` given this loader).

    ``dataloader_kwargs`` go to ``torch.utils.data.DataLoader`` (``pin_memory``, ``prefetch_factor``,
    ``multiprocessing_context``, ``timeout``...); ``batch_size`` / ``collate_fn`` / ``persistent_workers``
    are the loader's own.

    Example::

        >>> loader = get_loader(PackedDataset("out/", batch_size=8), num_workers=2)  # doctest: +SKIP
        >>> batch = next(iter(loader))  # doctest: +SKIP
    """
    return PackedLoader(dataset, num_workers, device, **dataloader_kwargs)
