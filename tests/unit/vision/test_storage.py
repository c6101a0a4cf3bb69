"""``ImageTable``: every image of the kept samples laid out per pack, its bytes read as they are, and an
image changed since its tokens were counted refused in one line naming its sample and image."""

from __future__ import annotations

import numpy as np
import pytest

from packtool.errors import InputError
from packtool.packing.plan import PackPlan
from packtool.vision.samples import read_json_samples
from packtool.vision.sequences import encode_samples
from packtool.vision.storage import ImageTable, pack_image_tokens
from tests.fixtures.vision_inputs import write_image, write_llava_input


@pytest.fixture
def table(tmp_path, processors):
    samples, sequences = encode_samples(processors["qwen2vl"], read_json_samples(write_llava_input(tmp_path)))
    return ImageTable.of(samples, sequences), sequences, tmp_path


def test_pack_columns_follow_the_plan_and_read_gives_the_files_bytes(table):
    t, sequences, root = table
    # pack 0: samples 3 then 1 (2 + 2 images); pack 1: sample 0 (1 image); sample 2 has none
    lengths = [len(sequences[i]) for i in (3, 1, 0)]
    plan = PackPlan(512, np.array([0, 2, 3]), np.array([3, 1, 0]), np.zeros(3, int), np.array(lengths))
    columns, index = t.pack_columns(plan)
    assert columns["image_sample_offsets"].tolist() == [0, 4, 5]
    assert columns["image_sample"].tolist() == [0, 0, 1, 1, 0]
    want = [
        *sequences[3].image_offsets,
        *(sequences[1].image_offsets + lengths[0]),
        *sequences[0].image_offsets,
    ]
    assert columns["image_offset"].tolist() == [int(x) for x in want]
    assert pack_image_tokens(t, plan).tolist() == [
        int(sequences[3].image_lengths.sum() + sequences[1].image_lengths.sum()),
        int(sequences[0].image_lengths.sum()),
    ]
    images = t.read(index).to_pylist()
    assert [i["path"] for i in images] == ["images/c.webp", "images/a.png", "images/b.jpg", "images/c.webp",
                                           "images/a.png"]  # fmt: skip
    assert images[1]["bytes"] == (root / "images" / "a.png").read_bytes()


def test_an_image_changed_since_it_was_counted_is_refused(table):
    t, _, root = table
    write_image(root / "images" / "a.png", 61, 40)  # one pixel wider
    with pytest.raises(InputError) as caught:
        t.read(np.arange(t.num_images))
    text = str(caught.value)
    assert text.startswith(
        f"{root / 'data.jsonl'}, line 1, field 'image': image 0 (images/a.png): changed while"
    )
    assert "40x60 when counted, 40x61 now" in text
