"""Packs with their images as Arrow records: one row per pack, each image's original bytes in it.

``pack_records(columns, plan, samples, pad_id)`` is the storage layout docs/vision.md designs, in memory:
the pack's token columns, and per image, in pack order,

* ``images``: ``list<struct<bytes: binary, path: string>>``, the encoded bytes exactly as read (no
  re-encode, no pixels) and the name the input gave the image; the struct ``datasets.Image`` stores, so
  that the schema's ``huggingface`` metadata (``IMAGE_FEATURES``) makes ``datasets`` type the column as
  images;
* ``image_sample`` (the image's sample: an index into the pack's samples), ``image_offset`` and
  ``image_length`` (its run of image tokens in the pack), ``image_height``, ``image_width`` (from its
  header): each ``list<int32>``.

Not yet wired to ``packtool pack``'s writers (``packtool.formats``): the Parquet file a test writes from
these records is what ``datasets.load_dataset`` reads with the images typed as images.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from packtool.packing.planner import PackPlan
from packtool.vision.packs import VisionPack, assemble_pack
from packtool.vision.samples import VisionSample

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
INT_LISTS = ("input_ids", "labels", "position_ids", "seq_lens", "samples")
IMAGE_COLUMNS = ("image_sample", "image_offset", "image_length", "image_height", "image_width")


def _features() -> dict:
    int32s = {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "List"}
    features = {name: int32s for name in (*INT_LISTS, *IMAGE_COLUMNS)}
    features["images"] = {"feature": {"decode": True, "_type": "Image"}, "_type": "List"}
    return features


# the schema metadata datasets reads its features from (datasets.Features.arrow_schema writes the same)
IMAGE_FEATURES = {b"huggingface": json.dumps({"info": {"features": _features()}}).encode()}
SCHEMA = pa.schema(
    [(name, pa.list_(pa.int32())) for name in INT_LISTS]
    + [("images", pa.list_(IMAGE))]
    + [(name, pa.list_(pa.int32())) for name in IMAGE_COLUMNS],
    metadata=IMAGE_FEATURES,
)


def pack_records(
    columns: pa.RecordBatch, plan: PackPlan, samples: list[VisionSample], pad_id: int
) -> pa.RecordBatch:
    """Every pack of ``plan`` as a row of ``SCHEMA`` (``columns`` from ``sequence_columns`` of ``samples``'
    sequences). Each image's bytes are read once, from its file or its record."""
    rows = {name: [] for name in SCHEMA.names}
    for k in range(plan.num_packs):
        pack = assemble_pack(columns, plan, k, pad_id)
        sizes = [columns.column("image_sizes")[int(i)].values.to_numpy().reshape(-1, 2) for i in pack.samples]
        for name in INT_LISTS:
            rows[name].append(getattr(pack, name).astype(np.int32))
        images, heights, widths = [], [], []
        for j, idx in zip(pack.image_sample.tolist(), pack.image_index.tolist(), strict=True):
            ref = samples[int(pack.samples[j])].images[idx]
            images.append({"bytes": ref.read_bytes(), "path": ref.name})
            heights.append(int(sizes[j][idx, 0]))
            widths.append(int(sizes[j][idx, 1]))
        rows["images"].append(images)
        rows["image_sample"].append(pack.image_sample.astype(np.int32))
        rows["image_offset"].append(pack.image_offsets.astype(np.int32))
        rows["image_length"].append(pack.image_lengths.astype(np.int32))
        rows["image_height"].append(np.array(heights, dtype=np.int32))
        rows["image_width"].append(np.array(widths, dtype=np.int32))
    arrays = [pa.array(rows[name], type=SCHEMA.field(name).type) for name in SCHEMA.names]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


def pack_from_record(row: dict) -> VisionPack:
    """A ``SCHEMA`` row (``{column: value}``, e.g. ``table.slice(k, 1).to_pylist()[0]``) back as the
    ``VisionPack`` it was written from (its image bytes are in ``row["images"]``)."""

    def ints(name: str) -> np.ndarray:
        return np.asarray(row[name], dtype=np.int64)

    image_sample = ints("image_sample")
    first = np.searchsorted(image_sample, image_sample, side="left")  # images of a sample are consecutive
    return VisionPack(
        input_ids=ints("input_ids"),
        labels=ints("labels"),
        position_ids=ints("position_ids"),
        seq_lens=ints("seq_lens"),
        samples=ints("samples"),
        image_sample=image_sample,
        image_index=np.arange(len(image_sample), dtype=np.int64) - first,
        image_offsets=ints("image_offset"),
        image_lengths=ints("image_length"),
    )
