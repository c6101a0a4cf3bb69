"""``PackedLoader`` / ``get_loader``: a ``PackedDataset`` through ``torch.utils.data.DataLoader``, with one
global cursor that makes resuming exact.

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

**Resume.** The state is one global cursor: ``(epoch, batches consumed in it)`` plus ``lanes``. What may
change between save and restore: ``num_workers`` (and ``pin_memory``, ``prefetch_factor``, ``mask``, the
task encoder). What may not (``load_state_dict`` refuses): the data (``run_id``, pack count), ``seed``,
``batch_size``, ``world_size``, ``shuffle``, ``shuffle_buffer``, ``drop_last``; ``lanes`` is taken from
the state, so the stream continues exactly; with ``num_workers != lanes`` some units are decoded by more
than one worker.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from packtool.loader.dataset import PARCEL_BATCHES, PackedDataset, _Item

STATE_VERSION = 1


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
        """Batches per epoch on this rank (also in infinite mode: what an LR schedule counts in)."""
        return self.dataset.batches_per_epoch

    def __iter__(self) -> Iterator[Any]:
        ds = self.dataset
        ds._start, ds.lanes = (self.epoch, self.batch), self.lanes
        ds._parcel_batches = PARCEL_BATCHES if self.num_workers > 0 else 1
        nb = ds.batches_per_epoch
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
            "run_id": ds.manifest.run_id,
            "num_packs": ds.num_packs,
            "seed": ds.seed,
            "batch_size": ds.batch_size,
            "world_size": ds.world_size,
            "shuffle": ds.shuffle,
            "shuffle_buffer": ds.shuffle_buffer,
            "drop_last": ds.drop_last,
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
        state = {"drop_last": True, **state}  # states saved before drop_last existed
        fixed = (
            "run_id",
            "num_packs",
            "seed",
            "batch_size",
            "world_size",
            "shuffle",
            "shuffle_buffer",
            "drop_last",
        )
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
