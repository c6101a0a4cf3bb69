"""Training on packs of vision-language samples equals training on each sample alone (issue 29).

Tiny random models built from transformers configs, on the CPU in float64: a LLaVA (CLIP vision tower,
Llama language model; ``LlavaForConditionalGeneration``), a Qwen2-VL (``Qwen2VLForConditionalGeneration``)
and a Qwen2.5-VL (window attention in its vision tower; it reads Qwen2-VL's processor output).
Their processors are the tiny ones of ``tests/fixtures/vision_processors.py``; the samples are LLaVA records
with one, two and no image. ``packtool pack --processor DIR`` (``run_pack``, in this process) packs them
into two or more packs of an output directory (Parquet, each image's original bytes in its pack), and the
loader reads every pack in one batch (``packtool.vision.loader.vision_dataset``: ``VisionTaskEncoder``'s
``encode_sample`` / ``batch`` / ``encode_batch``, the stages a DataLoader worker runs): the stored images
decoded and processed in pack order (``pixel_values``, and ``image_grid_thw`` for Qwen2-VL,
concatenated over the batch's packs), Qwen2-VL's M-RoPE ids ``(3, B, N)`` through the model's own
``get_rope_index`` run on each sample alone. The samples alone read their image files.

The batch goes into the model as trainers pass it (``model(**batch)``, ``VisionBatch.model_inputs``):
through ``attn_implementation="sdpa"`` with the dense block-causal mask (``mask="dense"``), and flattened
(``mask="varlen"``: one row of ``B * N`` tokens with the flattening kwargs; the sequence boundaries from the
``position_ids``, which restart at every sample; for Qwen2-VL the text positions go first as a fourth row,
``(4, 1, B * N)``, the layout transformers reads packed-sequence boundaries from). The per-token loss
equals each sample's loss run alone, and the gradient of the summed loss with respect to one vision-tower
and one language-model parameter equals that of the samples alone, within 1e-9. The samples alone get no
position ids (the model computes its own), so the packed M-RoPE ids are checked against the model's rule
too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from packtool.options import PackOptions
from packtool.pipeline.run import run_pack
from packtool.reading import read_packs
from packtool.vision.loader import VisionBatch, vision_dataset
from packtool.vision.packs import assemble_pack, plan_packs
from packtool.vision.processor import load_processor
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
    source = write_llava_input(tmp / "input")
    samples = list(read_json_samples(source))
    return {
        "tmp": tmp,
        "source": source,
        "samples": samples,
        "images": [[Image.open(ref.path).convert("RGB") for ref in s.images] for s in samples],
        "llava": load_processor(build_llava(tmp / "llava")),
        "qwen2vl": load_processor(build_qwen2vl(tmp / "qwen2vl")),
        "outputs": {},
    }


def _output(data, processor: str, n: int) -> Path:
    """The samples packed by ``packtool pack --processor`` into packs of ``n`` tokens (Parquet), once per
    processor and size."""
    key = (processor, n)
    if key not in data["outputs"]:
        out = data["tmp"] / f"out-{processor}-{n}"
        options = PackOptions.of(inputs=[str(data["source"])], output=str(out), num_proc=1, quiet=True,
                                 processor=data[processor].path, packed_sequence_size=n)  # fmt: skip
        run_pack(options)  # in this process: packtool pack --processor DIR --packed-sequence-size N
        data["outputs"][key] = out
    return data["outputs"][key]


def _mm_token_type_ids(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    return (input_ids == image_token_id).to(torch.int32)


@pytest.mark.parametrize("how", ["dense", "flattened"])
@pytest.mark.parametrize("family", ["llava", "qwen2vl", "qwen25vl"])
def test_packed_loss_and_gradients_equal_each_sample_alone(data, family, how):
    vp = data["llava" if family == "llava" else "qwen2vl"]  # Qwen2.5-VL's processor is Qwen2-VL's
    sequences = [encode_sample(vp, s) for s in data["samples"]]
    lengths = [len(s) for s in sequences]
    n = max(max(lengths), (sum(lengths) + 1) // 2) + 5  # the four samples (1, 2, 0, 2 images) in 2+ packs
    assert plan_packs(sequences, n).num_packs >= 2
    vocab = max(int(s.input_ids.max()) for s in sequences) + 1
    model, vision_param, text_param = MODELS[family](vp, vocab)

    # the output directory of `packtool pack --processor`, read by the loader in one batch of every pack:
    # the stored images decoded and processed in pack order, M-RoPE by the model's rule
    out = _output(data, "llava" if family == "llava" else "qwen2vl", n)
    sample_index = [p["sample_index"].tolist() for p in read_packs(out, with_sample_index=True)]  # by pack
    rule = model.model.get_rope_index if family != "llava" else None
    mask = "dense" if how == "dense" else "varlen"
    ds = vision_dataset(out, vp, rule, dtype=torch.float64, batch_size=len(sample_index), mask=mask)
    (batch,) = list(ds)
    assert isinstance(batch, VisionBatch) and batch.images_per_pack.sum().item() == 5
    input_ids = batch.input_ids.to(torch.int64)
    labels = batch.shift_labels()

    # each sample alone, from its image files: the model's own positions (M-RoPE from its get_rope_index)
    model.zero_grad()
    want = torch.zeros(labels.shape, dtype=torch.float64)
    for b, pack_index in enumerate(batch.pack_index.tolist()):
        ends = np.cumsum(batch.seq_lens[b].numpy()).tolist()
        for j, i in enumerate(sample_index[pack_index]):
            a, e = ([0, *ends][j], ends[j])
            ids = input_ids[b : b + 1, a:e]
            extra = _image_inputs(vp, data["images"][i])
            if family != "llava":
                extra["mm_token_type_ids"] = _mm_token_type_ids(ids, vp.image_token_id)
                positions, _ = model.model.get_rope_index(
                    ids, extra["mm_token_type_ids"], image_grid_thw=extra.get("image_grid_thw")
                )
                assert torch.equal(batch.mrope_position_ids[:, b : b + 1, a:e].to(torch.int64), positions)
            logits = model(input_ids=ids, use_cache=False, **extra).logits
            loss = _token_loss(logits, labels[b : b + 1, a:e])
            loss.sum().backward()
            want[b, a:e] = loss[0].detach()
    want_grads = [vision_param.grad.clone(), text_param.grad.clone()]

    # the batch as the loader gives it: model(**batch), dense block-causal mask or flattened to one row
    model.zero_grad()
    logits = model(**batch).logits.view(*labels.shape, -1)
    assert ("attention_mask" in batch) == (how == "dense") and ("cu_seq_lens_q" in batch) == (how != "dense")
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
