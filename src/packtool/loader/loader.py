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

**Resume.** The state is one global cursor: ``(epoch, batches consumed in it)`` plus ``lanes``. What may
change between save and restore: ``num_workers`` (and ``pin_memory``, ``prefetch_factor``, ``mask``, the
task encoder). What may not (``load_state_dict`` refuses): the data (``run_id``, the split, pack count,
and ``shards``: a digest of the split's shard paths and sha256s from the manifest, so the state of one run
never resumes another run's packs, even one with the same ``run_id``), ``seed``, ``batch_size``,
``world_size``, ``shuffle``, ``shuffle_buffer``, ``drop_last``; ``lanes`` is taken from the state, so the
stream continues exactly; with ``num_workers != lanes`` some units are decoded by more than one worker.
Every field of a state is checked (type and range) before it is used: a damaged or hand-edited state
raises ``ValueError`` naming the field.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from packtool.loader.dataset import PARCEL_BATCHES, PackedDataset, ParcelStream, _Item
from packtool.manifest import Manifest

STATE_VERSION = 1
_STAT_COUNTS = ("skipped_packs", "skipped_batches", "bad_packs")
# the fields that define the stream: a state resumes only the same stream
_FIXED = ("run_id", "split", "shards", "num_packs", "seed", "batch_size", "world_size", "shuffle",
          "shuffle_buffer", "drop_last")  # fmt: skip
# the type of every field of a state; states saved before a field existed get its default here
_TYPES = {
    "epoch": int, "batch": int, "lanes": int, "run_id": str, "split": (str, type(None)), "shards": str,
    "num_packs": int, "seed": int, "batch_size": int, "world_size": int, "shuffle": bool,
    "shuffle_buffer": int, "drop_last": bool, "rank": int, "stats": dict,
}  # fmt: skip
_OLDER = {"drop_last": True}  # fields a state of this version may lack (saved before they existed)
INT64_MAX = (1 << 63) - 1  # a state's counts are used as NumPy int64
# lanes: the DataLoader workers of the loader that saved the state (torch starts one process each)
MAX_STATE_INT = {"lanes": 1 << 16}


def shards_digest(manifest: Manifest, split: str | None) -> str:
    """sha256 over the paths and sha256s of the shards of ``split``, from the manifest: what a loader
    state (and ``trl_dataset``'s cache) binds to, besides ``run_id``."""
    h = hashlib.sha256()
    for _, entry in manifest.split_shards(split):
        h.update(f"{entry.path}\0{entry.sha256}\n".encode())
    return h.hexdigest()


def _field_error(key: str, value: Any, want: str) -> ValueError:
    return ValueError(f"loader state: field {key!r} must be {want}, got {value!r}")


def check_state(state: Any) -> dict:
    """``state`` with every field checked (``ValueError`` naming the first bad field) and the defaults
    of fields older states lack."""
    if not isinstance(state, dict):
        raise ValueError(
            f"loader state: must be a dict (from PackedLoader.state_dict), got {type(state).__name__}"
        )
    if state.get("format") != "packtool-loader" or state.get("version") != STATE_VERSION:
        raise ValueError("not a packtool loader state (or from another version)")
    state = {**_OLDER, **state}
    for key, kind in _TYPES.items():
        if key not in state:
            raise ValueError(f"loader state: field {key!r} is missing")
        value = state[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # bool is an int in Python: an int field takes no bool, a bool field no int
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise _field_error(
                key, value, " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            )
        if kinds == (int,) and value < (1 if key in ("lanes", "batch_size", "world_size") else 0):
            raise _field_error(
                key, value, "positive" if key in ("lanes", "batch_size", "world_size") else "non-negative"
            )
        if kinds == (int,) and value > MAX_STATE_INT.get(key, INT64_MAX):  # no loader runs that many
            raise _field_error(key, value, f"at most {MAX_STATE_INT.get(key, INT64_MAX):,}")
    stats = state["stats"]
    for key in _STAT_COUNTS:
        value = stats.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _field_error(f"stats.{key}", value, "a non-negative int")
    units = stats.get("bad_units", [])
    if not isinstance(units, list) or not all(isinstance(u, str) for u in units):
        raise _field_error("stats.bad_units", units, "a list of strings")
    return state


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
                    yield item.batch if self.device is None else item.batch.to(self.device)
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
            "split": ds.split,
            "shards": shards_digest(ds.manifest, ds.split),
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
        state = check_state(state)
        ds = self.dataset
        mine = self.state_dict()
        diff = [f"{k}: saved {state[k]!r}, now {mine[k]!r}" for k in _FIXED if state[k] != mine[k]]
        if diff:
            raise ValueError("loader state does not match this dataset: " + "; ".join(diff))
        if state["batch"] >= ds.batches_per_epoch:
            raise _field_error(
                "batch", state["batch"], f"below the batches per epoch ({ds.batches_per_epoch})"
            )
        self.epoch, self.batch, self.lanes = state["epoch"], state["batch"], state["lanes"]
        stats = state["stats"]
        self.stats = {
            **{k: stats.get(k, 0) for k in _STAT_COUNTS},
            "bad_units": list(stats.get("bad_units", [])),
        }


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
