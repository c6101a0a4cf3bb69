"""A pack's stored images -> the model's image inputs, as the model's processor gives them, in pack order.

``decode_images`` decodes each image's stored bytes with Pillow as ``Image.open`` gives them (its mode
kept: an RGBA or palette image stays one, and the image processor composites its transparency onto
white, as it does for an image passed to the processor), under the same decompression-bomb limit as
``images.image_size`` (the bytes of an output directory are untrusted input).

``image_inputs(processor, groups)`` runs the model's processor on each sample's images, as that sample alone
would be run (``processor(text=[placeholders], images=[the sample's images])``: the processor's own
options for its image processor, e.g. Aya Vision's ``crop_to_patches``; the sample's images together,
as LLaVA-OneVision's several images of one sample are processed without their anyres grid), and keeps
the outputs its image processor names (``model_input_names``): ``pixel_values`` and, by family,
``image_grid_thw`` (Qwen2-VL), ``image_sizes`` (LLaVA-NeXT), ``pixel_attention_mask`` (Idefics3),
``batch_num_images`` (LLaVA-OneVision). Outputs of several samples are concatenated along their first
dimension, shorter ones padded with zeros (``concat_padded``): each model reads its images' real extent
from the other inputs (LLaVA-NeXT's ``image_sizes``, Idefics3's all-zero padding images).
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import torch
from PIL import Image

from packtool.vision.processor import VisionProcessor

TEXT_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids", "labels")


def decode_images(encoded: list[bytes]) -> list[Image.Image]:
    """Each encoded image decoded as ``Image.open`` gives it (no mode conversion); ``ValueError`` for one
    over Pillow's pixel limit."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        for k, data in enumerate(encoded):
            try:
                image = Image.open(io.BytesIO(data))
                image.load()
            except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
                raise ValueError(f"image {k}: decompression bomb: {e}") from None
            out.append(image)
    return out


def image_inputs(
    processor: VisionProcessor, groups: list[list[Image.Image]], dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The image inputs of samples' images (``groups``: each sample's images, in pack order; samples without
    images are skipped), ``pixel_values`` cast to ``dtype`` when given; ``{}`` when there is no image. A
    cross-attention model's (Mllama: ``(1, images, ...)`` per sample, a batch row's images on the second
    dimension) are joined on that dimension, one row for the pack."""
    parts: dict[str, list[torch.Tensor]] = {}
    for images in groups:
        if not images:
            continue
        for name, value in sample_image_inputs(processor, images).items():
            parts.setdefault(name, []).append(value[0] if processor.cross_attention else value)
    out = {name: concat_padded(values) for name, values in parts.items()}
    if processor.cross_attention:
        out = {name: value[None] for name, value in out.items()}
    if dtype is not None and "pixel_values" in out:
        out["pixel_values"] = out["pixel_values"].to(dtype)
    return out


def sample_image_inputs(processor: VisionProcessor, images: list[Image.Image]) -> dict[str, torch.Tensor]:
    """The image inputs the processor gives for one sample with ``images``."""
    own = processor.processor
    out = own(text=[processor.placeholders(len(images))], images=[images], return_tensors="pt")
    names = set(getattr(own.image_processor, "model_input_names", ["pixel_values"])) | {"pixel_values"}
    unused = set(getattr(own, "unused_input_names", ()))
    return {k: torch.as_tensor(v) for k, v in out.items() if k in names and k not in unused}


def concat_padded(values: list[torch.Tensor]) -> torch.Tensor:
    """``values`` concatenated along dim 0, each padded with zeros to the largest size of every other dim.

    >>> concat_padded([torch.ones(1, 2), torch.ones(2, 3)]).tolist()
    [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    """
    if len(values) == 1:
        return values[0]
    shape = np.max([v.shape[1:] for v in values], axis=0).tolist() if values[0].dim() > 1 else []
    if all(list(v.shape[1:]) == shape for v in values):
        return torch.cat(values)
    out = values[0].new_zeros((sum(v.shape[0] for v in values), *shape))
    at = 0
    for v in values:
        out[(slice(at, at + v.shape[0]), *(slice(0, n) for n in v.shape[1:]))] = v
        at += v.shape[0]
    return out


def token_type_rule(processor: VisionProcessor) -> bool:
    """Whether the model takes ``token_type_ids`` and the processor's are 1 exactly on its image tokens
    (Gemma 3: the model attends both ways within each image), so that the loader builds them for a pack
    from its ids. ``ValueError`` where the processor's ``token_type_ids`` mean something else (PaliGemma:
    its prefix, which packs of several samples cannot hold)."""
    own = processor.processor
    out: Any = own(text=[f"a{processor.placeholders(1)}b"], images=[[Image.new("RGB", (40, 30), 128)]])
    if "token_type_ids" not in out:
        return False
    ids = np.asarray(out["input_ids"][0])
    if np.array_equal(np.asarray(out["token_type_ids"][0]) == 1, np.isin(ids, processor.image_token_ids)):
        return True
    raise ValueError(
        f"{processor.family}: its token_type_ids are not 1 on its image tokens only (they mark a prefix the "
        "model attends to both ways), which the loader does not build for packs of several samples"
    )
