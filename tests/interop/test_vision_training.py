"""Training on packs of vision-language samples equals training on each sample alone (issue 29).

Tiny random models built from transformers configs, on the CPU in float64: a LLaVA (CLIP vision tower,
Llama language model; ``LlavaForConditionalGeneration``), a Qwen2-VL (``Qwen2VLForConditionalGeneration``)
and a Qwen2.5-VL (window attention in its vision tower; it reads Qwen2-VL's processor output).
Their processors are the tiny ones of ``tests/fixtures/vision_processors.py``; the samples are LLaVA records
with one, two and no image. packtool encodes them (``encode_sample``), plans whole samples into packs
(``plan_packs``), stores the pack with its images' original bytes (``pack_records``, written to Parquet and
read back: ``pack_from_record``), and decodes the stored images into the model's inputs in pack order
(``image_inputs``: ``pixel_values``, and ``image_grid_thw`` for Qwen2-VL). The samples alone read their
image files.

For the pack, run once through ``attn_implementation="sdpa"`` with the dense block-causal mask
(``packtool.masks.block_causal_mask``) and once flattened (no mask; the sequence boundaries from the
``position_ids``, which restart at every sample), the per-token loss equals each sample's loss run alone,
and the gradient of the summed loss with respect to one vision-tower and one language-model parameter
equals that of the samples alone, within 1e-9. Qwen2-VL's M-RoPE position ids ``(3, 1, N)`` are the
model's own ``get_rope_index`` run on each sample alone, concatenated (``mrope_position_ids``); flattened,
the text positions go first as a fourth row (``(4, 1, N)``, ``with_text_positions``), the layout
transformers reads packed-sequence boundaries from. The
samples alone get no position ids: the model computes its own, so the packed positions are checked against
the model's rule too.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from packtool.masks import block_causal_mask
from packtool.vision.model_inputs import image_inputs
from packtool.vision.packs import assemble_pack, plan_packs
from packtool.vision.positions import mrope_position_ids, with_text_positions
from packtool.vision.processor import load_processor
from packtool.vision.records import pack_from_record, pack_records
from packtool.vision.samples import read_json_samples
from packtool.vision.sequences import encode_sample, sequence_columns
from tests.fixtures.vision_inputs import write_llava_input
from tests.fixtures.vision_processors import LLAVA_CROP, build_llava, build_qwen2vl

TOL = 1e-9


def _llava(vp, vocab: int):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            image_size=LLAVA_CROP, patch_size=14, projection_dim=32,
        ),
        text_config=LlamaConfig(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        ),
        image_token_id=vp.image_token_id, vision_feature_select_strategy="default", vision_feature_layer=-2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration._from_config(
        config, attn_implementation="sdpa", dtype=torch.float64
    )
    vision = model.model.vision_tower.encoder.layers[0].self_attn.q_proj.weight
    text = model.model.language_model.layers[0].self_attn.q_proj.weight
    return model.eval(), vision, text


def _qwen2vl(vp, vocab: int):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tok = vp.tokenizer
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
        },
        vision_config={
            "depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 4, "mlp_ratio": 2, "patch_size": 14,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
        },
        image_token_id=vp.image_token_id, video_token_id=tok.token_to_id("<|video_pad|>"),
        vision_start_token_id=tok.token_to_id("<|vision_start|>"),
        vision_end_token_id=tok.token_to_id("<|vision_end|>"),
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration._from_config(
        config, attn_implementation="sdpa", dtype=torch.float64
    )
    vision = model.model.visual.blocks[0].attn.qkv.weight
    text = model.model.language_model.layers[0].self_attn.q_proj.weight
    return model.eval(), vision, text


def _qwen25vl(vp, vocab: int):
    """Qwen2.5-VL: the same processor and text model; a vision tower with window attention (one window
    layer, one full-attention layer) and an MLP merger."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = vp.tokenizer
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
        },
        vision_config={
            "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "out_hidden_size": 32,
            "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
            "fullatt_block_indexes": [1],
        },
        image_token_id=vp.image_token_id, video_token_id=tok.token_to_id("<|video_pad|>"),
        vision_start_token_id=tok.token_to_id("<|vision_start|>"),
        vision_end_token_id=tok.token_to_id("<|vision_end|>"),
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration._from_config(
        config, attn_implementation="sdpa", dtype=torch.float64
    )
    vision = model.model.visual.blocks[0].attn.qkv.weight
    text = model.model.language_model.layers[0].self_attn.q_proj.weight
    return model.eval(), vision, text


MODELS = {"llava": _llava, "qwen2vl": _qwen2vl, "qwen25vl": _qwen25vl}


def _token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross entropy (0 where the label is -100); packtool's labels are already shifted."""
    flat = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100, reduction="none")
    return flat.view(labels.shape)


def _image_inputs(vp, images: list[Image.Image]) -> dict:
    if not images:
        return {}
    out = vp.image_processor(images=images, return_tensors="pt")
    inputs = {"pixel_values": out["pixel_values"].to(torch.float64)}
    if "image_grid_thw" in out:
        inputs["image_grid_thw"] = out["image_grid_thw"]
    return inputs


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vision_training")
    samples = list(read_json_samples(write_llava_input(tmp / "input")))
    return {
        "samples": samples,
        "images": [[Image.open(ref.path).convert("RGB") for ref in s.images] for s in samples],
        "llava": load_processor(build_llava(tmp / "llava")),
        "qwen2vl": load_processor(build_qwen2vl(tmp / "qwen2vl")),
    }


