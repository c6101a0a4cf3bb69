"""The loader's vision stages: a pack's stored images become the model's inputs in the DataLoader workers.

``VisionTaskEncoder`` is a task encoder for ``packtool.loader.PackedDataset`` (its Energon-style
``encode_sample`` / ``batch`` / ``encode_batch`` stages, which run in the DataLoader workers):

* ``encode_sample(pack)``: the pack's stored image bytes (``images``, in pack order) decoded as
  ``Image.open`` gives them (Pillow, under its decompression-bomb limit: an output directory is untrusted
  input); each image's stored span checked against the processor's ids for the decoded image's size
  (``VisionProcessor.expansion``), and every image token of the pack inside a span; the images of each
  sample of the pack run through the model's processor as that sample alone would be
  (``model_inputs.image_inputs``): ``pixel_values`` and the family's other image inputs
  (``image_grid_thw``, ``image_sizes``, ``pixel_attention_mask``, ``batch_num_images``); for a model that
  takes ``token_type_ids`` marking its image tokens (Gemma 3), those of the pack; with ``get_rope_index``,
  the pack's M-RoPE position ids ``(3, N)`` (``positions.pack_mrope_position_ids``: the model's own rule
  on each sample alone); for a cross-attention model (Llama 3.2 Vision), the pack's images as one row of
  its inputs and its ``cross_attention_mask`` (``cross_attention``: each sample's text on its own images).
* ``batch(packs)``: the text columns as the default stage stacks them (``default_batch``), the image
  inputs concatenated over the batch's packs in order (the order in which the models fill the image
  tokens of a ``(B, N)`` batch, row after row; shorter ones padded with zeros: ``concat_padded``), the
  M-RoPE ids stacked to ``(3, B, N)``.
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

**Attention inside an image.** Gemma 3 attends both ways among the tokens of one image (its
``token_type_ids``); the ``dense`` and ``additive`` masks of such a batch hold those blocks. ``varlen``
and ``flex`` are refused for it: flattened, transformers' Gemma 3 builds the image blocks itself but its
sliding-window layers then attend across the packed samples. A processor whose ``token_type_ids`` mark
something a pack of several samples cannot hold (PaliGemma's prefix) is refused.

Example::

    from packtool.loader import get_loader
    from packtool.vision.loader import vision_dataset
    from packtool.vision.processor import load_processor

    ds = vision_dataset("out/", load_processor("models/Qwen2-VL-2B-Instruct"),
                        get_rope_index=model.model.get_rope_index, batch_size=4, mask="dense",
                        attention=model.config)
    for batch in get_loader(ds, num_workers=2):          # VisionBatch
        loss = model(**batch.to("cuda")).loss             # pixel_values, image_grid_thw, (3, B, N) positions
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from packtool.arrays import ranges
from packtool.errors import InputError
from packtool.loader.batch import PackedBatch, batch_stack, default_batch, packed_batch
from packtool.loader.dataset import PackedDataset
from packtool.loader.fit import model_attention
from packtool.loader.sources import open_source
from packtool.schema import IMAGE_COLUMNS
from packtool.vision.cross_attention import (
    attend_own_images,
    batch_cross_attention_mask,
    batch_rows,
    flattened_cross_attention,
    is_cross_attention_model,
    pack_cross_attention_mask,
)
from packtool.vision.model_inputs import concat_padded, decode_images, image_inputs, token_type_rule
from packtool.vision.positions import GetRopeIndex, pack_mrope_position_ids
from packtool.vision.processor import VisionProcessor

# what encode_sample adds and batch / encode_batch carry
VISION_FIELDS = ("pixel_values", "image_inputs", "token_type_ids", "mrope_position_ids", "images_per_pack",
                 "cross_attention_mask")  # fmt: skip


@dataclass
class VisionBatch(PackedBatch):
    """A ``PackedBatch`` of vision-language packs, with the model's image inputs.

    Attributes (beyond ``PackedBatch``'s):
        pixel_values: the batch's images in pack order, packs in batch order, as the processor gives
            them: LLaVA ``(num_images, 3, H, W)``, Qwen2-VL ``(num_patches, C * T * P * P)``, Idefics3
            ``(num_samples, max_tiles, 3, H, W)``; ``None`` when no pack of the batch has an image.
        image_inputs: the family's other image inputs, in the same order (``image_grid_thw``,
            ``image_sizes``, ``pixel_attention_mask``, ``batch_num_images``, ...).
        token_type_ids: ``(B, N)`` int8, 1 on the image tokens, for a model that takes them (Gemma 3).
        mrope_position_ids: ``(3, B, N)`` int32 on the host (int64 in ``model_inputs()``), the M-RoPE ids of
            every pack (each sample's through the model's rule), or ``None`` for a model without M-RoPE.
        images_per_pack: ``(B,)`` int32, how many of the images belong to each pack.
        cross_attention_mask: ``(B, N, images + 1, T)`` int8 for a cross-attention model (Mllama, whose
            ``pixel_values`` are ``(B, images, T, 3, H, W)``: each pack's images in its row): the packs' masks
            and one slot more, for the model with ``cross_attention.attend_own_images``'s hooks.

    ``model_inputs()`` (and so ``model(**batch)``): the text batch's inputs (``PackedBatch.model_inputs``)
    with the image inputs and ``token_type_ids``; ``position_ids`` become the M-RoPE ids ``(3, B, N)``
    (``dense``, ``additive``, ``flex``), or, flattened (``varlen``: one row of ``B * N`` tokens), the text
    positions in front of them, ``(4, 1, B * N)``: the layout from which transformers' Qwen2-VL finds the
    sequence boundaries.
    """

    pixel_values: torch.Tensor | None = None
    image_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    token_type_ids: torch.Tensor | None = None
    mrope_position_ids: torch.Tensor | None = None
    images_per_pack: torch.Tensor | None = None
    cross_attention_mask: torch.Tensor | None = None

    @property
    def image_grid_thw(self) -> torch.Tensor | None:
        """``(num_images, 3)`` int64 (Qwen2-VL), else ``None``."""
        return self.image_inputs.get("image_grid_thw")

    def _map(self, fn):
        out = super()._map(fn)
        out.image_inputs = {name: fn(name, t) for name, t in self.image_inputs.items()}
        return out

    def build_mask(self) -> VisionBatch:
        """``PackedBatch.build_mask``; with ``token_type_ids``, the tokens of one image (a run of 1s) see
        each other both ways in the ``dense`` and ``additive`` masks (Gemma 3's rule), inside the sliding
        window of a layer type that has one (transformers' Gemma 3: the window AND the image blocks)."""
        built = self.attention_mask is not None
        super().build_mask()
        if self.token_type_ids is None or built or self.mask not in ("dense", "additive"):
            return self
        masks = self.attention_mask
        device = (next(iter(masks.values())) if isinstance(masks, dict) else masks).device
        image = self.token_type_ids.to(device) == 1
        start = image & ~torch.nn.functional.pad(image, (1, 0))[:, :-1]
        block = torch.where(image, torch.cumsum(start.to(torch.int64), dim=1), 0)
        same = (block[:, :, None] == block[:, None, :]) & image[:, :, None]
        distance = torch.arange(image.shape[1], device=device)
        distance = distance[:, None] - distance[None, :]

        def with_blocks(mask: torch.Tensor, window: int | None) -> torch.Tensor:
            both = same if window is None else same & (distance < window)  # q - window < k, as its window
            return mask | both[:, None] if self.mask == "dense" else mask.masked_fill(both[:, None], 0.0)

        windows = self.attention.windows()  # set: super().build_mask() refuses a 4-D mask without it
        if isinstance(masks, dict):
            self.attention_mask = {kind: with_blocks(m, windows.get(kind)) for kind, m in masks.items()}
        else:
            self.attention_mask = with_blocks(masks, next(iter(windows.values())))
        return self

    def model_inputs(self) -> dict[str, Any]:
        if self._inputs is not None:
            return self._inputs
        inputs = super().model_inputs()
        if self.pixel_values is not None:
            inputs["pixel_values"] = self.pixel_values
        inputs.update(self.image_inputs)
        if self.token_type_ids is not None:
            types = self.token_type_ids.to(torch.int64)
            inputs["token_type_ids"] = types
        if self.mrope_position_ids is not None:
            mrope = self.mrope_position_ids.to(torch.int64)
            if self.mask == "varlen":
                text = inputs["position_ids"].view(1, 1, -1)
                inputs["position_ids"] = torch.cat([text, mrope.reshape(3, 1, -1)], dim=0)
            else:
                inputs["position_ids"] = mrope
        if self.cross_attention_mask is not None:
            inputs["cross_attention_mask"] = self.cross_attention_mask
            if self.mask == "varlen":  # one row: the packs' images side by side
                inputs.update(flattened_cross_attention(inputs, self.cross_attention_mask))
        return inputs


def _image_bytes(value: Any) -> bytes:
    """A stored image: its bytes, or the ``{"bytes", "path"}`` struct the Parquet ``images`` column holds."""
    return value["bytes"] if isinstance(value, dict) else bytes(value)


def _concat(parts: list[torch.Tensor], shared: bool) -> torch.Tensor:
    """``concat_padded(parts)``; with ``shared``, inside a DataLoader worker, moved into shared memory, so
    that the batch goes to the main process without another copy (a parcel sends a shared tensor as is)."""
    out = concat_padded(parts)
    return out.share_memory_() if shared and get_worker_info() is not None else out


class VisionTaskEncoder:
    """The vision stages of ``PackedDataset`` (module docstring); ``vision_dataset`` builds both.

    Args:
        processor: the model's processor (``load_processor(DIR)``).
        get_rope_index: the model's M-RoPE rule (``model.model.get_rope_index``) for Qwen2-VL and
            Qwen2.5-VL; ``None`` for models with plain positions (LLaVA).
        mask, labels_convention: as the dataset's (``PackedDataset.mask``, the manifest's ``labels``).
        attention: the model's config (``model.config``), required for the ``dense``, ``additive`` and
            ``flex`` masks, as ``PackedDataset``'s (``loader.fit``: the path is checked against the model's
            code, with the M-RoPE ids when ``get_rope_index`` is given: ``mrope``).
        dtype: ``pixel_values`` cast to it (the model's dtype), else the processor's float32.
        cross_attention: for a cross-attention processor (Llama 3.2 Vision), required: the model its
            batches train, given the hooks that keep each packed sample's text on its own images
            (``cross_attention.attend_own_images``); no reference to it is kept.

    A pack (the dict ``encode_sample`` takes) holds the text columns, ``pack_index`` and the stored image
    columns: ``images`` (bytes, or ``{"bytes", "path"}``), ``image_offset`` and ``image_length`` (each
    image's span in the pack), in pack order.

    Raises ``ValueError`` for a processor whose ``token_type_ids`` the loader cannot build per pack
    (PaliGemma's), for ``varlen`` and ``flex`` masks with a model that attends both ways inside
    images (Gemma 3), and for a cross-attention processor without its model (or a model without one).
    """

    def __init__(
        self,
        processor: VisionProcessor,
        get_rope_index: GetRopeIndex | None = None,
        *,
        mask: str = "varlen",
        labels_convention: str = "shifted",
        attention: Any = None,
        dtype: torch.dtype | None = None,
        cross_attention: Any = None,
    ) -> None:
        self.processor, self.get_rope_index = processor, get_rope_index
        self.cross = processor.cross_attention
        if self.cross and not is_cross_attention_model(cross_attention):
            raise ValueError(
                f"{processor.family} is a cross-attention model: pass its model, cross_attention=model "
                "(packtool hooks it to keep each packed sample's text on its own images)"
            )
        if cross_attention is not None and not self.cross:
            raise ValueError(
                f"cross_attention= is for a cross-attention model's processor; {processor.family}'s images "
                "are in its token sequence"
            )
        if self.cross:
            attend_own_images(cross_attention)
        self.mask, self.labels_convention, self.dtype = mask, labels_convention, dtype
        self.token_types = token_type_rule(processor)
        if self.token_types and mask not in ("dense", "additive"):
            raise ValueError(
                f"{processor.family} attends both ways inside each image: its packs need mask dense or "
                f"additive, which hold those blocks (with {mask}, transformers' Gemma 3 sliding-window "
                "layers attend across the packed samples)"
            )
        self.mrope = get_rope_index is not None  # its batches' position ids (what the model's check needs)
        self.attention = model_attention(mask, attention, mrope=self.mrope)

    def encode_sample(self, pack: dict) -> dict:
        """``pack`` with its image columns replaced by ``pixel_values`` (``None`` without images),
        ``image_inputs``, ``token_type_ids`` (or ``None``), ``mrope_position_ids`` ``(3, N)`` (with
        ``get_rope_index``)."""
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
        ends = np.cumsum(np.asarray(pack["seq_lens"], dtype=np.int64))
        sample = np.searchsorted(ends, offsets, side="right")  # the sample of the pack each image is in
        self._check_spans(where, input_ids, images, offsets, lengths, sample)
        out = {k: v for k, v in pack.items() if k not in IMAGE_COLUMNS}
        groups = [[images[k] for k in np.flatnonzero(sample == s)] for s in dict.fromkeys(sample.tolist())]
        try:
            inputs = image_inputs(self.processor, groups, self.dtype)
        except (OSError, ValueError) as e:
            raise InputError(f"{where}: the processor fails on its images: {e}") from None
        out["pixel_values"] = inputs.pop("pixel_values", None)
        out["image_inputs"] = inputs
        out["token_type_ids"] = (
            np.isin(input_ids, self.processor.image_token_ids).astype(np.int8) if self.token_types else None
        )
        out["images_per_pack"] = len(images)
        if self.cross:
            tiles = inputs["aspect_ratio_mask"][0].sum(-1).numpy() if images else np.zeros(0, np.int64)
            try:
                out["cross_attention_mask"] = pack_cross_attention_mask(
                    self.processor.processor, input_ids, np.asarray(pack["seq_lens"]), sample, tiles
                )
            except ValueError as e:
                raise InputError(f"{where}: {e}") from None
        if self.get_rope_index is not None:
            out["mrope_position_ids"] = pack_mrope_position_ids(
                self.get_rope_index,
                input_ids,
                pack["seq_lens"],
                offsets,
                lengths,
                inputs.get("image_grid_thw"),
                self.processor.image_token_ids,
            ).to(torch.int32)
        return out

    def _check_spans(
        self,
        where: str,
        input_ids: np.ndarray,
        images: list,
        offsets: np.ndarray,
        lengths: np.ndarray,
        sample: np.ndarray,
    ) -> None:
        """Each image's span: inside the pack, the processor's ids for the decoded image's size (in a sample
        of as many images); every image token of the pack in a span (else the model would take features
        elsewhere)."""
        n = len(input_ids)
        per_sample = np.bincount(sample, minlength=int(sample.max()) + 1) if len(sample) else sample
        for k, image in enumerate(images):
            try:
                want = self.processor.expansion(image.height, image.width, int(per_sample[sample[k]]))
            except ValueError as e:
                raise InputError(f"{where}: image {k} ({image.width}x{image.height}): {e}") from None
            a, b = int(offsets[k]), int(offsets[k] + lengths[k])
            if lengths[k] != want.span_length or a < 0 or b > n:
                raise InputError(
                    f"{where}: image {k} ({image.width}x{image.height}) has a span of {lengths[k]} tokens at "
                    f"{offsets[k]}; the processor makes {want.span_length}, in a pack of {n}"
                )
            if not np.array_equal(input_ids[a:b], want.span()):
                raise InputError(
                    f"{where}: image {k} ({image.width}x{image.height}): the tokens of its span are not the "
                    "processor's for its size"
                )
        covered = np.zeros(n, dtype=np.int64)
        np.add.at(covered, ranges(offsets, lengths), 1)
        stray = np.isin(input_ids, self.processor.image_token_ids) & (covered == 0)
        if covered.max(initial=0) > 1 or stray.any():
            raise InputError(f"{where}: the image spans do not cover the pack's image tokens exactly")

    def batch(self, packs: list[dict]) -> dict:
        """The default stage's batch of the text columns, the image inputs concatenated in order,
        ``token_type_ids`` stacked to ``(B, N)``, ``mrope_position_ids`` to ``(3, B, N)``,
        ``images_per_pack`` ``(B,)`` int32."""
        raw = default_batch([{k: v for k, v in p.items() if k not in VISION_FIELDS} for p in packs])
        names = dict.fromkeys(name for p in packs for name in p.get("image_inputs", {}))
        if self.cross:  # a row of images per pack
            raw["pixel_values"] = batch_rows([p["pixel_values"] for p in packs])
            raw["image_inputs"] = {
                name: batch_rows([p["image_inputs"].get(name) for p in packs]) for name in names
            }
            tiles = int(self.processor.image_processor.max_image_tiles)
            raw["cross_attention_mask"] = batch_cross_attention_mask(
                [p["cross_attention_mask"] for p in packs], tiles
            )
        else:
            parts = [p["pixel_values"] for p in packs if p.get("pixel_values") is not None]
            raw["pixel_values"] = _concat(parts, shared=True) if parts else None
            raw["image_inputs"] = {
                name: _concat(
                    [p["image_inputs"][name] for p in packs if name in p["image_inputs"]], shared=False
                )
                for name in names
            }
        with_types = packs[0].get("token_type_ids") is not None
        raw["token_type_ids"] = batch_stack([p["token_type_ids"] for p in packs]) if with_types else None
        with_mrope = "mrope_position_ids" in packs[0]
        raw["mrope_position_ids"] = (
            torch.stack([p["mrope_position_ids"] for p in packs], dim=1) if with_mrope else None
        )
        raw["images_per_pack"] = torch.tensor([p["images_per_pack"] for p in packs], dtype=torch.int32)
        return raw

    def encode_batch(self, raw: dict) -> VisionBatch:
        text = packed_batch(
            {k: v for k, v in raw.items() if k not in VISION_FIELDS},
            self.mask,
            self.labels_convention,
            self.attention,
        )
        fields = {f.name: getattr(text, f.name) for f in dataclasses.fields(text) if f.init}
        vision = {name: raw.get(name) for name in VISION_FIELDS}
        vision["image_inputs"] = vision["image_inputs"] or {}
        return VisionBatch(**fields, **vision)


def vision_dataset(
    source: Any,
    processor: VisionProcessor,
    get_rope_index: GetRopeIndex | None = None,
    *,
    dtype: torch.dtype | None = None,
    cross_attention: Any = None,
    **dataset_kwargs: Any,
) -> PackedDataset:
    """A ``PackedDataset`` of ``source`` (an output directory, or a mixture of outputs: ``loader.sources``;
    text outputs of the model's tokenizer mix with vision-language ones; ``dataset_kwargs``: batch size,
    mask, attention, shuffle, ...) whose batches are ``VisionBatch`` objects: a ``VisionTaskEncoder`` with
    the dataset's mask, attention and labels convention (``cross_attention``: a cross-attention model's
    model, as the task encoder's)."""
    if "task_encoder" in dataset_kwargs:
        raise ValueError("vision_dataset sets the task encoder; build PackedDataset yourself for another")
    opened = open_source(source, dataset_kwargs.pop("split", "train"))
    encoder = VisionTaskEncoder(
        processor,
        get_rope_index,
        mask=dataset_kwargs.get("mask", "varlen"),
        labels_convention=opened.outputs[0].manifest.labels,  # one for all the sources of a mixture
        attention=dataset_kwargs.get("attention"),
        dtype=dtype,
        cross_attention=cross_attention,
    )
    return PackedDataset(opened, task_encoder=encoder, split=opened.split, **dataset_kwargs)
