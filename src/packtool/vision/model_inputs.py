"""A pack's stored images -> the model's image inputs, in pack order (what the loader's workers will run).

``image_inputs(processor, encoded)`` decodes each image's stored bytes (``records.pack_records``'
``images``) with Pillow, under the same decompression-bomb limit as ``images.image_size`` (the bytes of an
output directory are untrusted input), and runs the model's image processor on them: ``pixel_values``
(LLaVA: ``(num_images, 3, H, W)``; Qwen2-VL: ``(num_patches, C * T * P * P)``) and, for Qwen2-VL,
``image_grid_thw`` ``(num_images, 3)``. The image processor's order is the pack's: the k-th image fills the
k-th run of image tokens.
"""

from __future__ import annotations

import io
import warnings

import torch
from PIL import Image

from packtool.vision.processor import VisionProcessor


def decode_images(encoded: list[bytes]) -> list[Image.Image]:
    """Each encoded image decoded to RGB; ``ValueError`` for one over Pillow's pixel limit."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        for k, data in enumerate(encoded):
            try:
                with Image.open(io.BytesIO(data)) as image:
                    out.append(image.convert("RGB"))
            except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
                raise ValueError(f"image {k}: decompression bomb: {e}") from None
    return out


def image_inputs(
    processor: VisionProcessor, encoded: list[bytes], dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """``pixel_values`` (cast to ``dtype`` when given) and, where the model has it, ``image_grid_thw``, for
    a pack's images in pack order; ``{}`` for a pack without images."""
    return pixel_inputs(processor, decode_images(encoded), dtype)


def pixel_inputs(
    processor: VisionProcessor, images: list[Image.Image], dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """``image_inputs`` of images already decoded (``decode_images``)."""
    if not images:
        return {}
    out = processor.image_processor(images=images, return_tensors="pt")
    inputs = {"pixel_values": out["pixel_values"] if dtype is None else out["pixel_values"].to(dtype)}
    if "image_grid_thw" in out:
        inputs["image_grid_thw"] = out["image_grid_thw"]
    return inputs
