"""The processor's image-token count from a header alone equals what the processor itself produces.

220 real image files (PNG, JPEG, WebP, GIF, BMP, TIFF; RGB, grayscale, RGBA, palette; 1 x 1 to 4000 px,
aspect ratios up to 1:150) are written with Pillow; for each, ``image_size`` reads the header and
``VisionProcessor.image_tokens`` counts. The processor itself (PIL backend) then runs on the decoded image:
LLaVA's whole ``LlavaProcessor`` (the ``<image>`` tokens it writes into ``input_ids``), Qwen2-VL's image
processor (``image_grid_thw.prod() // merge_size ** 2``, the count its processor writes). Images with a side
over 1000 px go through the processor on a subset (every fifth) to keep the test cheap; all of them go
through the count rule.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from packtool.errors import ConfigError
from packtool.vision.images import image_size
from packtool.vision.processor import load_processor
from tests.conftest import DEMO
from tests.fixtures.vision_processors import build_llava, build_qwen2vl

FORMATS = [("PNG", "RGB"), ("PNG", "L"), ("PNG", "RGBA"), ("PNG", "P"), ("JPEG", "RGB"), ("JPEG", "L"),
           ("WEBP", "RGB"), ("WEBP", "RGBA"), ("GIF", "P"), ("BMP", "RGB"), ("TIFF", "L")]  # fmt: skip


def image_sizes(count: int, seed: int = 0) -> list[tuple[int, int]]:
    """``(height, width)`` pairs: small and large, square, wide and tall, tiny sides, up to 1:150."""
    rng = np.random.default_rng(seed)
    fixed = [(1, 1), (1, 150), (150, 1), (27, 29), (28, 28), (56, 56), (100, 14000 // 100), (4000, 3000),
             (33, 4000), (4000, 27), (224, 224), (336, 336), (480, 640), (1080, 1920)]  # fmt: skip
    out = list(fixed)
    while len(out) < count:
        side = int(np.exp(rng.uniform(np.log(8), np.log(900))))
        ratio = float(np.exp(rng.uniform(-np.log(20), np.log(20))))
        out.append((min(1000, max(1, int(side * ratio**0.5))), min(1000, max(1, int(side / ratio**0.5)))))
    return out


@pytest.fixture(scope="module")
def image_files(tmp_path_factory) -> list[tuple[str, Image.Image | None, tuple[int, int]]]:
    """``(path, decoded image or None for the large ones not run, (height, width))``."""
    tmp = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    out = []
    for i, (h, w) in enumerate(image_sizes(220)):
        fmt, mode = FORMATS[i % len(FORMATS)]
        pixels = rng.integers(0, 256, (min(h, 16), min(w, 16), 3), dtype=np.uint8)
        image = Image.fromarray(pixels).resize((w, h), Image.NEAREST).convert(mode)
        path = tmp / f"{i:03d}.{fmt.lower()}"
        image.save(path, format=fmt)
        large = max(h, w) > 1000
        out.append((str(path), None if large and i % 5 else Image.open(path).convert("RGB"), (h, w)))
    return out


def test_the_header_gives_the_size_the_decoder_gives(image_files):
    for path, _, (h, w) in image_files:
        size = image_size(path)
        assert (size.height, size.width) == (h, w), path


def test_llava_counts_what_its_processor_writes(image_files, processors):
    vp = processors["llava"]
    assert vp.family == "llava (LlavaProcessor)" and vp.identity()["expansion"].startswith("arithmetic")
    ran = 0
    for path, image, _ in image_files:
        size = image_size(path)
        count = vp.image_tokens(size.height, size.width)
        if image is not None:
            ids = vp.processor(text=["a <image> b"], images=[image])["input_ids"][0]
            assert int((np.asarray(ids) == vp.image_token_id).sum()) == count, path
            ran += 1
    assert count == 16 and ran >= 200  # (56 / 14) ** 2, the CLS feature dropped


def test_qwen2vl_counts_what_its_image_processor_gives(image_files, processors):
    vp = processors["qwen2vl"]
    assert vp.family == "qwen2_vl (Qwen2VLProcessor)" and vp.video.startswith("not loaded (needs torchvision")
    assert type(vp.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    counts, ran = set(), 0
    for path, image, _ in image_files:
        size = image_size(path)
        count = vp.image_tokens(size.height, size.width)
        counts.add(count)
        if image is not None:
            grid = vp.image_processor(images=[image], return_tensors="np")["image_grid_thw"][0]
            assert int(np.prod(grid)) // vp.image_processor.merge_size**2 == count, (path, size, grid)
            ran += 1
    # min_pixels 4 * 28 ** 2 -> at least 4 tokens; max_pixels 64 * 28 ** 2 -> 64, except at extreme aspect
    # ratios, where the rule keeps the short side at 28 (its max(factor, ...)) and goes over max_pixels
    assert ran >= 200 and len(counts) > 20 and min(counts) == 4 and 64 in counts


def test_llava_15_layout_gives_576_tokens(tmp_path):
    """LLaVA-1.5's 336 x 336 crop, patch 14: 24 * 24 patches, the CLS feature dropped."""
    vp = load_processor(build_llava(tmp_path / "l", crop=336))
    assert vp.image_tokens(480, 640) == vp.image_tokens(7, 3000) == 576
    ids = vp.processor(text=["<image>"], images=[Image.new("RGB", (640, 480))])["input_ids"][0]
    assert int((np.asarray(ids) == vp.image_token_id).sum()) == 576


