"""The loader's vision stages (``packtool.vision.loader``) on stored packs: what a batch holds, what travels
between processes, and the bad packs an output directory could hold, each one line naming the pack.

The training equivalence through these stages is ``tests/interop/test_vision_training.py``."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from packtool.errors import InputError
from packtool.loader import PackedDataset, get_loader
from packtool.loader.dataset import _Item, _Parcel
from packtool.masks import AttentionPattern
from packtool.reading import read_packs
from packtool.vision.loader import IMAGE_COLUMNS, VisionBatch, VisionTaskEncoder, vision_dataset
from packtool.vision.model_inputs import decode_images
from packtool.vision.processor import load_processor
from tests.fixtures.vision_inputs import image_bytes, write_llava_input
from tests.fixtures.vision_processors import build_llava


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The LLaVA processor and the four demo samples packed by ``packtool pack --processor`` (``run_pack`` in
    this process) into packs of 90 tokens (one or two samples each), as the loader's pack dicts, and the
    output directory."""
    from packtool.options import PackOptions
    from packtool.pipeline.run import run_pack

    tmp = tmp_path_factory.mktemp("vision_loader")
    vp = load_processor(build_llava(tmp / "llava"))
    options = PackOptions.of(inputs=[str(write_llava_input(tmp / "input"))], output=str(tmp / "out"),
                             processor=vp.path, packed_sequence_size=90, num_proc=1, quiet=True)  # fmt: skip
    run_pack(options)
    packs = [{**pack, "pack_index": k} for k, pack in enumerate(read_packs(tmp / "out"))]
    assert len(packs) >= 2 and all(name in packs[0] for name in IMAGE_COLUMNS)
    return vp, packs, tmp / "out"


def test_a_batch_holds_each_packs_images_in_order_and_travels_whole(stored):
    vp, packs, _ = stored
    encoder = VisionTaskEncoder(vp, mask="varlen", attention="causal")  # LLaVA's Llama: full causal
    encoded = [encoder.encode_sample(p) for p in packs]
    batch = encoder.encode_batch(encoder.batch(encoded))
    counts = [len(p["images"]) for p in packs]
    assert batch.images_per_pack.tolist() == counts and sum(counts) == 5
    assert torch.equal(
        batch.pixel_values, torch.cat([e["pixel_values"] for e in encoded if e["images_per_pack"]])
    )
    assert batch.pixel_values.shape[1:] == (3, 56, 56) and batch.image_grid_thw is None
    n = packs[0]["input_ids"].shape[0]
    # through a DataLoader worker's parcel (one shared-memory block for the batch's tensors)
    parcel = pickle.loads(pickle.dumps(_Parcel(0, [_Item(0, 0, batch, {}, [])])))
    got = parcel.items[0].batch
    assert isinstance(got, VisionBatch) and torch.equal(got.pixel_values, batch.pixel_values)
    inputs = got.model_inputs()
    assert inputs["input_ids"].shape == (1, len(packs) * n) and inputs["position_ids"].shape == (
        1,
        len(packs) * n,
    )
    assert inputs["pixel_values"] is got.pixel_values and "image_grid_thw" not in inputs


def _with(pack: dict, **changes) -> dict:
    return {**pack, **changes}


BAD_PACKS = {
    "an image missing": (lambda p: _with(p, images=p["images"][:-1]), "images but"),
    "bytes that are no image": (
        lambda p: _with(p, images=[{"bytes": b"not an image", "path": "x"}] + p["images"][1:]),
        "cannot decode image",
    ),
    "a run shorter than the processor's count": (
        lambda p: _with(p, image_length=p["image_length"] - 1),
        "the processor makes 16",
    ),
    "a run moved off the image tokens": (
        lambda p: _with(p, image_offset=p["image_offset"] + 1),
        "the tokens of its span are not the processor's for its size",
    ),
    "a run dropped": (
        lambda p: _with(
            p, images=p["images"][1:], image_offset=p["image_offset"][1:], image_length=p["image_length"][1:]
        ),
        "do not cover the pack's image tokens exactly",
    ),
    "a run past the pack's end": (
        lambda p: _with(p, image_offset=p["image_offset"] + len(p["input_ids"])),
        "in a pack of",
    ),
}


@pytest.mark.parametrize("case", list(BAD_PACKS))
def test_a_bad_pack_is_one_line_naming_it(stored, case):
    vp, packs, _ = stored
    pack = next(p for p in packs if len(p["images"]))
    damage, message = BAD_PACKS[case]
    with pytest.raises(InputError, match=message) as e:
        VisionTaskEncoder(vp).encode_sample(damage(pack))
    assert str(e.value).startswith(f"pack {pack['pack_index']}: ") and "\n" not in str(e.value)


def test_a_decompression_bomb_is_refused(stored, monkeypatch):
    from PIL import Image

    vp, packs, _ = stored
    pack = next(p for p in packs if len(p["images"]))
    big = image_bytes(300, 300)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300 * 300 // 2)
    with pytest.raises(InputError, match="decompression bomb"):
        VisionTaskEncoder(vp).encode_sample(
            _with(pack, images=[{"bytes": big, "path": "b"}] + pack["images"][1:])
        )


@pytest.fixture(scope="module")
def output(stored):
    return stored[2]


