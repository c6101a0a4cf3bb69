"""Every model family's processor, built offline from its own transformers classes: packtool's ids, labels
and image spans for each sample equal the processor's own output on that sample, or the family is
refused in one line naming it and why. An image the processor cannot take (DeepSeek-VL's and Janus's
take 3-channel images only) is its sample's bad input: packtool refuses the samples the processor fails
on, naming the image, and no other (but for one the processor fails on an image of alone: Emu3's 1 x 1
image, which it takes beside a larger one).

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

from packtool.errors import ConfigError, ErrorSink
from packtool.vision.processor import load_processor
from packtool.vision.samples import sample_from_record
from packtool.vision.sequences import encode_samples
from tests.fixtures.vision_families import FAMILIES, PALIGEMMA_TEMPLATE, processor_tokens
from tests.fixtures.vision_families_more import MORE_FAMILIES
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
    "mllama": None,
    "pixtral": r"\(PixtralProcessor\) is refused: it cannot be built here \(PixtralProcessor requires the "
    r"Torchvision library",
    "mistral3": r"mistral3 \(PixtralProcessor\) is refused: it cannot be built here",
    "llama4": r"llama4 \(Llama4Processor\) is refused: it cannot be built here \(Llama4ImageProcessor "
    r"requires the Torchvision library",
    "janus": None,
    "gemma4": None,
    "hunyuan_vl": None,
    "deepseek_vl": None,
    # its call appends the tokenizer's sep_token to every text, outside its layout: the refusal shows it
    "chameleon": r"chameleon \(ChameleonProcessor\) is refused: the text it tokenizes is not its layout "
    r"with each placeholder replaced: from character \d+ it is \.\.\.'.*<eoss>z\\n<reserved08706>' \(its "
    r"end\) where the layout gives \.\.\.'.*<eoss>z\\n' \(its end\)$",
    "emu3": None,
    "paddleocr_vl": None,
    "granite4_vision": None,
    "glm4v": None,
    "minicpmv": None,
    # each image's id, its place in its sample
    "minicpmv_ids": r"minicpmv4_6 \(MiniCPMV4_6Processor\) is refused: the text it writes for an image "
    r"depends on the other images of its sample",
    "fuyu": r"fuyu \(FuyuProcessor\) is refused: it fails on 9 of 9 probe images \(ValueError: The total "
    r"number of \|SPEAKER\| tokens",
    "ovis2": r"ovis2 \(Ovis2Processor\) fails on a probe image: AttributeError",
}
BUILDERS = {"llava": build_llava, **FAMILIES, **MORE_FAMILIES}
# families whose processor fails on some of the test images: how many of the 21 samples of make test
# packtool packs (Janus and DeepSeek-VL take 3-channel images only; Emu3 fails on a 1 x 1 image alone)
TAKES_SOME = {"janus": 6, "deepseek_vl": 6, "emu3": 19}


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


def reference_or_none(vp, sample):
    """``processor_reference``, or ``None`` where the processor fails on the sample's images."""
    try:
        return processor_reference(vp, sample)
    except ValueError:
        return None


def fails_alone(vp, sample) -> bool:
    """Whether the processor fails on one of the sample's images alone (Emu3 on a 1 x 1 image, which it
    takes beside a larger one: packtool counts each image alone, and refuses it)."""
    for ref in sample.images:
        try:
            vp.processor(text=[vp.placeholders(1)], images=[[Image.open(ref.path)]])
        except ValueError:
            return True
    return False


def exact_samples(vp, samples) -> int:
    """How many samples packtool packs, asserting that each is exactly as the processor encodes it and
    that each one it refuses (a bad image) has an image the processor fails on: with its sample, or
    alone."""
    sink = ErrorSink("skip")
    kept, sequences = encode_samples(vp, samples, sink)
    references = [reference_or_none(vp, s) for s in samples]
    refused = [not any(s is k for k in kept) for s in samples]
    for sample, reference, no in zip(samples, references, refused, strict=True):
        assert reference is None or fails_alone(vp, sample) if no else reference is not None
    assert sink.counts == ({"bad_image": sum(refused)} if any(refused) else {})
    references = [r for r, no in zip(references, refused, strict=True) if not no]
    for (ids, trained, spans), seq in zip(references, sequences, strict=True):
        got = list(zip(seq.image_offsets.tolist(), seq.image_lengths.tolist(), strict=True))
        assert (ids.tolist(), trained.tolist(), spans) == (seq.input_ids.tolist(), seq.trained.tolist(), got)
    return len(kept)


