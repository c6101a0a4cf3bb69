"""Packs as records with their images: the original bytes unchanged, each image's span and size, and
``datasets.load_dataset`` reading the Parquet file with the images typed as images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.vision.packs import plan_packs
from packtool.vision.records import pack_records
from packtool.vision.samples import read_json_samples
from packtool.vision.sequences import encode_sample, sequence_columns
from tests.fixtures.vision_inputs import write_llava_input


@pytest.fixture(scope="module")
def records(tmp_path_factory, processors):
    samples = list(read_json_samples(write_llava_input(tmp_path_factory.mktemp("records")))) * 3
    vp = processors["qwen2vl"]
    sequences = [encode_sample(vp, s) for s in samples]
    plan = plan_packs(sequences, max(len(s) for s in sequences) + 40, samples=samples)
    return samples, sequences, plan, pack_records(sequence_columns(sequences), plan, samples, pad_id=0), vp


def test_each_image_is_stored_once_unchanged_with_its_span(records):
    samples, sequences, plan, rb, vp = records
    assert rb.num_rows == plan.num_packs > 1
    stored = 0
    for k in range(rb.num_rows):
        row = {name: rb.column(name)[k].as_py() for name in rb.schema.names}
        ids = np.array(row["input_ids"])
        for m, image in enumerate(row["images"]):
            sample = samples[row["samples"][row["image_sample"][m]]]
            ref = next(r for r in sample.images if r.name == image["path"])
            assert image["bytes"] == Path(ref.path).read_bytes()  # the original file, byte for byte
            a, n = row["image_offset"][m], row["image_length"][m]
            assert (ids[a : a + n] == vp.image_token_id).all()
            assert n == vp.image_tokens(row["image_height"][m], row["image_width"][m])
            stored += 1
        assert (ids == vp.image_token_id).sum() == sum(row["image_length"])
    assert stored == sum(len(s.images) for s in samples) == 15


def test_load_dataset_types_the_image_column_as_images(records, tmp_path):
    import datasets

    _, _, _, rb, _ = records
    pq.write_table(pa.Table.from_batches([rb]), tmp_path / "packs.parquet")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "packs.parquet"), split="train",
                               cache_dir=str(tmp_path / "hf"))  # fmt: skip
    assert isinstance(ds.features["images"], datasets.List)
    assert isinstance(ds.features["images"].feature, datasets.Image)
    row = next(r for r in ds if r["images"])
    image = row["images"][0]
    assert (image.height, image.width) == (row["image_height"][0], row["image_width"][0])


def test_a_record_reads_back_as_the_pack_it_was_written_from(records, tmp_path, monkeypatch):
    from PIL import Image

    from packtool.vision.model_inputs import decode_images, image_inputs
    from packtool.vision.packs import assemble_pack
    from packtool.vision.records import pack_from_record

    samples, sequences, plan, rb, vp = records
    columns = sequence_columns(sequences)
    for k in range(rb.num_rows):
        row = rb.slice(k, 1).to_pylist()[0]
        got, want = pack_from_record(row), assemble_pack(columns, plan, k, pad_id=0)
        for name in want.__dataclass_fields__:
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
    row = next(r for r in rb.to_pylist() if len(r["images"]) >= 2)
    inputs = image_inputs(vp, [decode_images([image["bytes"] for image in row["images"]])])
    assert inputs["image_grid_thw"].prod(-1).div(4).tolist() == row["image_length"]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # a stored image is untrusted: the bomb limit holds
    with pytest.raises(ValueError, match="image 0: decompression bomb"):
        decode_images([row["images"][0]["bytes"]])


def test_image_stats_of_stored_packs(records):
    from packtool.vision.stats import image_stats

    samples, sequences, plan, rb, _ = records
    stats = image_stats(rb, ranks=2)
    lengths = np.concatenate([s.image_lengths for s in sequences])
    assert stats["packs"] == plan.num_packs and stats["images"] == len(lengths) == 15
    assert stats["image_tokens"] == lengths.sum()
    assert stats["image_token_share"] == pytest.approx(
        lengths.sum() / (plan.num_packs * plan.packed_sequence_size)
    )
    assert sum(stats["images_per_pack_histogram"].values()) == plan.num_packs
    assert sum(c * f for c, f in stats["images_per_pack_histogram"].items()) == 15
    assert (stats["tokens_per_image_min"], stats["tokens_per_image_max"]) == (lengths.min(), lengths.max())
