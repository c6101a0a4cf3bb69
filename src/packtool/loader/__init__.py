"""Train time: stream a packtool output directory, or a mixture of them, into PyTorch.

The sources (``loader.sources``: one output, or a mixture of outputs at weights or repeats, from
``{directory: weight}`` or a mixture file), ``PackedDataset`` (the stream: order, ranks, workers, shuffle;
``loader.dataset``), ``get_loader`` /
``PackedLoader`` (a ``torch.utils.data.DataLoader`` with an exact resume cursor; ``loader.loader``),
``PackedBatch`` and the Energon-style batching helpers (``loader.batch``), the epoch's order computed
from pack indices alone (``loader.order``), and ``collate_packs`` for packs read by other libraries
(``loader.collate``), and which mask paths train a model exactly (``loader.fit``).

Example::

    from packtool.loader import PackedDataset, get_loader

    ds = PackedDataset("out/", batch_size=8, shuffle=True, seed=0, mask="flex", attention=model.config)
    loader = get_loader(ds, num_workers=2)
    for batch in loader:                      # PackedBatch
        batch = batch.to("cuda")              # the mask is built here, on the device
"""

import importlib
from typing import TYPE_CHECKING

# name -> the module that defines it, imported on first use (PEP 562): ``packtool.loader.order`` and
# ``sources`` need no torch, so ``packtool inspect`` of a mixture does not pay for importing it
_HOMES = {
    "MASKS": "batch",
    "IgnoreSample": "batch",
    "PackedBatch": "batch",
    "SkipSample": "batch",
    "batch_list": "batch",
    "batch_pad_stack": "batch",
    "batch_stack": "batch",
    "default_batch": "batch",
    "gather_batch": "batch",
    "collate_packs": "collate",
    "PackedDataset": "dataset",
    "masks_for_model": "fit",
    "PackedLoader": "loader",
    "get_loader": "loader",
    "Unit": "order",
    "epoch_plan": "order",
    "units_of": "order",
    "Mixture": "sources",
    "OutputSource": "sources",
    "open_source": "sources",
}

if TYPE_CHECKING:
    from packtool.loader.batch import (
        MASKS,
        IgnoreSample,
        PackedBatch,
        SkipSample,
        batch_list,
        batch_pad_stack,
        batch_stack,
        default_batch,
        gather_batch,
    )
    from packtool.loader.collate import collate_packs
    from packtool.loader.dataset import PackedDataset
    from packtool.loader.fit import masks_for_model
    from packtool.loader.loader import PackedLoader, get_loader
    from packtool.loader.order import Unit, epoch_plan, units_of
    from packtool.loader.sources import Mixture, OutputSource, open_source


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'packtool.loader' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"packtool.loader.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "MASKS",
    "IgnoreSample",
    "Mixture",
    "OutputSource",
    "PackedBatch",
    "PackedDataset",
    "PackedLoader",
    "SkipSample",
    "Unit",
    "collate_packs",
    "batch_list",
    "batch_pad_stack",
    "batch_stack",
    "default_batch",
    "epoch_plan",
    "gather_batch",
    "get_loader",
    "masks_for_model",
    "open_source",
    "units_of",
]
