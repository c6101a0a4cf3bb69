"""What the probes find of a processor beyond its counts: the images it cannot take (an image's record is
then bad input, not the family), the placeholder as it takes it in a text (HunYuan-VL's wrapped one), whether
its call adds the tokenizer's special tokens, and how a processor without an ``image_token_id`` (Janus) is
read. Each is checked against the processor itself, and travels to a worker with the driver's probes."""

from __future__ import annotations

import contextlib

import pytest
from PIL import Image

from packtool.errors import InputError
from packtool.vision.processor import load_processor
from packtool.vision.samples import sample_from_record
from packtool.vision.sequences import encode_sample
from tests.fixtures.vision_families_more import build_deepseek_vl, build_emu3, build_hunyuan_vl, build_janus
from tests.fixtures.vision_processors import build_llava
from tests.unit.vision.test_families import processor_reference


def _sample(tmp_path, images: list[tuple[str, str, tuple[int, int]]], name: str = "data.jsonl"):
    """A one-turn chat sample over images written as ``(file name, mode, (height, width))``."""
    paths = []
    for file, mode, (h, w) in images:
        Image.new("RGB", (w, h), (200, 90, 30)).convert(mode).save(tmp_path / file)
        paths.append(str(tmp_path / file))
    content = [{"type": "image"} for _ in paths] + [{"type": "text", "text": "What is it?"}]
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": "A block."}]
    record = {"messages": messages, "images": paths}
    return sample_from_record(record, str(tmp_path / name), 1, "line")


def _exact(vp, sample) -> bool:
    seq = encode_sample(vp, sample)
    ids, trained, spans = processor_reference(vp, sample)
    got = list(zip(seq.image_offsets.tolist(), seq.image_lengths.tolist(), strict=True))
    return (ids.tolist(), trained.tolist(), spans) == (seq.input_ids.tolist(), seq.trained.tolist(), got)


def test_an_image_the_processor_cannot_take_is_its_records_bad_input(tmp_path):
    """DeepSeek-VL's image processor takes 3-channel images only (it pads with an RGB color and
    normalizes with an RGB mean): the family packs; the record of an image it fails on is a bad image
    naming it and the processor's reason, as the processor itself fails on it."""
    vp = load_processor(build_deepseek_vl(tmp_path / "deepseek_vl"))
    assert vp.expander.modes_taken == ("RGB",)
    for taken in ([("a.png", "RGB", (30, 50))], [("b.png", "RGB", (40, 40)), ("c.jpg", "RGB", (1, 1))]):
        assert _exact(vp, _sample(tmp_path, taken))
    for file, mode, size in (("d.png", "L", (30, 50)), ("e.png", "L", (40, 40)), ("f.png", "LA", (30, 50)),
                             ("g.jpg", "CMYK", (30, 50)), ("h.png", "I;16", (30, 50))):  # fmt: skip
        sample = _sample(tmp_path, [("ok.png", "RGB", (20, 20)), (file, mode, size)])
        where = rf"line 1, field 'image': image 1 \(.*{file}\): {size[0]}x{size[1]} image: "
        with pytest.raises(
            InputError, match=where + rf"the processor fails on it \(mode {mode}\): ValueError: "
        ) as e:
            encode_sample(vp, sample)
        assert e.value.code == "bad_image"
        with pytest.raises(ValueError):
            processor_reference(vp, sample)


def test_a_mode_the_probes_did_not_try_is_run_once_per_size(tmp_path, monkeypatch):
    """LLaVA takes every mode the probes try; a CMYK or 16-bit image is run through the processor once per
    size, its text found the same as an RGB image's."""
    vp = load_processor(build_llava(tmp_path / "llava"))
    assert set(vp.expander.modes_taken) == {"RGB", "L", "LA", "RGBA", "P"}
    runs = []
    own = vp.expander._replacement

    def counted(*args, **kwargs):
        runs.append(kwargs.get("mode"))
        return own(*args, **kwargs)

    monkeypatch.setattr(vp.expander, "_replacement", counted)
    sample = _sample(tmp_path, [("a.jpg", "CMYK", (30, 50)), ("b.jpg", "CMYK", (30, 50)),
                                ("c.png", "I;16", (30, 50)), ("d.png", "L", (30, 50))])  # fmt: skip
    assert _exact(vp, sample)
    assert runs.count("CMYK") == 1 and runs.count("I;16") == 1 and "L" not in runs


