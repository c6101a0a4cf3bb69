"""A cross-attention model's packs (``packtool.vision.cross_attention``): the pack's mask by the processor's
rule, the hooks on the model (registered once; the processor's own batches through them unchanged), and
the one-line refusals of a cross-attention processor without its model, or a model for another family.

Training equivalence on packs is ``tests/interop/test_vision_training.py`` (``mllama``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from packtool.vision.cross_attention import (
    OWN,
    SAMPLE,
    attend_own_images,
    batch_cross_attention_mask,
    pack_cross_attention_mask,
)
from packtool.vision.loader import VisionTaskEncoder
from packtool.vision.processor import load_processor
from tests.fixtures.vision_families import build_mllama
from tests.fixtures.vision_processors import build_llava


@pytest.fixture(scope="module")
def mllama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mllama")
    return load_processor(build_mllama(directory))


def _tiny_mllama(vp):
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    config = MllamaConfig(
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_global_layers": 1, "attention_heads": 2, "image_size": 28, "patch_size": 14,
                       "max_num_tiles": 2, "supported_aspect_ratios": [[1, 1], [1, 2], [2, 1]],
                       "intermediate_layers_indices": [0], "vision_output_dim": 32},
        text_config={"vocab_size": len(vp.processor.tokenizer), "hidden_size": 16, "intermediate_size": 32,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                     "cross_attention_layers": [1], "pad_token_id": 0},
        image_token_index=vp.image_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MllamaForConditionalGeneration._from_config(config, dtype=torch.float64).eval()
    with torch.no_grad():
        for name, gate in model.named_parameters():
            if name.endswith("_gate"):
                gate.fill_(0.5)
    return model


def test_a_pack_s_mask_is_each_sample_s_by_the_processor_s_rule(mllama):
    """Three samples: text then an image, none, two consecutive images then text (the rule: an image from its
    token to the next image's, consecutive ones to the end). Each token the rule gives images attends their
    real tiles; the others of a sample with images its images' every tile (SAMPLE);
    a sample without images nothing; no token another sample's images."""
    image, bos = mllama.image_token_id, 2
    first = [bos, 10, 11, image, 12, 13]  # the rule: the image from its token to the end
    second = [bos, 14, 15]
    third = [bos, image, image, 16, 17]  # consecutive images: each from its token to the end
    ids = np.array(first + second + third)
    mask = pack_cross_attention_mask(
        mllama.processor,
        ids,
        np.array([6, 3, 5]),
        image_sample=np.array([0, 2, 2]),
        tiles=np.array([2, 1, 2]),
    )
    assert mask.shape == (14, 3, 2) and mask.dtype == torch.int8
    want = np.zeros((14, 3, 2), np.int8)
    want[0:3, 0] = SAMPLE  # before its image: its image's every tile
    want[3:6, 0] = OWN
    want[9, 1:] = SAMPLE  # the BOS of the third sample
    want[10:14, 1, :1] = OWN  # one tile, from its token on
    want[11:14, 2] = OWN  # from its token on
    assert np.array_equal(mask.numpy(), want)
    batch = batch_cross_attention_mask([mask, mask[:, :1]], tiles=2)
    assert batch.shape == (2, 14, 4, 2) and not batch[:, :, 3].any()  # the zero image's slot, last
    assert torch.equal(batch[1, :, :1], mask[:, :1]) and not batch[1, :, 1:].any()


def test_the_hooks_leave_the_processor_s_own_batches_as_they_are(mllama):
    """Hooked once however often asked, the model gives the processor's own batch (no extra slot) exactly
    what it gives without the hooks."""
    hooked, plain = _tiny_mllama(mllama), _tiny_mllama(mllama)
    assert attend_own_images(attend_own_images(hooked)) is hooked
    assert len(hooked.model._forward_pre_hooks) == len(hooked.model.language_model._forward_pre_hooks) == 1
    images = [
        [Image.new("RGB", (40, 20), 90)],
        [Image.new("RGB", (20, 20), 30), Image.new("RGB", (30, 60), 9)],
    ]
    texts = [f"{mllama.image_token}a b", f"c {mllama.image_token}{mllama.image_token} d e"]
    inputs = mllama.processor(text=texts, images=images, padding=True, return_tensors="pt")
    inputs = {k: v for k, v in inputs.items() if k != "attention_mask"}
    inputs["pixel_values"] = inputs["pixel_values"].to(torch.float64)
    with torch.no_grad():
        assert torch.equal(hooked(**inputs).logits, plain(**inputs).logits)


def test_a_cross_attention_processor_needs_its_model_and_only_it_takes_one(mllama, tmp_path):
    with pytest.raises(
        ValueError, match=r"^mllama \(MllamaProcessor\) is a cross-attention model: pass its model"
    ):
        VisionTaskEncoder(mllama, mask="dense", attention="causal")
    with pytest.raises(ValueError, match="is a cross-attention model"):
        VisionTaskEncoder(mllama, mask="dense", attention="causal", cross_attention=torch.nn.Linear(2, 2))
    llava = load_processor(build_llava(tmp_path))
    with pytest.raises(ValueError, match=r"^cross_attention= is for a cross-attention model's processor"):
        VisionTaskEncoder(llava, mask="dense", attention="causal", cross_attention=_tiny_mllama(mllama))
    with pytest.raises(ValueError, match="Linear is not a cross-attention model"):
        attend_own_images(torch.nn.Linear(2, 2))