def test_workers_give_the_images_of_each_pack_and_resume_exactly(stored, output):
    """2 DataLoader workers: every pack once, its images in pack order (what processing its stored bytes
    alone gives); a loader restored from the state after the first batch gives the rest, equal."""
    vp, _, _ = stored
    want = {}
    for k, pack in enumerate(read_packs(output)):  # the processor on each sample of the pack alone
        images = decode_images([image["bytes"] for image in pack["images"]])
        groups = [[im for im, s in zip(images, pack["image_sample"], strict=True) if s == j]
                  for j in dict.fromkeys(pack["image_sample"].tolist())]  # fmt: skip
        pixels = [
            vp.processor(text=[vp.image_token * len(g)], images=[g], return_tensors="pt")["pixel_values"]
            for g in groups
        ]
        want[k] = torch.cat(pixels) if pixels else None
    ds = vision_dataset(output, vp, batch_size=1, shuffle=True, seed=3, drop_last=False)
    loader = get_loader(ds, num_workers=2)
    batches, state = [], None
    for batch in loader:
        batches.append(batch)
        if state is None:
            state = loader.state_dict()
    assert sorted(int(b.pack_index) for b in batches) == list(range(len(want))) and len(want) >= 2
    for b in batches:
        expected = want[int(b.pack_index)]
        assert (b.pixel_values is None) if expected is None else torch.equal(b.pixel_values, expected)
    again = get_loader(vision_dataset(output, vp, batch_size=1, shuffle=True, seed=3, drop_last=False), 1)
    again.load_state_dict(state)
    rest = list(again)
    assert [int(b.pack_index) for b in rest] == [int(b.pack_index) for b in batches[1:]]
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(rest, batches[1:], strict=True))


def test_images_without_a_vision_task_encoder_are_refused(output):
    with pytest.raises(ValueError, match="the packs hold images; read them with packtool.vision.loader"):
        PackedDataset(output, batch_size=1)


def test_pixel_values_are_the_processors_on_each_image_as_opened(stored):
    """RGBA and palette images with transparency: the loader's pixel values are the processor's on the image
    as ``Image.open`` gives it (transparency composited onto white by the image processor), not on an
    ``Image.convert("RGB")`` of it (its transparent pixels' colour, here black)."""
    import io

    from PIL import Image

    from packtool.vision.model_inputs import image_inputs

    vp, _, _ = stored
    rgba = Image.new("RGBA", (40, 30), (0, 0, 0, 0))
    rgba.paste((200, 30, 30, 255), (10, 10, 30, 20))
    palette = rgba.convert("RGB").quantize(colors=8)
    palette.info["transparency"] = int(np.asarray(palette)[0, 0])
    encoded = []
    for image in (rgba, palette):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    images = decode_images(encoded)
    assert [im.mode for im in images] == ["RGBA", "P"]
    got = image_inputs(vp, [images])["pixel_values"]
    opened = [Image.open(io.BytesIO(data)) for data in encoded]
    want = vp.processor(text=[vp.image_token * 2], images=[opened], return_tensors="pt")["pixel_values"]
    assert torch.equal(got, want)
    dropped = vp.processor(
        text=[vp.image_token * 2], images=[[im.convert("RGB") for im in opened]], return_tensors="pt"
    )["pixel_values"]
    assert (got - dropped).abs().max() > 1.0


def test_dense_and_additive_masks_hold_each_image_both_ways():
    """A model whose token_type_ids mark its image tokens (Gemma 3) attends both ways inside each run of
    them (each image), causally elsewhere, and never across samples."""
    from packtool.loader.batch import packed_batch

    types = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0]], dtype=torch.int8)
    raw = {
        "input_ids": torch.zeros(1, 8, dtype=torch.int32), "labels": torch.zeros(1, 8, dtype=torch.int32),
        "position_ids": torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]], dtype=torch.int32),
        "seq_lens": torch.tensor([[5, 3]], dtype=torch.int32),
    }  # fmt: skip
    for mask in ("dense", "additive"):
        text = packed_batch(raw, mask)
        names = ("input_ids", "labels", "position_ids", "seq_lens", "cu_seqlens", "max_seqlen")
        fields = {f: getattr(text, f) for f in names}
        batch = VisionBatch(**fields, mask=mask, token_type_ids=types, attention=AttentionPattern())
        batch = batch.build_mask()
        allowed = batch.attention_mask[0, 0] if mask == "dense" else batch.attention_mask[0, 0] == 0
        want = torch.tril(torch.ones(8, 8, dtype=torch.bool))
        want[5:, :5] = False  # two samples: 5 and 3 tokens
        want[1:3, 1:3] = want[5:7, 5:7] = True  # each image both ways
        assert torch.equal(allowed, want), mask


@pytest.mark.parametrize("mask", ["dense", "additive", "flex"])
def test_a_mask_built_for_the_model_needs_the_model(stored, mask):
    """The vision stages build the model's masks as the text loader does: never without its attention."""
    vp, packs, output = stored
    for make in (lambda: VisionTaskEncoder(vp, mask=mask), lambda: vision_dataset(output, vp, mask=mask)):
        with pytest.raises(
            ValueError, match=f"^mask='{mask}' is built for the model's attention: pass attention="
        ):
            make()
    encoder = VisionTaskEncoder(vp, mask=mask, attention="causal")  # a declaration: full causal attention
    batch = encoder.encode_batch(encoder.batch([encoder.encode_sample(p) for p in packs[:2]]))
    assert batch.attention == AttentionPattern() and batch.build_mask().mask == mask