def test_smart_resize_rule_at_qwen2vl_defaults(tmp_path):
    """At the released defaults (min_pixels 56 * 56, max_pixels 28 * 28 * 1280): the known counts."""
    vp = load_processor(build_qwen2vl(tmp_path / "q", min_pixels=56 * 56, max_pixels=28 * 28 * 1280))
    assert vp.image_tokens(224, 224) == 64  # 8 x 8 merged patches
    # 1092 x 1932 after rounding is over max_pixels: scaled by sqrt(1080 * 1920 / max_pixels) and floored
    # to multiples of 28, 728 x 1316: 52 x 94 patches, / 4
    assert vp.image_tokens(1080, 1920) == 52 * 94 // 4
    image = Image.new("RGB", (1920, 1080))
    grid = vp.image_processor(images=[image], return_tensors="np")["image_grid_thw"][0]
    assert int(np.prod(grid)) // 4 == vp.image_tokens(1080, 1920)


def test_a_directory_without_an_image_processor_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        load_processor(tmp_path / "nope")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_bytes(
        (DEMO / "chat-tokenizer" / "tokenizer.json").read_bytes()
    )
    with pytest.raises(ConfigError, match="processor .*tok"):
        load_processor(tmp_path / "tok")


def test_a_chat_template_json_of_the_processor_is_used(tmp_path, processors):
    """LLaVA-1.5's layout: the template only in the processor's chat_template.json."""
    directory = build_llava(tmp_path / "l")
    template = (directory / "chat_template.jinja").read_text()
    (directory / "chat_template.jinja").unlink()
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    vp = load_processor(directory)
    assert vp.chat.template == template and vp.chat.template_source.endswith("chat_template.json")


def test_the_identity_hashes_the_config_files(tmp_path, processors):
    a = processors["qwen2vl"].identity()
    b = load_processor(build_qwen2vl(tmp_path / "q", max_pixels=32 * 28 * 28)).identity()
    assert a["family"] == "qwen2_vl (Qwen2VLProcessor)" and a["image_token"] == "<|image_pad|>"
    assert a["config_sha256"] != b["config_sha256"]


def test_bytes_and_path_give_the_same_count(image_files, processors):
    path = image_files[7][0]
    with open(path, "rb") as f:
        data = f.read()
    assert image_size(io.BytesIO(data).getvalue()) == image_size(path)


def test_the_identity_changes_with_what_changes_the_ids(tmp_path, processors):
    """The chat template given and the loss rule are part of the ids (and so of the run id)."""
    directory = processors["llava"].path
    other = tmp_path / "other.jinja"
    other.write_text("{% for m in messages %}{{ m['role'] }}: <image>{% endfor %}")
    base = processors["llava"].identity()
    assert (
        load_processor(directory, chat_template=str(other)).identity()["chat_template_sha256"]
        != (base["chat_template_sha256"])
    )
    assert load_processor(directory, loss_on="all").identity()["loss_on"] == "all" != base["loss_on"]
    assert base["transformers"] and base["image_token_ids"] == [processors["llava"].image_token_id]


BAD_VALUES = [
    ("processor_config.json", ["patch_size"], 0, "'patch_size' is 0: must be positive"),
    ("processor_config.json", ["num_additional_image_tokens"], -1,
     "'num_additional_image_tokens' is -1: must not be negative"),
    ("processor_config.json", ["image_processor", "crop_size", "height"], -336,
     "'image_processor.crop_size.height' is -336: must be positive"),
    ("processor_config.json", ["image_processor", "size", "shortest_edge"], "56",
     "'image_processor.size.shortest_edge' is '56': expected a number"),
    ("processor_config.json", ["vision_feature_select_strategy"], "defualt",
     "'vision_feature_select_strategy' is 'defualt': expected default or full"),
    # LlavaProcessor takes the first of the token's ids: an IndexError (exit 4) before
    ("processor_config.json", ["image_token"], "", "'image_token' is '': expected the image token's text"),
]  # fmt: skip


@pytest.mark.parametrize("file, keys, value, message", BAD_VALUES)
def test_a_bad_config_value_is_a_config_error_naming_the_field(tmp_path, file, keys, value, message):
    directory = build_llava(tmp_path / "l")
    config = json.loads((directory / file).read_text())
    node = config
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    (directory / file).write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=f"{file} field {message}"):
        load_processor(directory)


