"""A vision-language output through the text-only readers: refused in one line naming the vision readers,
never batches without the images (the model would train on its image tokens as text); and ``datasets``
loads a Parquet vision output with every image of every pack, while a tar one is not offered to it (its
WebDataset builder would fix each row's image members from the first packs it reads).

The output: the four LLaVA records (one, two, no and two images) packed by ``packtool pack --processor``
for the tiny LLaVA, in packs of 90 tokens (one or two samples each), as Parquet and as tar shards."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

from packtool.loader import collate_packs
from packtool.loader.trl import trl_dataset
from packtool.options import PackOptions
from packtool.pipeline.run import run_pack
from tests.fixtures.vision_inputs import write_llava_input
from tests.fixtures.vision_processors import build_llava

REFUSED = (
    r"the packs hold images, .* read a vision-language output with packtool\.vision\.loader\.vision_dataset"
)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vision_readers")
    processor = build_llava(tmp / "llava")
    source = write_llava_input(tmp / "input")
    out = {}
    for fmt in ("parquet", "webdataset"):
        options = PackOptions.of(inputs=[str(source)], output=str(tmp / fmt), processor=str(processor),
                                 packed_sequence_size=90, format=fmt, quiet=True)  # fmt: skip
        run_pack(options)
        out[fmt] = tmp / fmt
    return out


def test_collate_packs_refuses_datasets_rows_of_a_vision_output(outputs, tmp_path):
    import datasets

    ds = datasets.load_dataset(str(outputs["parquet"]), split="train", cache_dir=str(tmp_path / "hf"))
    loader = torch.utils.data.DataLoader(ds, batch_size=2, collate_fn=collate_packs)
    with pytest.raises(ValueError, match="collate_packs: " + REFUSED):
        next(iter(loader))


def test_datasets_loads_every_image_of_a_parquet_vision_output(outputs, tmp_path):
    import datasets

    ds = datasets.load_dataset(str(outputs["parquet"]), split="train", cache_dir=str(tmp_path / "hf"))
    manifest = json.loads((outputs["parquet"] / "manifest.json").read_text())
    counts = [len(row["images"]) for row in ds]
    assert (
        counts == [len(row["image_offset"]) for row in ds]
        and sum(counts) == manifest["vision"]["packed_images"]
    )
    assert max(counts) > min(counts)  # packs of different image counts all whole


def test_collate_packs_refuses_webdataset_and_wids_packs_of_a_vision_output(outputs, tmp_path):
    import webdataset as wds
    import wids
    from wids.wids_decode import default_decoder

    out = outputs["webdataset"]
    urls = [str(out / s["path"]) for s in json.loads((out / "manifest.json").read_text())["shards"]]
    batched = wds.WebDataset(urls, shardshuffle=False).decode().batched(2, collation_fn=collate_packs)
    with pytest.raises(ValueError, match=REFUSED):
        next(iter(torch.utils.data.DataLoader(batched, batch_size=None)))
    decode = functools.partial(default_decoder, format="numpy")
    ds = wids.ShardListDataset(
        str(out / "wids.json"), cache_dir=str(tmp_path / "cache"), transformations=[decode]
    )
    with pytest.raises(ValueError, match=REFUSED):
        next(iter(torch.utils.data.DataLoader(ds, batch_size=2, collate_fn=collate_packs)))
    ds.close()


def test_an_energon_vision_pack_object_is_refused():
    class Pack:  # the fields of packtool.vision.energon.VisionPackSample that matter here
        input_ids = labels = position_ids = np.zeros(4, np.int32)
        seq_lens = np.array([4], np.int32)
        images = [b"..."]

    with pytest.raises(ValueError, match=REFUSED):
        collate_packs([Pack()])


def test_trl_dataset_refuses_a_vision_output(outputs):
    with pytest.raises(ValueError, match=REFUSED):
        trl_dataset(outputs["parquet"])


def test_a_tar_vision_output_is_not_offered_to_load_dataset(outputs, tmp_path):
    """Its card's data files name the reader: load_dataset stops, saying it."""
    import datasets

    card = (outputs["webdataset"] / "README.md").read_text()
    assert "vision_dataset(" in card and "load_dataset(" not in card
    with pytest.raises(FileNotFoundError, match=r"read-them-with-packtool\.vision\.loader\.vision_dataset"):
        datasets.load_dataset(str(outputs["webdataset"]), split="train", cache_dir=str(tmp_path / "hf"))