@pytest.mark.parametrize("family", list(EXPECTED))
def test_each_family_is_exact_or_refused(family_dirs, few_samples, family):
    if EXPECTED[family] is not None:
        with pytest.raises(ConfigError, match=EXPECTED[family]):
            _load(family_dirs, family)
        return
    vp = _load(family_dirs, family)
    assert exact_samples(vp, few_samples) == TAKES_SOME.get(family, len(few_samples))


@pytest.mark.parametrize("family", [f for f, refused in EXPECTED.items() if refused is None])
def test_each_family_on_114_real_images(family_dirs, many_samples, family):
    vp = _load(family_dirs, family)
    exact = exact_samples(vp, many_samples)
    assert exact == len(many_samples) or (family in TAKES_SOME and exact > len(many_samples) // 10)


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

    def taken(images):  # the first sample with that many images that the processor takes
        return next(s for s in few_samples if images(len(s.images)) and reference_or_none(vp, s) is not None)

    chosen = [taken(lambda n: n >= 2), taken(lambda n: n == 0), taken(lambda n: n == 1)]
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
    model = _meta_mllama(vp) if vp.cross_attention else None  # its model is hooked: any one of the family
    encoder = VisionTaskEncoder(vp, mask="dense", attention="causal", cross_attention=model)  # any model's
    out = encoder.encode_sample(pack)
    alone = []
    for sample in chosen:
        if sample.images:
            images = [Image.open(ref.path) for ref in sample.images]
            got = vp.processor(text=[vp.placeholders(len(images))], images=[images], return_tensors="pt")
            alone.append(got)
    if vp.cross_attention:  # a row of the pack's images: each sample's joined on the image dimension
        assert torch.equal(out["pixel_values"], concat_padded([a["pixel_values"][0] for a in alone])[None])
        for name, value in out["image_inputs"].items():
            assert torch.equal(value, concat_padded([torch.as_tensor(a[name])[0] for a in alone])[None]), name
        _check_cross_attention_mask(vp, chosen, out["cross_attention_mask"], starts)
        return
    assert torch.equal(out["pixel_values"], concat_padded([a["pixel_values"] for a in alone]))
    for name, value in out["image_inputs"].items():
        assert torch.equal(value, concat_padded([torch.as_tensor(a[name]) for a in alone])), name
    if out["token_type_ids"] is not None:  # Gemma 3: 1 on its image tokens
        assert out["token_type_ids"].sum() == sum(
            int(np.isin(s.input_ids, vp.image_token_ids).sum()) for s in sequences
        )


def _meta_mllama(vp):
    """A Mllama on the meta device (no weights): what the loader hooks for a cross-attention processor."""
    import torch
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    config = MllamaConfig(text_config={"vocab_size": len(vp.processor.tokenizer), "pad_token_id": 0})
    with torch.device("meta"):
        return MllamaForConditionalGeneration(config)


def _check_cross_attention_mask(vp, samples, mask, starts) -> None:
    """Each sample's rows of the pack's ``cross_attention_mask``: the processor's own mask of that sample
    alone (its rendered conversation and images) at the sample's images, 1 where it attends; 2 on every tile
    of them in the rows it gives no image; nothing on another sample's images."""
    first = 0
    for sample, a in zip(samples, starts, strict=True):
        text, _ = vp.chat.trained_spans(sample.messages)
        images = [Image.open(ref.path) for ref in sample.images]
        bos = vp.processor.tokenizer.bos_token
        ref = vp.processor(text=[text], images=[images] if images else None,
                           add_special_tokens=not text.startswith(bos))  # fmt: skip
        length = len(ref["input_ids"][0])
        rows = mask[a : a + length].numpy()
        others = np.ones(mask.shape[1], bool)
        others[first : first + len(images)] = False
        assert not rows[:, others].any()  # never another sample's image
        if images:
            own = np.asarray(ref["cross_attention_mask"][0])
            mine = rows[:, first : first + len(images)]
            without = ~own.any(axis=(1, 2))
            assert without.any() and (own[~without] > 0).any()
            assert np.array_equal(mine[~without], own[~without].astype(np.int8))
            assert (mine[without] == 2).all()
        first += len(images)