@pytest.mark.parametrize(
    "file, message",
    [("processor_config.json", "processor_config.json is nested too deep for a configuration"),
     ("tokenizer_config.json", "cannot load with AutoProcessor: RecursionError: ")],
)  # fmt: skip
def test_a_config_nested_too_deep_is_a_config_error(tmp_path, file, message):
    """JSON nested 100,000 deep: Python's parser raises RecursionError, which was exit 4."""
    directory = build_llava(tmp_path / "l")
    (directory / file).write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(ConfigError, match=message):
        load_processor(directory)


def test_a_processor_failing_on_the_probe_images_is_a_config_error(tmp_path):
    """A value the field checks do not know, that the processor's own code fails on, is still exit 2."""
    directory = build_llava(tmp_path / "l")
    config = json.loads((directory / "processor_config.json").read_text())
    config["image_processor"]["resample"] = 99  # not a Pillow resampling filter
    (directory / "processor_config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConfigError,
        match=r"llava \(LlavaProcessor\) is refused: it fails on 9 of 9 probe images \(ValueError: ",
    ):
        load_processor(directory)


class _ByPixels:
    """Wraps LLaVA's replacement so that a dark image gets one more ``<image>``: a processor whose text
    depends on the pixels, which packtool must refuse."""

    def __init__(self, processor):
        self.own = processor.replace_image_token

    def __call__(self, image_inputs, image_idx, **kwargs):
        extra = float(image_inputs["pixel_values"][image_idx].mean()) < -1.0
        return self.own(image_inputs, image_idx, **kwargs) + "<image>" * extra


def test_a_processor_whose_text_depends_on_the_pixels_is_refused(processors):
    from packtool.vision.expansion import Expander, Refused

    processor = processors["llava"].processor
    patched = type(processor).__new__(type(processor))
    patched.__dict__.update(processor.__dict__)
    patched.replace_image_token = _ByPixels(processor)
    with pytest.raises(Refused, match="depends on the image's pixels"):
        Expander(patched, processor.tokenizer._tokenizer).probe()


def test_an_arithmetic_count_that_disagrees_with_the_processor_is_found(tmp_path):
    """The first sizes of a run are expanded both ways: a _get_num_multimodal_tokens that is wrong for a
    size the probes did not meet stops the run instead of packing wrong counts."""
    vp = load_processor(build_llava(tmp_path / "l"))
    own = vp.processor._get_num_multimodal_tokens

    def wrong_for_wide(image_sizes=None, **kwargs):
        out = own(image_sizes=image_sizes, **kwargs)
        if image_sizes[0] == (70, 1000):
            return {"num_image_tokens": [out["num_image_tokens"][0] + 1]}
        return out

    vp.processor._get_num_multimodal_tokens = wrong_for_wide
    assert vp.image_tokens(480, 640) == 16
    with pytest.raises(ConfigError, match="disagrees with the text it writes for a 70x1000 image"):
        vp.expansion(70, 1000)


def test_a_processor_travels_to_a_worker_by_its_load_arguments(tmp_path, processors):
    """Pickled (a DataLoader worker under spawn, a pool task), a processor is loaded again from its
    arguments: Qwen2-VL's is built with a class made at load time, which pickle cannot carry."""
    import pickle

    other = tmp_path / "t.jinja"
    other.write_text(
        "{% for m in messages %}{{ m['role'] }}: <|vision_start|><|image_pad|><|vision_end|>{% endfor %}"
    )
    vp = load_processor(processors["qwen2vl"].path, chat_template=str(other), loss_on="all")
    again = pickle.loads(pickle.dumps(vp))
    assert again.identity() == vp.identity() and again.chat.template == vp.chat.template
    assert again.expansion(480, 640).span_length == vp.expansion(480, 640).span_length


def test_a_worker_takes_the_drivers_probes_of_the_same_processor_only(tmp_path, monkeypatch):
    """``proven`` (the driver's probes, for its workers) is taken when the directory's configuration gives
    the digest it had, and the processor is probed again when it does not."""
    from packtool.vision import expansion
    from tests.fixtures.vision_processors import build_qwen2vl

    directory = build_qwen2vl(tmp_path / "qwen2vl")
    driver = load_processor(directory)
    probed = []
    monkeypatch.setattr(expansion.Expander, "probe", lambda self: probed.append(1))
    worker = load_processor(directory, proven=driver.proofs())
    assert not probed and worker.proofs() == driver.proofs()
    assert worker.expansion(480, 640).span().tolist() == driver.expansion(480, 640).span().tolist()
    load_processor(directory, proven={**driver.proofs(), "config_sha256": "another directory's"})
    assert probed == [1]
