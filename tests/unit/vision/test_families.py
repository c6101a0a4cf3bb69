"""Every model family's processor, built offline from its own transformers classes: packtool's ids, labels
and image spans for each sample equal the processor's own output on that sample, or the family is
refused in one line naming it and why.

The reference for a sample is the processor itself on the rendered conversation and the sample's images
as ``Image.open`` gives them: ``processor(text=[rendered], images=[images])``, without its special tokens
where the rendered text starts with the BOS (``processor.apply_chat_template(..., tokenize=True)``'s
rule), with its character offsets and its replacement offsets. From those, independently of packtool's
splice: each image's span is the tokens, inside the text the processor wrote for it, from the first to
the last of its ``image_token_ids``; a token is trained when its first character lies in an assistant
span of the chat encoder (moved by the processor's layout and replacements), is of the text (not a
special token the tokenizer added) and is not in an image's span.

The images are real content (crops of matplotlib's sample photograph, logo and icon) at 1 x 1 to 1200 px,
in PNG, JPEG, WebP and GIF, RGB, L, RGBA, LA and palette with transparency. ``make test`` runs a subset
(24 images, 21 samples a family); the sweep over 114 images and 140 samples a family is slow-marked.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packtool.errors import ConfigError
from packtool.vision.processor import load_processor
from packtool.vision.samples import sample_from_record
from packtool.vision.sequences import encode_samples
from tests.fixtures.vision_families import FAMILIES, PALIGEMMA_TEMPLATE, processor_tokens
from tests.fixtures.vision_inputs import chat_records, write_real_images
from tests.fixtures.vision_processors import build_llava

HAS_NUM2WORDS = importlib.util.find_spec("num2words") is not None
# family -> None (exact) or what its refusal says
EXPECTED = {
    "llava": None,
    "llava_next": None,
    "qwen2_vl": None,
    "qwen2_5_vl": None,
    "qwen3_vl": None,
    "idefics3": None,
    "gemma3": None,
    "aya_vision": None,
    "paligemma": None,
    "llava_onevision": None,
    "internvl": None,
    "smolvlm": None
    if HAS_NUM2WORDS
    else r"smolvlm \(SmolVLMProcessor\) is refused: it cannot be built here "
    r"\(Package `num2words` is required",
    "mllama": r"mllama \(MllamaProcessor\) is refused for now: a cross-attention model",
    "pixtral": r"\(PixtralProcessor\) is refused: it cannot be built here \(PixtralProcessor requires the "
    r"Torchvision library",
    "mistral3": r"mistral3 \(PixtralProcessor\) is refused: it cannot be built here",
}
BUILDERS = {"llava": build_llava, **FAMILIES}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    (root / "paligemma.jinja").write_text(PALIGEMMA_TEMPLATE)
    out = {}
    for name, build in BUILDERS.items():
        (root / name).mkdir()
        out[name] = build(root / name)
    return out


def _load(family_dirs, name):
    template = str(family_dirs[name].parent / "paligemma.jinja") if name == "paligemma" else None
    return load_processor(family_dirs[name], chat_template=template)


def _samples(directory: Path, images: int, samples: int):
    paths = write_real_images(directory / "images", images)
    source = str(directory / "data.jsonl")
    return [sample_from_record(r, source, i + 1, "line") for i, r in enumerate(chat_records(paths, samples))]


@pytest.fixture(scope="module")
def few_samples(tmp_path_factory):
    return _samples(tmp_path_factory.mktemp("few"), 24, 21)


@pytest.fixture(scope="module")
def many_samples(tmp_path_factory):
    return _samples(tmp_path_factory.mktemp("many"), 114, 140)


def processor_reference(vp, sample) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """``(ids, trained, spans)`` of ``sample`` from the processor's own output (module docstring)."""
    text, trained_spans = vp.chat.trained_spans(sample.messages)
    images = [Image.open(ref.path) for ref in sample.images]
    return processor_tokens(vp, text, trained_spans, images)[:3]


