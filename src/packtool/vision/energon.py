"""Megatron-Energon's reading of a vision-language tar output: packs with their images.

A ``--format webdataset`` output of ``packtool pack --processor DIR`` holds, per pack, the arrays members
of a text pack (``KEY.input_ids.npy``, ...), the image columns (``KEY.image_offset.npy``,
``KEY.image_length.npy``, ...) and one member per image, ``KEY.img{k}.{ext}`` with the image's original
bytes and extension (docs/vision.md). Energon reads it through its own ``CrudeWebdataset``
(``.nv-meta/crude.yaml``); ``VisionPackTaskEncoder`` carries the cooker that makes each crude sample a
``VisionPackSample`` and runs the loader's vision stages (``packtool.vision.loader.VisionTaskEncoder``) as
Energon's ``encode_sample`` / ``batch`` / ``encode_batch``, in Energon's workers::

    from megatron.energon import WorkerConfig, get_loader, get_train_dataset
    from packtool.vision.energon import VisionPackTaskEncoder

    ds = get_train_dataset(
        "out/", dataset_config="crude.yaml", batch_size=4, shuffle_buffer_size=100,
        max_samples_per_sequence=100, worker_config=WorkerConfig.default_worker_config(),
        task_encoder=VisionPackTaskEncoder(processor, model.model.get_rope_index, mask="dense",
                                           attention=model.config),
    )
    for batch in get_loader(ds):  # VisionBatch: model(**batch.to("cuda"))
        ...

The task encoder's ``decoder`` is ``None``: Energon hands the members over as bytes, the cooker reads the
``.npy`` members with ``numpy.load(allow_pickle=False)`` (no code runs) and the images are decoded by the
loader's own ``decode_images`` (Pillow under its decompression-bomb limit, an error, not a warning), so
Energon's batches hold exactly the ``pixel_values`` of ``PackedDataset``'s.

This module imports ``megatron.energon`` (the ``energon`` extra) and Pillow/transformers (``vision``).
"""

from __future__ import annotations

import io
import re
from typing import Any, Optional

import numpy as np
import torch
from megatron.energon import Cooker, Sample, basic_sample_keys, edataclass, stateless

from packtool.energon import PackTaskEncoder
from packtool.formats.webdataset_index import ENERGON_VISION_SUBFLAVOR
from packtool.vision.loader import VisionBatch, VisionTaskEncoder
from packtool.vision.positions import GetRopeIndex
from packtool.vision.processor import VisionProcessor

IMAGE_MEMBER = re.compile(r"img(\d+)\.[A-Za-z0-9]+")  # KEY.img{k}.{ext}, as Energon names it: img{k}.{ext}
TEXT_FIELDS = ("input_ids", "labels", "position_ids", "seq_lens")
IMAGE_FIELDS = ("image_sample", "image_offset", "image_length", "image_height", "image_width")


@edataclass
class VisionPackSample(Sample):
    """One vision-language pack of a tar output.

    Attributes:
        input_ids, labels, position_ids: ``(N,)`` int32; seq_lens: ``(num_samples [+1],)`` int32.
        images: each image's original encoded bytes, in pack order (``KEY.img0.*``, ``KEY.img1.*``, ...).
        image_sample, image_offset, image_length, image_height, image_width: ``(num_images,)`` int32.
        loss_mask: ``(N,)`` int8 when the output has one.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    seq_lens: np.ndarray
    images: list
    image_sample: np.ndarray
    image_offset: np.ndarray
    image_length: np.ndarray
    image_height: np.ndarray
    image_width: np.ndarray
    loss_mask: Optional[np.ndarray] = None  # noqa: UP045 - Energon's type parser reads this annotation


def _npy(raw: dict, name: str) -> np.ndarray:
    return np.load(io.BytesIO(raw[f"{name}.npy"]), allow_pickle=False)


@stateless
def cook_vision_pack(raw: dict) -> VisionPackSample:
    """A ``CrudeSample`` of a vision-language tar output (members as bytes) as a ``VisionPackSample``; the
    images in the order of their index ``k`` in ``img{k}.{ext}``."""
    found = {
        int(m.group(1)): key for key in raw if isinstance(key, str) and (m := IMAGE_MEMBER.fullmatch(key))
    }
    if sorted(found) != list(range(len(found))):
        raise ValueError(f"pack {raw.get('__key__')}: image members {sorted(found)} are not img0, img1, ...")
    return VisionPackSample(
        **basic_sample_keys(raw),
        **{name: _npy(raw, name) for name in (*TEXT_FIELDS, *IMAGE_FIELDS)},
        images=[bytes(raw[found[k]]) for k in range(len(found))],
        loss_mask=_npy(raw, "loss_mask") if "loss_mask.npy" in raw else None,
    )


class VisionPackTaskEncoder(PackTaskEncoder):
    """Energon task encoder for vision-language tar outputs: the cooker above, then the loader's vision
    stages (``VisionTaskEncoder``: arguments as there) as ``encode_sample``, ``batch`` and ``encode_batch``;
    batches are ``VisionBatch`` objects."""

    cookers = [Cooker(cook_vision_pack, has_subflavors={"packtool": ENERGON_VISION_SUBFLAVOR})]
    decoder = None  # members as bytes: the cooker reads the arrays, decode_images the images

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
        super().__init__()
        self.stages = VisionTaskEncoder(
            processor,
            get_rope_index,
            mask=mask,
            labels_convention=labels_convention,
            attention=attention,
            dtype=dtype,
            cross_attention=cross_attention,
        )

    def encode_sample(self, sample: VisionPackSample) -> dict:
        pack = {name: getattr(sample, name) for name in (*TEXT_FIELDS, *IMAGE_FIELDS, "images")}
        if sample.loss_mask is not None:
            pack["loss_mask"] = sample.loss_mask
        pack["pack_index"] = int(sample.__key__)
        return self.stages.encode_sample(pack)

    def batch(self, samples: list[dict]) -> dict:
        return self.stages.batch(samples)

    def encode_batch(self, batch: dict) -> VisionBatch:
        return self.stages.encode_batch(batch)
