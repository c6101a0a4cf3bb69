"""``collate_packs``: a batch of packs read by any library, as one ``PackedBatch``.

``packtool.loader`` batches packs itself. Users of other readers (a plain ``torch.utils.data.DataLoader``,
``webdataset``'s ``.batched()``, ``wids``, Hugging Face ``datasets``, ``packtool.read_packs``) need a
collate function: torch's ``default_collate`` and webdataset's fail on ``seq_lens``, the one ragged field,
and the token columns come back as stored (int32), which ``F.cross_entropy`` refuses as targets.

``collate_packs`` takes the packs as each library gives them (field names ``input_ids``,
``input_ids.npy`` from webdataset, ``.input_ids.npy`` from wids; NumPy arrays, tensors or lists; or
objects with the fields as attributes, e.g. Energon's ``PackSample``) and returns a ``PackedBatch``:
``(B, N)`` token tensors, int64 by default, ``seq_lens`` padded with 0, ``cu_seqlens`` / ``max_seqlen``,
and the mask asked for, built on the host (or by ``batch.to(device)``).

Example::

    import webdataset as wds
    from packtool.loader import collate_packs

    ds = wds.WebDataset(urls, shardshuffle=False).decode().batched(8, collation_fn=collate_packs)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)   # or DataLoader(packs, 8, collate_fn=...)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from packtool.loader.batch import MASKS, PackedBatch, packed_batch
from packtool.manifest import TOKEN_COLUMNS
from packtool.masks import SEQ_LENS_PAD

REQUIRED = ("input_ids", "labels", "position_ids", "seq_lens")
_KEY = re.compile(r"^\.?(?P<name>[A-Za-z_]+)(?:\.npy)?$")


def _fields(sample: Any) -> dict[str, Any]:
    """The pack fields of one sample, by their plain names (``.input_ids.npy`` -> ``input_ids``)."""
    if not isinstance(sample, Mapping):
        return {
            k: getattr(sample, k)
            for k in (*TOKEN_COLUMNS, "seq_lens")
            if getattr(sample, k, None) is not None
        }
    out = {}
    for key, value in sample.items():
        match = _KEY.match(str(key))
        if match and (match["name"] in TOKEN_COLUMNS or match["name"] == "seq_lens") and value is not None:
            out[match["name"]] = value
    return out


def _pack_index(sample: Any) -> int | None:
    """The pack's index in its output directory, when the sample says it (its key, or ``pack_index``)."""
    get = sample.get if isinstance(sample, Mapping) else lambda k: getattr(sample, k, None)
    value = get("pack_index")
    if value is None and isinstance(get("json"), Mapping):
        value = get("json").get("pack_index")
    if value is None:
        value = get("__key__")
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _array(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.numpy()
    return np.asarray(value)


def collate_packs(samples: Sequence[Any], *, mask: str = "varlen", int64: bool = True) -> PackedBatch:
    """Collate packs, as any reader gives them, into one ``PackedBatch``.

    Args:
        samples: pack dicts or objects (see the module docstring); every one with ``input_ids``,
            ``labels``, ``position_ids`` and ``seq_lens``; ``loss_mask`` when the data has one.
        mask: ``varlen`` (``cu_seqlens`` only), ``dense`` (``attention_mask``, bool, for SDPA),
            ``additive`` (``attention_mask``, 0 / -inf, for eager) or ``flex`` (``block_mask``), built here
            on the host; ``batch.to(device)`` builds it again there.
        int64: widen ``input_ids``, ``labels``, ``position_ids`` and ``loss_mask`` to int64 (what
            embeddings and ``F.cross_entropy`` take); ``False`` keeps the stored int32 / int8.
    """
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {', '.join(MASKS)}, got {mask!r}")
    if not samples:
        raise ValueError("collate_packs: no packs to collate")
    fields = [_fields(s) for s in samples]
    missing = [k for k in REQUIRED if any(k not in f for f in fields)]
    if missing:
        minimal = " (an output of --columns minimal: read it with packtool.read_packs or packtool.loader)"
        raise ValueError(
            f"collate_packs: a pack has no {', '.join(missing)} (fields seen: {', '.join(sorted(fields[0]))})"
            + (minimal if "input_ids" in fields[0] and "position_ids" not in fields[0] else "")
        )
    columns: dict[str, torch.Tensor | None] = {}
    for name in TOKEN_COLUMNS:
        if not all(name in f for f in fields):
            columns[name] = None
            continue
        values = [_array(f[name]) for f in fields]
        lengths = {v.shape for v in values}
        if len(lengths) != 1:
            raise ValueError(
                f"collate_packs: packs of different sizes in one batch ({name}: {sorted(lengths)})"
            )
        stacked = torch.from_numpy(np.stack(values))
        columns[name] = stacked.to(torch.int64) if int64 else stacked
    pieces = [_array(f["seq_lens"]).astype(np.int32, copy=False) for f in fields]
    seq_lens = np.full((len(pieces), max(1, *(len(p) for p in pieces))), SEQ_LENS_PAD, dtype=np.int32)
    for j, piece in enumerate(pieces):
        seq_lens[j, : len(piece)] = piece
    ids = [_pack_index(s) for s in samples]
    raw = {**columns, "seq_lens": torch.from_numpy(seq_lens), "pack_index": None if None in ids else ids}
    batch = packed_batch(raw, mask)
    return batch.build_mask()