def exact_samples(vp, samples) -> int:
    """How many samples packtool encodes exactly as the processor does (asserting that all are kept)."""
    kept, sequences = encode_samples(vp, samples)
    assert len(kept) == len(samples)
    exact = 0
    for sample, seq in zip(samples, sequences, strict=True):
        ids, trained, spans = processor_reference(vp, sample)
        got = list(zip(seq.image_offsets.tolist(), seq.image_lengths.tolist(), strict=True))
        exact += (
            ids.tolist() == seq.input_ids.tolist()
            and trained.tolist() == seq.trained.tolist()
            and got == spans
        )
    return exact


@pytest.mark.parametrize("family", list(EXPECTED))
def test_each_family_is_exact_or_refused(family_dirs, few_samples, family):
    if EXPECTED[family] is not None:
        with pytest.raises(ConfigError, match=EXPECTED[family]):
            _load(family_dirs, family)
        return
    vp = _load(family_dirs, family)
    assert exact_samples(vp, few_samples) == len(few_samples)


@pytest.mark.parametrize("family", [f for f, refused in EXPECTED.items() if refused is None])
def test_each_family_on_114_real_images(family_dirs, many_samples, family):
    vp = _load(family_dirs, family)
    assert exact_samples(vp, many_samples) == len(many_samples)


# families whose model the loader cannot feed packs of several samples (their processors' token_type_ids
# mark a prefix the model attends to both ways)
LOADER_REFUSED = {"paligemma": "its token_type_ids are not 1 on its image tokens only"}


@pytest.mark.parametrize("family", [f for f, refused in EXPECTED.items() if refused is None])
def test_the_loader_gives_each_family_s_inputs_for_a_pack(family_dirs, few_samples, family):
    """Three samples (images, none, images) in one pack: each span checked against the processor's tokens,
    the image inputs those of the processor on each sample alone, concatenated in pack order."""
    import torch

    from packtool.vision.loader import VisionTaskEncoder
    from packtool.vision.model_inputs import concat_padded

    vp = _load(family_dirs, family)
    if family in LOADER_REFUSED:
        with pytest.raises(ValueError, match=LOADER_REFUSED[family]):
            VisionTaskEncoder(vp, mask="dense")
        return
    chosen = [
        next(s for s in few_samples if len(s.images) >= 2),
        next(s for s in few_samples if not s.images),
        next(s for s in few_samples if len(s.images) == 1),
    ]
    _, sequences = encode_samples(vp, chosen)
    starts = np.cumsum([0, *(len(s) for s in sequences)])[:-1]
    pack = {
        "input_ids": np.concatenate([s.input_ids for s in sequences]),
        "seq_lens": np.array([len(s) for s in sequences], np.int32),
        "image_offset": np.concatenate([s.image_offsets + a for s, a in zip(sequences, starts, strict=True)]),
        "image_length": np.concatenate([s.image_lengths for s in sequences]),
        "images": [Path(ref.path).read_bytes() if ref.path else ref.data for s in chosen for ref in s.images],
        "pack_index": 0,
    }
    out = VisionTaskEncoder(vp, mask="dense", attention="causal").encode_sample(pack)  # any model's
    alone = []
    for sample in chosen:
        if sample.images:
            images = [Image.open(ref.path) for ref in sample.images]
            got = vp.processor(text=[vp.image_token * len(images)], images=[images], return_tensors="pt")
            alone.append(got)
    assert torch.equal(out["pixel_values"], concat_padded([a["pixel_values"] for a in alone]))
    for name, value in out["image_inputs"].items():
        assert torch.equal(value, concat_padded([torch.as_tensor(a[name]) for a in alone])), name
    if out["token_type_ids"] is not None:  # Gemma 3: 1 on its image tokens
        assert out["token_type_ids"].sum() == sum(
            int(np.isin(s.input_ids, vp.image_token_ids).sum()) for s in sequences
        )