def _stored(records: pa.RecordBatch, tmp_path) -> dict:
    """Pack 0 of ``records`` written to Parquet and read back."""
    pq.write_table(pa.Table.from_batches([records]), tmp_path / "packs.parquet")
    return pq.read_table(tmp_path / "packs.parquet").slice(0, 1).to_pylist()[0]


def _mm_token_type_ids(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    return (input_ids == image_token_id).to(torch.int32)


@pytest.mark.parametrize("how", ["dense", "flattened"])
@pytest.mark.parametrize("family", ["llava", "qwen2vl", "qwen25vl"])
def test_packed_loss_and_gradients_equal_each_sample_alone(data, family, how, tmp_path):
    vp = data["llava" if family == "llava" else "qwen2vl"]  # Qwen2.5-VL's processor is Qwen2-VL's
    sequences = [encode_sample(vp, s) for s in data["samples"]]
    n = sum(len(s) for s in sequences) + 5  # one pack: the four samples (1, 2, 0 and 2 images) and padding
    plan = plan_packs(sequences, n)
    pack = assemble_pack(sequence_columns(sequences), plan, 0, pad_id=0)
    assert plan.num_packs == 1 and len(pack.samples) == 4 and len(pack.image_offsets) == 5
    vocab = max(int(s.input_ids.max()) for s in sequences) + 1
    model, vision_param, text_param = MODELS[family](vp, vocab)
    input_ids = torch.from_numpy(pack.input_ids).view(1, -1)
    labels = torch.from_numpy(pack.labels).view(1, -1)
    ends = np.cumsum(pack.seq_lens)
    bounds = list(zip([0, *ends[:-1].tolist()], ends.tolist(), strict=True))[: len(pack.samples)]

    # each sample alone: the model's own positions (M-RoPE from its get_rope_index)
    model.zero_grad()
    want = torch.zeros(labels.shape, dtype=torch.float64)
    alone_positions = []
    for j, (a, b) in enumerate(bounds):
        i = int(pack.samples[j])
        ids = input_ids[:, a:b]
        extra = _image_inputs(vp, data["images"][i])
        if family != "llava":
            extra["mm_token_type_ids"] = _mm_token_type_ids(ids, vp.image_token_id)
            positions, _ = model.model.get_rope_index(
                ids, extra["mm_token_type_ids"], image_grid_thw=extra.get("image_grid_thw")
            )
            alone_positions.append(positions)
        logits = model(input_ids=ids, use_cache=False, **extra).logits
        loss = _token_loss(logits, labels[:, a:b])
        loss.sum().backward()
        want[0, a:b] = loss[0].detach()
    want_grads = [vision_param.grad.clone(), text_param.grad.clone()]

    # the pack as stored: a Parquet row with its images' bytes, read back; the images in pack order
    stored = _stored(pack_records(sequence_columns(sequences), plan, data["samples"], pad_id=0), tmp_path)
    pack = pack_from_record(stored)
    input_ids = torch.from_numpy(pack.input_ids).view(1, -1)
    labels = torch.from_numpy(pack.labels).view(1, -1)
    extra = image_inputs(vp, [image["bytes"] for image in stored["images"]], torch.float64)
    text_positions = torch.from_numpy(pack.position_ids).view(1, -1)
    if family != "llava":
        grids = extra["image_grid_thw"]
        position_ids = mrope_position_ids(model.model.get_rope_index, pack, grids)  # (3, 1, N)
        assert torch.equal(position_ids[:, :, : bounds[-1][1]], torch.cat(alone_positions, dim=-1))
    else:
        position_ids = text_positions
    model.zero_grad()
    if how == "dense":
        mask = block_causal_mask(torch.from_numpy(pack.seq_lens).view(1, -1), n)
        logits = model(
            input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False, **extra
        ).logits
    else:
        if family != "llava":  # the text positions first: transformers finds the boundaries from them
            position_ids = with_text_positions(position_ids, text_positions)
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **extra).logits
    loss = _token_loss(logits, labels)
    loss.sum().backward()

    assert int((labels != -100).sum()) > 10
    assert (loss.detach() - want).abs().max().item() < TOL
    for got, expected in zip([vision_param.grad, text_param.grad], want_grads, strict=True):
        assert expected.abs().max().item() > 0  # the parameter takes part
        assert (got - expected).abs().max().item() < TOL


def test_a_wrong_image_order_would_be_caught(data):
    """The check has teeth: the pack's images in reverse order change the loss."""
    vp = data["llava"]
    sequences = [encode_sample(vp, s) for s in data["samples"]]
    plan = plan_packs(sequences, sum(len(s) for s in sequences))
    pack = assemble_pack(sequence_columns(sequences), plan, 0, pad_id=0)
    model, _, _ = _llava(vp, max(int(s.input_ids.max()) for s in sequences) + 1)
    images = [
        data["images"][pack.samples[j]][k] for j, k in zip(pack.image_sample, pack.image_index, strict=True)
    ]
    ids = torch.from_numpy(pack.input_ids).view(1, -1)
    positions = torch.from_numpy(pack.position_ids).view(1, -1)
    with torch.no_grad():
        right = model(input_ids=ids, position_ids=positions, **_image_inputs(vp, images)).logits
        wrong = model(input_ids=ids, position_ids=positions, **_image_inputs(vp, images[::-1])).logits
    assert (right - wrong).abs().max().item() > 1e-6
