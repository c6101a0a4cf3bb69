"""``PackArrays``: columns handled by their ``PACK_COLUMNS`` entry (fixed-width or per segment / piece),
whatever the layout stores."""

from __future__ import annotations

import numpy as np
import pytest

from packtool.packs import PackArrays

N = 6


def minimal_packs() -> PackArrays:
    """Two packs as the minimal layout stores them: pieces [4, 2] and [3] + 3 of padding."""
    return PackArrays(
        input_ids=np.arange(2 * N, dtype=np.int32).reshape(2, N),
        seq_lens=np.array([4, 2, 3, 3], np.int32),
        seq_lens_offsets=np.array([0, 2, 4]),
        sample_index=np.array([7, 8, 9], np.int64),
        sample_index_offsets=np.array([0, 2, 3]),
        sample_offset=np.array([0, 10, 0], np.int64),
        next_label=np.array([-100, 5, -100], np.int32),
        loss_mask_bits=np.array([[0b10100000], [0b11111100]], np.uint8),
    )


def test_parts_and_from_parts_round_trip():
    packs = minimal_packs()
    assert packs.present() == [
        "input_ids", "seq_lens", "sample_index", "sample_offset", "next_label", "loss_mask_bits",
    ]  # fmt: skip
    parts = {name: packs.parts(name) for name in packs.present()}
    assert parts["next_label"][1].tolist() == [0, 2, 3]  # the pieces' offsets
    assert parts["loss_mask_bits"][1].tolist() == [0, 1, 2]  # ceil(N / 8) = 1 byte a pack
    again = PackArrays.from_parts(parts, N)
    for name in packs.present():
        assert np.array_equal(getattr(again, name), getattr(packs, name)), name
    assert {k: v.tolist() for k, v in packs.stored(1).items()} == {
        "input_ids": list(range(N, 2 * N)),
        "seq_lens": [3, 3],
        "sample_index": [9],
        "sample_offset": [0],
        "next_label": [-100],
        "loss_mask_bits": [0b11111100],
    }
    assert packs.row("next_label", 1).tolist() == [-100]


def test_from_parts_names_a_column_that_does_not_fit():
    packs = minimal_packs()
    parts = {name: packs.parts(name) for name in packs.present()}
    short = dict(parts, next_label=(np.array([1, 2], np.int32), np.array([0, 1, 2])))
    with pytest.raises(ValueError, match="'next_label' does not hold one value per piece"):
        PackArrays.from_parts(short, N)
    wide = dict(parts, loss_mask_bits=(np.zeros(4, np.uint8), np.array([0, 2, 4])))
    with pytest.raises(ValueError, match="'loss_mask_bits' does not hold 1 values"):
        PackArrays.from_parts(wide, N)


def test_take_picks_packs_and_their_ragged_values():
    packs = minimal_packs()
    one = packs.take([1])
    assert one.num_packs == 1 and one.input_ids.tolist() == [list(range(N, 2 * N))]
    assert one.seq_lens.tolist() == [3, 3] and one.sample_index.tolist() == [9]
    assert one.next_label.tolist() == [-100] and one.sample_index_offsets.tolist() == [0, 1]


def test_pack_gives_what_readers_give_never_the_minimal_columns():
    pack = minimal_packs().pack(0, with_sample_index=True)
    assert sorted(pack) == ["input_ids", "sample_index", "sample_offset", "seq_lens"]


def test_images_go_with_their_packs():
    """A vision-language run of packs: the image columns and the images' bytes split by
    image_sample_offsets, taken and given per pack in pack order."""
    import pyarrow as pa

    packs = minimal_packs()
    packs.image_sample_offsets = np.array([0, 2, 3])
    columns = {"image_sample": [0, 1, 0], "image_offset": [1, 4, 0], "image_length": [2, 1, 3],
               "image_height": [5, 6, 7], "image_width": [8, 9, 10]}  # fmt: skip
    for name, values in columns.items():
        setattr(packs, name, np.array(values, np.int32))
    packs.images = pa.array(
        [{"bytes": b"a", "path": "a.png"}, {"bytes": b"b", "path": "b.png"}, {"bytes": b"c", "path": "c.jpg"}]
    )
    assert packs.present()[-5:] == [
        "image_sample",
        "image_offset",
        "image_length",
        "image_height",
        "image_width",
    ]
    last = packs.take([1])
    assert last.image_offset.tolist() == [0] and last.images.to_pylist() == [{"bytes": b"c", "path": "c.jpg"}]
    pack = packs.pack(0)
    assert pack["images"] == [{"bytes": b"a", "path": "a.png"}, {"bytes": b"b", "path": "b.png"}]
    assert pack["image_length"].tolist() == [2, 1] and "image_sample_offsets" not in pack
