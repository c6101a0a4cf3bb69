"""The loader's vision stages: a pack's stored images become the model's inputs in the DataLoader workers.

``VisionTaskEncoder`` is a task encoder for ``packtool.loader.PackedDataset`` (its Energon-style
``encode_sample`` / ``batch`` / ``encode_batch`` stages, which run in the DataLoader workers):

* ``encode_sample(pack)``: the pack's stored image bytes (``images``, in pack order) decoded (Pillow, under
  its decompression-bomb limit: an output directory is untrusted input) and run through the model's image
  processor (``model_inputs.pixel_inputs``): ``pixel_values`` and, for Qwen2-VL, ``image_grid_thw``; each
  image's stored run of image tokens checked against the processor's count for the decoded image and
  against the tokens it covers; with ``get_rope_index``, the pack's M-RoPE position ids ``(3, N)``
  (``positions.pack_mrope_position_ids``: the model's own rule on each sample alone).
* ``batch(packs)``: the text columns as the default stage stacks them (``default_batch``),
  ``pixel_values`` and ``image_grid_thw`` concatenated over the batch's packs in order (the order in
  which LLaVA and Qwen2-VL fill the runs of image tokens of a ``(B, N)`` batch, row after row), the M-RoPE
  ids stacked to ``(3, B, N)``.
* ``encode_batch(raw)``: a ``VisionBatch``: a ``PackedBatch`` (masks, ``cu_seqlens``, ``to(device)``,
  the mapping trainers read) whose ``model_inputs()`` add the image inputs and the M-RoPE ids.

**The M-RoPE rule.** Qwen2-VL's position ids of an image's tokens follow its grid; the rule is the model's
``get_rope_index`` (``model.model.get_rope_index``), and the caller passes it. The rule reads nothing but
the model's config, so it could be rewritten from the processor alone, but then packtool would carry a
copy of each model family's rule, which would silently drift from the model's own (Qwen2.5-VL already
changes it for videos). The bound method is passed instead: with the DataLoader's default ``fork`` start
method the workers share the model's memory, nothing is copied; under ``spawn`` it would pickle the model,
so pass the rule of a model built on the ``meta`` device there (its ``get_rope_index`` needs no weights).
LLaVA uses plain positions: no rule, the text ``position_ids`` are the model's.

Example::

    from packtool.loader import get_loader
    from packtool.vision.loader import vision_dataset
    from packtool.vision.processor import load_processor

    ds = vision_dataset("out/", load_processor("models/Qwen2-VL-2B-Instruct"),
                        get_rope_index=model.model.get_rope_index, batch_size=4, mask="dense")
    for batch in get_loader(ds, num_workers=2):          # VisionBatch
        loss = model(**batch.to("cuda")).loss             # pixel_values, image_grid_thw, (3, B, N) positions
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from packtool.arrays import ranges
from packtool.errors import InputError
from packtool.loader.batch import PackedBatch, default_batch, packed_batch
from packtool.loader.dataset import PackedDataset
from packtool.manifest import Manifest
from packtool.schema import IMAGE_COLUMNS  # a pack's stored image columns: what encode_sample replaces
from packtool.vision.model_inputs import decode_images, pixel_inputs
from packtool.vision.positions import GetRopeIndex, pack_mrope_position_ids
from packtool.vision.processor import VisionProcessor

# what encode_sample adds and batch / encode_batch carry
VISION_FIELDS = ("pixel_values", "image_grid_thw", "mrope_position_ids", "images_per_pack")


@dataclass
class VisionBatch(PackedBatch):
    """A ``PackedBatch`` of vision-language packs, with the model's image inputs.

    Attributes (beyond ``PackedBatch``'s):
        pixel_values: the batch's images in pack order, packs in batch order, as the image processor gives
            them: LLaVA ``(num_images, 3, H, W)``, Qwen2-VL ``(num_patches, C * T * P * P)``; ``None`` when
            no pack of the batch has an image.
        image_grid_thw: ``(num_images, 3)`` int64 (Qwen2-VL), else ``None``.
        mrope_position_ids: ``(3, B, N)`` int32 on the host (int64 in ``model_inputs()``), the M-RoPE ids of
            every pack (each sample's through the model's rule), or ``None`` for a model without M-RoPE.
        images_per_pack: ``(B,)`` int32, how many of the images belong to each pack.

    ``model_inputs()`` (and so ``model(**batch)``): the text batch's inputs (``PackedBatch.model_inputs``)
    with ``pixel_values`` and ``image_grid_thw``; ``position_ids`` become the M-RoPE ids ``(3, B, N)``
    (``dense``, ``additive``, ``flex``), or, flattened (``varlen``: one row of ``B * N`` tokens), the text
    positions in front of them, ``(4, 1, B * N)``: the layout from which transformers' Qwen2-VL finds the
    sequence boundaries.
    """

    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    mrope_position_ids: torch.Tensor | None = None
    images_per_pack: torch.Tensor | None = None

    def model_inputs(self) -> dict[str, Any]:
        if self._inputs is not None:
            return self._inputs
        inputs = super().model_inputs()
        if self.pixel_values is not None:
            inputs["pixel_values"] = self.pixel_values
        if self.image_grid_thw is not None:
            inputs["image_grid_thw"] = self.image_grid_thw
        if self.mrope_position_ids is not None:
            mrope = self.mrope_position_ids.to(torch.int64)
            if self.mask == "varlen":
                text = inputs["position_ids"].view(1, 1, -1)
                inputs["position_ids"] = torch.cat([text, mrope.reshape(3, 1, -1)], dim=0)
            else:
                inputs["position_ids"] = mrope
        return inputs


def _image_bytes(value: Any) -> bytes:
    """A stored image: its bytes, or the ``{"bytes", "path"}`` struct the Parquet ``images`` column holds."""
    return value["bytes"] if isinstance(value, dict) else bytes(value)


def _concat(parts: list[torch.Tensor], shared: bool) -> torch.Tensor:
    """``torch.cat(parts)``; with ``shared``, inside a DataLoader worker, written into shared memory, so that
    the batch goes to the main process without another copy (a parcel sends a shared tensor as it is)."""
    if not shared or get_worker_info() is None:
        return torch.cat(parts)
    out = torch.empty((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), dtype=parts[0].dtype)
    return torch.cat(parts, out=out.share_memory_())


class VisionTaskEncoder:
    """The vision stages of ``PackedDataset`` (module docstring); ``vision_dataset`` builds both.

    Args:
        processor: the model's processor (``load_processor(DIR)``).
        get_rope_index: the model's M-RoPE rule (``model.model.get_rope_index``) for Qwen2-VL and
            Qwen2.5-VL; ``None`` for models with plain positions (LLaVA).
        mask, labels_convention: as the dataset's (``PackedDataset.mask``, the manifest's ``labels``).
        dtype: ``pixel_values`` cast to it (the model's dtype), else the processor's float32.

    A pack (the dict ``encode_sample`` takes) holds the text columns, ``pack_index`` and the stored image
    columns: ``images`` (bytes, or ``{"bytes", "path"}``), ``image_offset`` and ``image_length`` (each
    image's run of image tokens in the pack), in pack order.
    """

    def __init__(
        self,
        processor: VisionProcessor,
        get_rope_index: GetRopeIndex | None = None,
        *,
        mask: str = "varlen",
        labels_convention: str = "shifted",
        dtype: torch.dtype | None = None,
    ) -> None:
        self.processor, self.get_rope_index = processor, get_rope_index
        self.mask, self.labels_convention, self.dtype = mask, labels_convention, dtype

    def encode_sample(self, pack: dict) -> dict:
        """``pack`` with its image columns replaced by ``pixel_values`` (``None`` without images),
        ``image_grid_thw`` (or ``None``), ``mrope_position_ids`` ``(3, N)`` (with ``get_rope_index``)."""
        encoded = [_image_bytes(v) for v in pack.get("images") or []]
        offsets = np.asarray(pack.get("image_offset", ()), dtype=np.int64)
        lengths = np.asarray(pack.get("image_length", ()), dtype=np.int64)
        input_ids = np.asarray(pack["input_ids"])
        where = f"pack {pack.get('pack_index')}"
        if not len(encoded) == len(offsets) == len(lengths):
            raise InputError(
                f"{where}: {len(encoded)} images but {len(offsets)} image offsets and {len(lengths)} lengths"
            )
        try:
            images = decode_images(encoded)
        except (OSError, ValueError) as e:  # Pillow's UnidentifiedImageError is an OSError
            raise InputError(f"{where}: cannot decode image: {e}") from None
        self._check_spans(where, input_ids, images, offsets, lengths)
        out = {k: v for k, v in pack.items() if k not in IMAGE_COLUMNS}
        inputs = pixel_inputs(self.processor, images, self.dtype)
        out["pixel_values"] = inputs.get("pixel_values")
        out["image_grid_thw"] = inputs.get("image_grid_thw")
        out["images_per_pack"] = len(images)
        if self.get_rope_index is not None:
            out["mrope_position_ids"] = pack_mrope_position_ids(
                self.get_rope_index, input_ids, pack["seq_lens"], offsets, lengths, out["image_grid_thw"]
            ).to(torch.int32)
        return out

    def _check_spans(
        self, where: str, input_ids: np.ndarray, images: list, offsets: np.ndarray, lengths: np.ndarray
    ) -> None:
        """Each image's run: the processor's count for the decoded image, inside the pack, on image tokens
        only, and every image token of the pack in one run (else the model would take features elsewhere)."""
        n = len(input_ids)
        for k, image in enumerate(images):
            want = self.processor.image_tokens(image.height, image.width)
            if lengths[k] != want or offsets[k] < 0 or offsets[k] + lengths[k] > n:
                raise InputError(
                    f"{where}: image {k} ({image.width}x{image.height}) has a run of {lengths[k]} tokens at "
                    f"{offsets[k]}; the processor makes {want}, in a pack of {n}"
                )
        covered = np.zeros(n, dtype=bool)
        covered[ranges(offsets, lengths)] = True
        if not np.array_equal(covered, input_ids == self.processor.image_token_id):
            raise InputError(f"{where}: the image runs do not cover the pack's image tokens exactly")

    def batch(self, packs: list[dict]) -> dict:
        """The default stage's batch of the text columns, ``pixel_values`` / ``image_grid_thw`` concatenated
        in order, ``mrope_position_ids`` stacked to ``(3, B, N)``, ``images_per_pack`` ``(B,)`` int32."""
        raw = default_batch([{k: v for k, v in p.items() if k not in VISION_FIELDS} for p in packs])
        for name in ("pixel_values", "image_grid_thw"):
            parts = [p[name] for p in packs if p.get(name) is not None]
            raw[name] = _concat(parts, shared=name == "pixel_values") if parts else None
        with_mrope = "mrope_position_ids" in packs[0]
        raw["mrope_position_ids"] = (
            torch.stack([p["mrope_position_ids"] for p in packs], dim=1) if with_mrope else None
        )
        raw["images_per_pack"] = torch.tensor([p["images_per_pack"] for p in packs], dtype=torch.int32)
        return raw

    def encode_batch(self, raw: dict) -> VisionBatch:
        text = packed_batch(
            {k: v for k, v in raw.items() if k not in VISION_FIELDS}, self.mask, self.labels_convention
        )
        fields = {f.name: getattr(text, f.name) for f in dataclasses.fields(text) if f.init}
        return VisionBatch(**fields, **{name: raw.get(name) for name in VISION_FIELDS})


def vision_dataset(
    directory: str | Path,
    processor: VisionProcessor,
    get_rope_index: GetRopeIndex | None = None,
    *,
    dtype: torch.dtype | None = None,
    **dataset_kwargs: Any,
) -> PackedDataset:
    """A ``PackedDataset`` of ``directory`` (``dataset_kwargs``: batch size, mask, shuffle, ...) whose batches
    are ``VisionBatch`` objects: a ``VisionTaskEncoder`` with the dataset's mask and labels convention."""
    if "task_encoder" in dataset_kwargs:
        raise ValueError("vision_dataset sets the task encoder; build PackedDataset yourself for another")
    encoder = VisionTaskEncoder(
        processor,
        get_rope_index,
        mask=dataset_kwargs.get("mask", "varlen"),
        labels_convention=Manifest.load(Path(directory)).labels,
        dtype=dtype,
    )
    return PackedDataset(directory, task_encoder=encoder, **dataset_kwargs)
