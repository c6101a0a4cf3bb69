"""``collate_packs``: a batch of packs read by any library, as one ``PackedBatch``.

``packtool.loader`` batches packs itself. Users of other readers (a plain ``torch.utils.data.DataLoader``,
``webdataset``'s ``.batched()``, ``wids``, Hugging Face ``datasets``, ``packtool.read_packs``) need a
collate function: torch's ``default_collate`` and webdataset's fail on ``seq_lens``, the one ragged field,
and the token columns come back as stored (int32), which ``F.cross_entropy`` refuses as targets.

A vision-language output's packs (images beside the tokens) are refused: a text batch would drop the
images; ``packtool.vision.loader.vision_dataset`` reads them.

``collate_packs`` takes the packs as each library gives them (field names ``input_ids``,
``input_ids.npy`` from webdataset, ``.input_ids.npy`` from wids; NumPy arrays, tensors or lists; or
objects with the fields as attributes, e.g. Energon's ``PackSample``) and returns a ``PackedBatch``:
``(B, N)`` token tensors, int64 by default, ``seq_lens`` padded with 0, ``cu_seqlens`` / ``max_seqlen``,
``cp_padding`` / ``cu_seqlens_unpadded`` for a ``--cp-size`` output, and the mask asked for, built on the
host (or by ``batch.to(device)``). As a mapping the batch is the model's keyword arguments
(``PackedBatch.model_inputs``), so it is a ``data_collator`` for ``transformers.Trainer`` (with
``TrainingArguments(remove_unused_columns=False)``: the Trainer would drop ``seq_lens`` otherwise).

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

from packtool.loader.batch import LABELS, MASKS, PackedBatch, packed_batch
from packtool.loader.fit import model_attention
from packtool.manifest import IMAGE_COLUMNS, TOKEN_COLUMNS
from packtool.masks import SEQ_LENS_PAD

REQUIRED = ("input_ids", "labels", "position_ids", "seq_lens")
PACK_FIELDS = (*TOKEN_COLUMNS, "seq_lens", "cp_padding")  # what a pack of any reader may give
_KEY = re.compile(r"^\.?(?P<name>[A-Za-z_]+)(?:\.npy)?$")
_IMAGE_MEMBER = re.compile(r"^\.?img\d+\.[A-Za-z0-9]+$")  # a vision tar pack's KEY.img{k}.{ext}
VISION_READERS = (
    "packtool.vision.loader.vision_dataset (or, with Megatron-Energon, "
    "packtool.vision.energon.VisionPackTaskEncoder)"
)


def _fields(sample: Any) -> dict[str, Any]:
    """The pack fields of one sample, by their plain names (``.input_ids.npy`` -> ``input_ids``)."""
    if not isinstance(sample, Mapping):
        return {k: getattr(sample, k) for k in PACK_FIELDS if getattr(sample, k, None) is not None}
    out = {}
    for key, value in sample.items():
        match = _KEY.match(str(key))
        if match and match["name"] in PACK_FIELDS and value is not None:
            out[match["name"]] = value
    return out


def _has_images(sample: Any) -> bool:
    """Whether a pack holds images: an image column (``images``, ``image_offset``, ...), a tar pack's
    ``img{k}.{ext}`` member, or such an attribute."""
    if not isinstance(sample, Mapping):
        return any(getattr(sample, name, None) is not None for name in IMAGE_COLUMNS)
    for key in sample:
        match = _KEY.match(str(key))
        if (match and match["name"] in IMAGE_COLUMNS) or _IMAGE_MEMBER.match(str(key)):
            return True
    return False


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


def collate_packs(
    samples: Sequence[Any],
    *,
    mask: str = "varlen",
    int64: bool = True,
    labels: str = "shifted",
    attention: Any = None,
) -> PackedBatch:
    """Collate packs, as any reader gives them, into one ``PackedBatch``.

    Args:
        samples: pack dicts or objects (see the module docstring); every one with ``input_ids``,
            ``labels``, ``position_ids`` and ``seq_lens``; ``loss_mask`` when the data has one.
        mask: ``varlen`` (``cu_seqlens`` only), ``dense`` (``attention_mask``, bool, for SDPA),
            ``additive`` (``attention_mask``, 0 / -inf, for eager) or ``flex`` (``block_mask``), built here
            on the host; ``batch.to(device)`` builds it again there.
        int64: widen ``input_ids``, ``labels``, ``position_ids`` and ``loss_mask`` to int64 (what
            embeddings and ``F.cross_entropy`` take); ``False`` keeps the stored int32 / int8.
        labels: the output's ``labels`` convention (its manifest's ``labels``: ``shifted``, packtool's
            default, or ``unshifted``), which the batch's ``shift_labels()`` / ``model_inputs()`` follow.
        attention: the model's transformers config (``model.config``; the path is checked against the
            model, ``loader.fit``), or ``"causal"`` or a ``masks.AttentionPattern`` for a model of your own:
            the masks keep each query inside its sliding window too, one per layer type; required for the
            ``dense``, ``additive`` and ``flex`` masks (as ``PackedDataset(attention=...)``).
    """
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {', '.join(MASKS)}, got {mask!r}")
    if not samples:
        raise ValueError("collate_packs: no packs to collate")
    if labels not in LABELS:
        raise ValueError(f"labels must be one of {', '.join(LABELS)}, got {labels!r}")
    if any(_has_images(s) for s in samples):
        raise ValueError(
            "collate_packs: the packs hold images, which a text batch would drop (the model would train on "
            f"its image tokens as text): read a vision-language output with {VISION_READERS}"
        )
    fields = [_fields(s) for s in samples]
    missing = [k for k in REQUIRED if any(k not in f for f in fields)]
    if missing:
        raise ValueError(
            f"collate_packs: a pack has no {', '.join(missing)} (fields seen: {', '.join(sorted(fields[0]))})"
            + _why_missing(samples[0], fields[0], missing)
        )
    row = len(_array(fields[0]["input_ids"])) * (len(samples) if mask == "varlen" else 1)  # the model's rows
    pattern = model_attention(mask, attention, row_tokens=row)
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
    if all("cp_padding" in f for f in fields):  # --cp-size: one value per piece, the first of seq_lens
        cp = [_array(f["cp_padding"]).astype(np.int32, copy=False) for f in fields]
        raw["cp_padding"] = torch.zeros((len(cp), max(1, *(len(c) for c in cp))), dtype=torch.int32)
        for j, values in enumerate(cp):
            raw["cp_padding"][j, : len(values)] = torch.from_numpy(values)
    batch = packed_batch(raw, mask, labels, pattern)
    return batch.build_mask()


def _why_missing(sample: Any, fields: dict, missing: list[str]) -> str:
    """What a pack without the required fields most likely went through."""
    names = set(sample) if isinstance(sample, Mapping) else set()
    if "seq_lengths" in names:
        return (
            " (a row of packtool.loader.trl_dataset: TRL's own collator reads it, with "
            "SFTConfig(padding_free=True); collate_packs takes the packs as packtool wrote them)"
        )
    if "input_ids" in fields and "position_ids" not in fields:
        return " (an output of --columns minimal: read it with packtool.read_packs or packtool.loader)"
    if missing == ["seq_lens"] or set(missing) <= {"seq_lens", "position_ids"}:
        return (
            " (transformers.Trainer drops the columns its model does not take: pass "
            "TrainingArguments(remove_unused_columns=False) with data_collator=collate_packs)"
        )
    return ""
