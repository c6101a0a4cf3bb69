"""Interleaved image-text documents (``--sample-format interleaved``): records of ``texts`` and ``images``
(``vision.samples.document_from_record``) and their tokens (``vision.sequences`` with ``Documents``).

For every family the chat path packs exactly, each document's ids equal what the processor writes for
its texts joined with its own image placeholder at each image, ``processor(text=[joined],
images=[images])`` (without the tokenizer's special tokens where ``joined`` starts with its BOS), and its
trained tokens, image spans and image blocks those the processor's output gives independently of
packtool's splice (``tests.fixtures.vision_families.processor_tokens``): the texts' tokens trained (and
the EOS of ``--add-eos``), or every token outside the spans with ``--loss-on all``. ``make test`` runs
LLaVA, Qwen2-VL, Idefics3, SmolVLM and Gemma 3 on 18 documents over 16 real images; the sweep over every
family is slow-marked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packtool.errors import InputError
from packtool.vision.processor import load_processor
from packtool.vision.samples import document_from_record
from packtool.vision.sequences import Documents, encode_samples
from tests.fixtures.vision_families import FAMILIES, processor_tokens
from tests.fixtures.vision_inputs import (
    document_records,
    image_bytes,
    read_samples,
    write_jsonl,
    write_real_images,
)
from tests.fixtures.vision_processors import build_llava

FAST = ("llava", "qwen2_vl", "idefics3", "smolvlm", "gemma3")
# what a document's text holds at each image: what the family's chat template writes for an image part
# (Qwen-VL's wraps the placeholder, as the model needs between two images side by side), or the
# processor's placeholder where there is no template (PaliGemma)
MARKUP = {"qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>", "gemma3": "<start_of_image>",
          "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>", "internvl": "<IMG_CONTEXT>",
          "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>"}  # fmt: skip
# every family the chat path packs exactly (test_families.EXPECTED), the fast ones first
FAMILIES_EXACT = (*FAST, "llava_next", "qwen2_5_vl", "qwen3_vl", "aya_vision", "paligemma", "mllama",
                  "llava_onevision", "internvl")  # fmt: skip
BUILDERS = {"llava": build_llava, **FAMILIES}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("interleaved")


@pytest.fixture(scope="module")
def documents(root) -> list[dict]:
    """18 documents over 16 real images (1 x 1 to 1200 px; PNG, JPEG, WebP, GIF; RGB to palette)."""
    return document_records(write_real_images(root / "images", 16), 18)


_LOADED: dict[str, object] = {}


def _processor(root: Path, family: str):
    if family not in _LOADED:
        (root / family).mkdir()
        _LOADED[family] = load_processor(BUILDERS[family](root / family), conversations=False)
    return _LOADED[family]


def reference(vp, record: dict, bos: str | None, eos: str | None, loss_all: bool) -> tuple:
    """``processor_tokens`` of ``record`` joined as the processor takes it, built here: the texts with the
    family's ``MARKUP`` (else ``processor.image_token``) at each image, ``bos`` before and ``eos`` after;
    the texts (and ``eos``) trained, or everything with ``loss_all``."""
    markup = next((m for f, m in MARKUP.items() if vp.path.endswith(f"/{f}")), vp.processor.image_token)
    assert vp.image_placeholder == markup
    parts = [(bos or "", False)]
    parts += [(t, True) if t is not None else (markup, False) for t in record["texts"]]
    parts.append((eos or "", True))
    text = "".join(p for p, _ in parts)
    ends = np.cumsum([len(p) for p, _ in parts])
    spans = [(int(e) - len(p), int(e)) for (p, trained), e in zip(parts, ends, strict=True) if trained]
    images = [Image.open(path) for path in record["images"] if path is not None]
    return processor_tokens(vp, text, [(0, len(text))] if loss_all else spans, images)


def exact_documents(vp, records: list[dict], source: Path, bos=None, eos=None, loss_all=False) -> int:
    """How many of ``records`` packtool encodes exactly as the processor does (all kept)."""
    samples = [document_from_record(r, str(source), i + 1, "line") for i, r in enumerate(records)]
    documents = Documents(bos, eos, "all" if loss_all else "texts")
    kept, sequences = encode_samples(vp, samples, documents=documents)
    assert len(kept) == len(samples)
    exact = 0
    for record, seq in zip(records, sequences, strict=True):
        ids, trained, spans, blocks = reference(vp, record, bos, eos, loss_all)
        got = list(zip(seq.image_offsets.tolist(), seq.image_lengths.tolist(), strict=True))
        same_blocks = [tuple(b) for b in seq.blocks().tolist()] == blocks
        if vp.expander.per_image_count and blocks:  # one block for every image (LLaVA-OneVision's)
            same_blocks = seq.blocks().tolist() == [[blocks[0][0], blocks[-1][1]]] * len(blocks)
        exact += (
            ids.tolist() == seq.input_ids.tolist()
            and trained.tolist() == seq.trained.tolist()
            and got == spans
            and same_blocks
        )
    return exact


@pytest.mark.parametrize("family", FAST)
def test_documents_are_exact_against_the_processor(root, documents, family):
    vp = _processor(root, family)
    tokenizer = vp.tokenizer
    bos, eos = tokenizer.special_token("bos"), tokenizer.special_token("eos")
    source = root / "docs.jsonl"
    assert exact_documents(vp, documents, source) == len(documents)
    assert exact_documents(vp, documents, source, bos=bos, eos=eos) == len(documents)
    assert exact_documents(vp, documents[:6], source, loss_all=True) == 6


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES_EXACT)
def test_every_family_s_documents_are_exact(root, documents, family):
    vp = _processor(root, family)
    eos = vp.tokenizer.special_token("eos")
    assert exact_documents(vp, documents, root / "docs.jsonl") == len(documents)
    assert exact_documents(vp, documents, root / "docs.jsonl", eos=eos, loss_all=True) == len(documents)


def test_the_texts_are_trained_and_no_token_the_processor_writes_for_an_image(root):
    """Gemma 3: ``\\n\\n<start_of_image>`` + soft tokens + ``<end_of_image>\\n\\n`` for each image; the
    texts' tokens trained, none of the image's (its block), the EOS trained; ``--loss-on all`` also trains
    the tokens around each span."""
    vp = _processor(root, "gemma3")
    image = root / "gemma-doc.png"
    image.write_bytes(image_bytes(40, 30))
    record = {"texts": ["A picture", None, "of noise."], "images": [None, str(image), None]}
    sample = document_from_record(record, str(root / "x.jsonl"), 1)
    eos = vp.tokenizer.special_token("eos")
    (seq,) = encode_samples(vp, [sample], documents=Documents(eos=eos))[1]
    (start, end), = seq.blocks().tolist()  # fmt: skip
    ids = seq.input_ids.tolist()
    boi = vp.tokenizer.token_to_id("<start_of_image>")
    assert start < ids.index(boi) < seq.image_offsets[0] and end > seq.image_offsets[0] + seq.image_lengths[0]
    assert not seq.trained[start:end].any() and seq.trained[start - 1] and seq.trained[end:].all()
    assert ids[-1] == vp.tokenizer.token_to_id(eos) and not seq.trained[0]  # the tokenizer's BOS
    (every,) = encode_samples(vp, [sample], documents=Documents(loss_on="all"))[1]
    span = slice(int(seq.image_offsets[0]), int(seq.image_offsets[0] + seq.image_lengths[0]))
    assert every.trained[start:end].any() and not every.trained[span].any()


BAD_DOCUMENTS = [
    ("lists of two lengths", {"texts": ["a", None], "images": [None]}, "images",
     r"2 texts for 1 images: the lists must be as long"),
    ("both at one position", {"texts": ["a"], "images": ["a.png"]}, "texts",
     r"position 0 holds both a text and an image"),
    ("neither at one position", {"texts": ["a", None], "images": [None, None]}, "texts",
     r"position 1 holds neither a text nor an image"),
    ("a text that is no string", {"texts": [3], "images": [None]}, "texts",
     r"(a text must be a string|expected list of str, got list of number)"),
    ("no texts", {"images": ["a.png"]}, "texts", r"an interleaved document needs 'texts' and 'images'"),
    ("an image that is no path", {"texts": [None], "images": [7]}, "images",
     r"position 0: image 0 is not a path or image bytes"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "record", "field", "message"), BAD_DOCUMENTS, ids=[b[0] for b in BAD_DOCUMENTS]
)
def test_bad_documents_are_one_line_errors_naming_file_line_and_field(tmp_path, what, record, field, message):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"texts": ["fine"], "images": [None]}, record])
    with pytest.raises(InputError) as caught:
        read_samples([path], interleaved=True)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{path}, line 2, field '{field}'"), text
    assert re.search(message, text), text


def test_a_text_holding_the_placeholder_is_refused(root):
    """Web text may spell ``<image>``: the processor would take it for an image, so the record is refused
    (``image_count``), naming its position."""
    vp = _processor(root, "llava")
    sample = document_from_record({"texts": ["see <image> here"], "images": [None]}, "d.jsonl", 4, "line")
    with pytest.raises(InputError, match=r"d\.jsonl, line 4, field 'texts': position 0: the text holds the "
                       r"processor's image placeholder '<image>'") as caught:  # fmt: skip
        encode_samples(vp, [sample], documents=Documents())
    assert caught.value.code == "image_count"


def test_images_by_bytes_and_by_datasets_image_struct(tmp_path):
    """An image position holds a path, raw bytes, or ``{"bytes", "path"}`` (a ``datasets.Image``)."""
    raw = image_bytes(20, 10)
    record = {
        "texts": ["a", None, None, None],
        "images": [None, raw, {"bytes": raw, "path": "x.png"}, "b.png"],
    }
    sample = document_from_record(record, str(tmp_path / "d.parquet"), 0)
    refs = sample.images
    assert refs[0].data == raw and refs[1].data == raw and refs[1].name == "x.png"
    assert refs[2].path == str(tmp_path / "b.png") and sample.document == ["a", None, None, None]


def test_webdataset_samples_name_their_image_members(tmp_path):
    """Energon's interleaved layout: a ``json`` member with ``texts`` and ``images``, each image naming
    a member by what follows the key; a name the sample lacks is ``missing_image``."""
    raw = image_bytes(20, 10)
    meta = {"texts": ["A cat:", None, "and", None], "images": [None, "0.jpg", None, "1.PNG"]}
    record = {"__key__": "doc7", "json": json.dumps(meta), "0.jpg": raw, "1.png": b"png"}
    sample = document_from_record(record, "shard.tar", 3, "sample")
    assert [r.name for r in sample.images] == ["doc7.0.jpg", "doc7.1.PNG"] and sample.images[1].data == b"png"
    del record["1.png"]
    with pytest.raises(InputError, match=r"field 'images': sample 'doc7': image 1 names member '1\.PNG'"):
        document_from_record(record, "shard.tar", 3, "sample")


def test_jsonl_lists_that_start_with_nulls_are_read_as_written(tmp_path):
    """The reason for the reader's check: pyarrow's JSON reader drops the nulls a list starts with
    (apache/arrow#51305), and OBELICS's ``images`` start with nulls wherever a document starts with text."""
    records = [{"texts": ["a", "b", None], "images": [None, None, "x.png"]},
               {"texts": [None, "c"], "images": ["y.png", None]}]  # fmt: skip
    path = write_jsonl(tmp_path / "docs.jsonl", records)
    got = [s.document for s in read_samples([path], interleaved=True)]
    assert got == [["a", "b", None], [None, "c"]]