def test_hunyuan_vl_is_probed_with_the_placeholder_its_template_writes(tmp_path):
    """HunYuan-VL's processor takes ``<image>`` only between ``<start>`` and ``<end>`` (its chat template
    writes them) and has its tokenizer add no special tokens: both found by the probes; a template that
    writes the bare placeholder makes a record the processor refuses, and so does packtool."""
    directory = build_hunyuan_vl(tmp_path / "hunyuan_vl")
    vp = load_processor(directory)
    assert (vp.expander.written, vp.expander.special_tokens) == ("<start><image><end>", False)
    sample = _sample(tmp_path, [("a.png", "RGB", (60, 90)), ("b.png", "L", (33, 33))])
    assert _exact(vp, sample)
    bare = tmp_path / "bare.jinja"
    bare.write_text((directory / "chat_template.jinja").read_text().replace("<start><image><end>", "<image>"))
    unwrapped = load_processor(directory, chat_template=str(bare))
    with pytest.raises(InputError, match="an image is written '<image>' where the processor takes only "
                       "'<start><image><end>'"):  # fmt: skip
        encode_sample(unwrapped, sample)
    with pytest.raises(ValueError, match="must be formatted as <start><image><end>"):
        processor_reference(unwrapped, sample)


@pytest.mark.parametrize("build", [build_hunyuan_vl, build_deepseek_vl])
def test_what_the_probes_find_travels_to_a_worker(tmp_path, build):
    driver = load_processor(build(tmp_path / "p"))
    worker = load_processor(driver.path, proven=driver.proofs())
    assert worker.proofs() == driver.proofs()
    sample = _sample(tmp_path, [("a.png", "RGB", (60, 90))])
    assert (
        encode_sample(worker, sample).input_ids.tolist() == encode_sample(driver, sample).input_ids.tolist()
    )
    grayscale = _sample(tmp_path, [("b.png", "L", (30, 50))])
    with pytest.raises(InputError) if build is build_deepseek_vl else contextlib.nullcontext():
        encode_sample(worker, grayscale)


def test_janus_without_an_image_token_id_reads_its_image_token(tmp_path):
    """Janus's processor names its image token but has no ``image_token_id`` (nor ``image_token_ids``):
    the image token's id is the tokenizer's, its span the run of ``<image_placeholder>`` between
    ``<begin_of_image>`` and ``<end_of_image>``."""
    vp = load_processor(build_janus(tmp_path / "janus"))
    assert not hasattr(vp.processor, "image_token_id")
    assert vp.image_token_id == vp.tokenizer.token_to_id("<image_placeholder>")
    assert vp.image_token_ids.tolist() == [vp.image_token_id]
    sample = _sample(tmp_path, [("a.png", "RGB", (60, 90))])
    assert _exact(vp, sample)
    seq = encode_sample(vp, sample)
    a, n = int(seq.image_offsets[0]), int(seq.image_lengths[0])
    assert n == 4 and vp.tokenizer.id_to_token(int(seq.input_ids[a - 1])) == "<begin_of_image>"


@pytest.mark.parametrize("bos_first", [False, True])
def test_emu3_s_layout_puts_its_bos_first_even_where_the_text_starts_with_it(tmp_path, bos_first):
    """Emu3's ``prepare_inputs_layout`` puts the BOS in front of the text unless it is told
    ``add_special_tokens=False``, which its call never tells it (it passes its merged options): a text that
    starts with the BOS gets a second one from the processor, and so from packtool."""
    directory = build_emu3(tmp_path / "emu3")
    template = tmp_path / "bos.jinja"
    template.write_text("{{ bos_token }}" + (directory / "chat_template.jinja").read_text())
    vp = load_processor(directory, chat_template=str(template) if bos_first else None)
    sample = _sample(tmp_path, [("a.png", "RGB", (60, 90))])
    assert _exact(vp, sample)
    bos = vp.tokenizer.token_to_id(vp.processor.tokenizer.bos_token)
    ids = encode_sample(vp, sample).input_ids.tolist()
    assert ids[: 1 + bos_first] == [bos] * (1 + bos_first) and ids.count(bos) == 1 + bos_first
