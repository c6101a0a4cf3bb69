"""Sequences as the model sees them: the same ids the processor writes, labels on the assistant's tokens
only, each image's span (every family against its processor: test_families.py)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from packtool.errors import InputError
from packtool.vision.samples import sample_from_record
from packtool.vision.sequences import encode_sample, encode_samples
from tests.fixtures.vision_inputs import read_samples, write_image, write_llava_input


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    return read_samples([write_llava_input(tmp_path_factory.mktemp("llava"))])


def _images(sample) -> list[Image.Image]:
    return [Image.open(ref.path).convert("RGB") for ref in sample.images]


@pytest.mark.parametrize("model", ["llava", "qwen2vl"])
def test_the_ids_are_what_the_processor_writes(processors, samples, model):
    vp = processors[model]
    for sample in samples:
        seq = encode_sample(vp, sample)
        text, _ = vp.chat.trained_spans(sample.messages)
        if model == "llava":  # the whole LlavaProcessor: it repeats <image> by its own count, then tokenizes
            got = vp.processor(text=[text], images=_images(sample) or None)["input_ids"][0]
        else:  # Qwen2VLProcessor needs torchvision (its video processor): its replacement, by the grid
            images = _images(sample)
            grids = vp.image_processor(images=images, return_tensors="np")["image_grid_thw"] if images else []
            for grid in grids:
                text = text.replace("<|image_pad|>", "<|placeholder|>" * (int(np.prod(grid)) // 4), 1)
            got = vp.tokenizer.encode_batch([text.replace("<|placeholder|>", "<|image_pad|>")])[0]
        assert np.asarray(got).tolist() == seq.input_ids.tolist()


@pytest.mark.parametrize("model", ["llava", "qwen2vl"])
def test_image_spans_and_labels(processors, samples, model):
    vp = processors[model]
    seq = encode_sample(vp, samples[1])  # two images in two user turns, two assistant answers
    assert len(seq.image_offsets) == 2
    for a, n in zip(seq.image_offsets, seq.image_lengths, strict=True):
        assert (seq.input_ids[a : a + n] == vp.image_token_id).all()
        assert seq.input_ids[a - 1] != vp.image_token_id and seq.input_ids[a + n] != vp.image_token_id
        if model == "qwen2vl":  # the template's vision start/end tokens around the run
            start, end = (vp.tokenizer.token_to_id(t) for t in ("<|vision_start|>", "<|vision_end|>"))
            assert (seq.input_ids[a - 1], seq.input_ids[a + n]) == (start, end)
    assert (
        seq.image_token_mask().sum() == seq.image_lengths.sum() == (seq.input_ids == vp.image_token_id).sum()
    )
    assert not seq.trained[seq.image_token_mask()].any()
    # the trained runs are the answers (a BPE token that merges the newline before an answer with its first
    # letters starts outside the turn and is not trained: the chat encoder's rule)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], seq.trained.astype(np.int8), [0]])))
    runs = [
        vp.tokenizer.decode(seq.input_ids[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2], strict=True)
    ]
    assert len(runs) == 2 and "Blocks.<|im_end|>".endswith(runs[0]) and "Wider.<|im_end|>".endswith(runs[1])
    assert runs[0].endswith("s.<|im_end|>") and runs[1].endswith("er.<|im_end|>")


def test_chunks_of_any_size_give_the_same_sequences(processors, samples):
    vp = processors["qwen2vl"]
    _, whole = encode_samples(vp, samples * 3)
    kept, one_by_one = encode_samples(vp, samples * 3, chunk_size=1)
    assert len(kept) == len(whole) == len(one_by_one) == 12
    for a, b in zip(whole, one_by_one, strict=True):
        assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.trained, b.trained)
        assert np.array_equal(a.image_offsets, b.image_offsets)


def test_a_text_only_sample_has_no_image(processors, samples):
    seq = encode_sample(processors["qwen2vl"], samples[2])
    assert len(seq.image_offsets) == 0 and seq.image_sizes.shape == (0, 2) and seq.trained.any()


def test_a_size_the_processor_refuses_names_the_image(processors, tmp_path):
    write_image(tmp_path / "thin.png", 250, 1)
    record = {"image": "thin.png", "conversations": [{"from": "human", "value": "<image>"}]}
    sample = sample_from_record(record, str(tmp_path / "in.jsonl"), 2, "line")
    with pytest.raises(InputError, match=r"line 2, field 'image': image 0 \(thin\.png\): 1x250 image: .*200"):
        encode_sample(processors["qwen2vl"], sample)
    assert len(encode_sample(processors["llava"], sample).input_ids) > 16  # LLaVA crops: any shape goes


def test_an_image_token_typed_in_the_text_is_refused(processors, tmp_path):
    record = {
        "messages": [
            {"role": "user", "content": "look: <|image_pad|>"},
            {"role": "assistant", "content": "x"},
        ]
    }
    sample = sample_from_record(record, str(tmp_path / "in.jsonl"), 4, "line")
    with pytest.raises(
        InputError, match=r"in\.jsonl, line 4, field 'messages': the rendered text has 1 image"
    ):
        encode_sample(processors["qwen2vl"], sample)
