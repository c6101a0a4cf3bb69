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
