"""A vision-language output mixed with a text output of the same tokenizer, read by ``vision_dataset`` for a
vision model: each pack of a mixed batch (text packs beside packs with images) gives a tiny LLaVA (float64,
CPU) the logits it gives that pack read alone from its own output, and the images stay with their packs."""

from __future__ import annotations

import pytest
import torch

from packtool.errors import ConfigError
from packtool.loader import get_loader
from packtool.options import PackOptions
from packtool.pipeline.run import run_pack
from packtool.vision.loader import VisionBatch, vision_dataset
from packtool.vision.processor import load_processor
from tests.conftest import write_jsonl
from tests.fixtures.vision_inputs import write_llava_input
from tests.fixtures.vision_processors import build_llava
from tests.interop.test_vision_training import _llava

N = 90


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The LLaVA processor; the demo LLaVA records packed with it (``--processor``), and plain text packed
    with its tokenizer (``--tokenizer`` the processor's directory)."""
    tmp = tmp_path_factory.mktemp("vision_mixture")
    vp = load_processor(build_llava(tmp / "llava"))
    common = {"packed_sequence_size": N, "num_proc": 1, "quiet": True}
    run_pack(PackOptions.of(inputs=[str(write_llava_input(tmp / "input"))], output=str(tmp / "vision"),
                            processor=vp.path, **common))  # fmt: skip
    words = "the quick brown fox jumps over a lazy dog and then sleeps".split()
    rows = [{"text": " ".join(words[k % 5 :] + words[: k % 7])} for k in range(24)]
    text = write_jsonl(tmp / "text.jsonl", rows)
    run_pack(PackOptions.of(inputs=[str(text)], output=str(tmp / "text"), tokenizer=vp.path, **common))
    return vp, tmp / "vision", tmp / "text"


def test_a_vision_model_sees_each_pack_of_a_vision_and_text_mixture_as_alone(outputs):
    vp, vision, text = outputs
    model, _, _ = _llava(vp, len(vp.processor.tokenizer))
    alone = {}
    for s, directory in enumerate((vision, text)):
        ds = vision_dataset(directory, vp, batch_size=1, shuffle=False, drop_last=False, mask="dense",
                            attention=model.config)  # fmt: skip
        alone[s] = {int(b.pack_index[0]): b for b in get_loader(ds, num_workers=0)}
    mixture = [{"path": str(vision), "repeat": 1}, {"path": str(text), "repeat": 1}]
    ds = vision_dataset(
        mixture, vp, batch_size=3, seed=1, drop_last=False, mask="dense", attention=model.config
    )
    mixed, seen = 0, []
    for batch in get_loader(ds, num_workers=1):
        assert isinstance(batch, VisionBatch)
        sources, packs = batch.extra["source"].tolist(), batch.pack_index.tolist()
        seen += list(zip(sources, packs, strict=True))
        mixed += len(set(sources)) == 2 and batch.pixel_values is not None
        with torch.no_grad():
            logits = model(**batch).logits
            for row, (s, p) in enumerate(zip(sources, packs, strict=True)):
                ref = alone[s][p]
                assert batch.images_per_pack[row] == ref.images_per_pack[0]
                want = model(**ref).logits[0]
                assert (logits[row] - want).abs().max().item() < 1e-9, (s, p)
    assert mixed > 0  # a batch held text packs beside packs with images
    assert sorted(seen) == sorted((s, p) for s in alone for p in alone[s])  # repeat 1: every pack once


def test_a_vision_output_and_text_of_another_tokenizer_do_not_mix(outputs, tmp_path):
    from tests.conftest import DEMO_TOKENIZER

    vp, vision, _ = outputs
    text = write_jsonl(tmp_path / "t.jsonl", [{"text": "plain words here"}] * 8)
    other = tmp_path / "other"
    run_pack(PackOptions.of(inputs=[str(text)], output=str(other), tokenizer=str(DEMO_TOKENIZER),
                            packed_sequence_size=N, quiet=True))  # fmt: skip
    with pytest.raises(
        ConfigError, match=rf"cannot mix {vision} and {other}: they differ in tokenizer sha256"
    ):
        vision_dataset({str(vision): 1, str(other): 1}, vp, batch_size=2)
