"""Training on packs of vision-language samples equals training on each sample alone.

Tiny random models built from transformers configs, on the CPU in float64: a LLaVA (CLIP vision tower,
Llama language model; ``LlavaForConditionalGeneration``), a LLaVA-NeXT (anyres: an image's base and grid
tiles, their features unpadded by its ``image_sizes``), a Qwen2-VL, a Qwen2.5-VL (window attention in its
vision tower; it reads Qwen2-VL's processor output), an Idefics3 (each image cut into tiles with
``<row_i_col_j>`` tags, the global image last; ``pixel_attention_mask``), a Gemma 3 (SigLIP; the tokens
of an image attend to each other both ways, from its ``token_type_ids``) and a Llama 3.2 Vision
(``mllama``: its images reach the text through cross-attention layers, each token to the images its
processor's ``cross_attention_mask`` gives it; the loader hooks the model to keep each packed sample's text
on its own images, ``packtool.vision.cross_attention``). Their processors are the tiny
ones of ``tests/fixtures/vision_processors.py`` and ``vision_families.py``; the samples are LLaVA records
with one, two and no image whose images hold transparency (an RGBA logo, a palette PNG and a GIF with a
transparent index) beside RGB ones. ``packtool pack --processor DIR`` (``run_pack``, in this process)
packs them into two or more packs of an output directory (Parquet, each image's original bytes in its
pack), and the loader reads every pack in one batch (``packtool.vision.loader.vision_dataset``:
``VisionTaskEncoder``'s ``encode_sample`` / ``batch`` / ``encode_batch``, the stages a DataLoader worker
runs): the stored images decoded as ``Image.open`` gives them and processed sample by sample in pack
order, Qwen2-VL's M-RoPE ids ``(3, B, N)`` through the model's own ``get_rope_index`` run on each sample
alone.

Each sample alone is what a user of transformers runs: its image files opened with ``Image.open`` and
its rendered conversation through the processor (``processor(text=[text], images=[images])``: ids, pixel
values and the family's other inputs), into the model. The batch goes into the model as trainers pass it
(``model(**batch)``, ``VisionBatch.model_inputs``): through ``attn_implementation="sdpa"`` with the dense
block-causal mask (``mask="dense"``; Gemma 3's with each image's block both ways), and flattened
(``mask="varlen"``: one row of ``B * N`` tokens with the flattening kwargs; the sequence boundaries from the
``position_ids``, which restart at every sample; for Qwen2-VL the text positions go first as a fourth row,
``(4, 1, B * N)``, the layout transformers reads packed-sequence boundaries from). The ids of each sample
in the pack equal the processor's; the per-token loss equals each sample's loss run alone, and the
gradient of the summed loss with respect to one vision-tower and one language-model parameter equals that
of the samples alone, within 1e-9 (the loss) and 1e-8 (the gradients, summed in another order).
"""

from __future__ import annotations

import json
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
from packtool.vision.model_inputs import decode_images
from packtool.vision.processor import load_processor
from packtool.vision.sequences import encode_samples
from tests.fixtures.vision_families import build_gemma3, build_idefics3, build_llava_next, build_mllama
from tests.fixtures.vision_inputs import read_samples, write_alpha_input, write_jsonl
from tests.fixtures.vision_processors import LLAVA_CROP, build_llava, build_qwen2vl
from tests.interop.test_transformers_training import unfused_flex  # noqa: F401 - fixture

TOL = 1e-9
GRAD_TOL = 1e-8  # a gradient sums every token's in another order packed than alone (Gemma 3: 1.2e-9 off)


def _built(model_class, config, vision: str, text: str, attn: str = "sdpa"):
    """``model_class`` from ``config`` in float64 on ``attn`` (seed 0, eval mode), with the vision-tower and
    language-model parameters (their dotted names) whose gradients the test compares."""
    torch.manual_seed(0)
    model = model_class._from_config(config, attn_implementation=attn, dtype=torch.float64)
    return model.eval(), model.get_parameter(vision), model.get_parameter(text)


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
    return _built(
        LlavaForConditionalGeneration,
        config,
        "model.vision_tower.encoder.layers.0.self_attn.q_proj.weight",
        "model.language_model.layers.0.self_attn.q_proj.weight",
    )


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
    return _built(
        Qwen2VLForConditionalGeneration,
        config,
        "model.visual.blocks.0.attn.qkv.weight",
        "model.language_model.layers.0.self_attn.q_proj.weight",
    )


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
    return _built(
        Qwen2_5_VLForConditionalGeneration,
        config,
        "model.visual.blocks.0.attn.qkv.weight",
        "model.language_model.layers.0.self_attn.q_proj.weight",
    )


def _text(vocab: int) -> dict:
    return {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024}  # fmt: skip


def _llava_next(vp, vocab: int):
    """LLaVA-NeXT over the 28 px CLIP base of its processor (anyres pinpoints up to 84 px)."""
    from transformers import CLIPVisionConfig, LlavaNextConfig, LlavaNextForConditionalGeneration

    config = LlavaNextConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            image_size=28, patch_size=14, projection_dim=32,
        ),
        text_config={"model_type": "llama", **_text(vocab)},
        image_token_index=vp.image_token_id, vision_feature_select_strategy="default",
        vision_feature_layer=-2, image_grid_pinpoints=vp.image_processor.image_grid_pinpoints,
    )  # fmt: skip
    return _built(
        LlavaNextForConditionalGeneration,
        config,
        "model.vision_tower.encoder.layers.0.self_attn.q_proj.weight",
        "model.language_model.layers.0.self_attn.q_proj.weight",
    )


def _idefics3(vp, vocab: int):
    """Idefics3 over 28 px tiles, patch 14, no pixel shuffle (scale factor 1): 4 tokens a tile."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    config = Idefics3Config(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": 28, "patch_size": 14},
        text_config={"model_type": "llama", **_text(vocab)},
        image_token_id=vp.image_token_id, scale_factor=1,
    )  # fmt: skip
    return _built(
        Idefics3ForConditionalGeneration,
        config,
        "model.vision_model.encoder.layers.0.self_attn.q_proj.weight",
        "model.text_model.layers.0.self_attn.q_proj.weight",
    )


def _gemma3(vp, vocab: int):
    """Gemma 3 over a 28 px SigLIP, 4 soft tokens an image; a sliding-window layer (window 12, shorter than
    the samples) and a full one, so that each image's block must hold inside the window."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    tok = vp.tokenizer
    config = Gemma3Config(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": 28, "patch_size": 14},
        text_config={**_text(vocab), "head_dim": 8, "sliding_window": 12,
                     "layer_types": ["sliding_attention", "full_attention"]},
        mm_tokens_per_image=4, boi_token_index=tok.token_to_id("<start_of_image>"),
        eoi_token_index=tok.token_to_id("<end_of_image>"),
        image_token_index=tok.token_to_id("<image_soft_token>"),
    )  # fmt: skip
    model, vision, text = _built(
        Gemma3ForConditionalGeneration,
        config,
        "model.vision_tower.encoder.layers.0.self_attn.q_proj.weight",
        "model.language_model.layers.0.self_attn.q_proj.weight",
    )
    with torch.no_grad():  # initialized to zeros: no image would reach the language model
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(std=0.02)
    return model, vision, text


def _mllama(vp, vocab: int, attn: str = "sdpa"):
    """Llama 3.2 Vision over 28 px tiles (up to 2 an image, patch 14: 5 vision tokens a tile), a
    cross-attention layer between two self-attention ones; its gates (zero at initialization, which would
    hide what a text token attends) set to 0.7, so that every cross-attention output reaches the loss."""
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    config = MllamaConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_global_layers": 1, "attention_heads": 4, "image_size": 28, "patch_size": 14,
                       "max_num_tiles": 2, "supported_aspect_ratios": [[1, 1], [1, 2], [2, 1]],
                       "intermediate_layers_indices": [0], "vision_output_dim": 64},
        text_config={**_text(vocab), "num_hidden_layers": 3, "cross_attention_layers": [1],
                     "pad_token_id": 0},
        image_token_index=vp.image_token_id,
    )  # fmt: skip
    model, vision, text = _built(
        MllamaForConditionalGeneration,
        config,
        "model.vision_model.transformer.layers.0.self_attn.q_proj.weight",
        "model.language_model.layers.0.self_attn.q_proj.weight",
        attn,
    )
    with torch.no_grad():
        for name, gate in model.named_parameters():
            if name.endswith("gate") or "gate_" in name.rsplit(".", 1)[-1]:
                gate.fill_(0.7)
    return model, vision, text


MODELS = {"llava": _llava, "qwen2vl": _qwen2vl, "qwen25vl": _qwen25vl, "llava_next": _llava_next,
          "idefics3": _idefics3, "gemma3": _gemma3, "mllama": _mllama}  # fmt: skip
# the processor each model reads (Qwen2.5-VL's is Qwen2-VL's)
PROCESSOR = {"llava": "llava", "qwen2vl": "qwen2vl", "qwen25vl": "qwen2vl", "llava_next": "llava_next",
             "idefics3": "idefics3", "gemma3": "gemma3", "mllama": "mllama"}  # fmt: skip
BUILD = {"llava": build_llava, "qwen2vl": build_qwen2vl, "llava_next": build_llava_next,
         "idefics3": build_idefics3, "gemma3": build_gemma3, "mllama": build_mllama}  # fmt: skip


def _token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross entropy (0 where the label is -100); packtool's labels are already shifted."""
    flat = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100, reduction="none")
    return flat.view(labels.shape)


def _alone(vp, sample) -> dict:
    """What a user of transformers gives the model for ``sample`` alone: its image files as ``Image.open``
    gives them and its rendered conversation through the processor (without the tokenizer's special
    tokens where the text starts with the BOS, as ``apply_chat_template`` does)."""
    text, _ = vp.chat.trained_spans(sample.messages)
    images = [Image.open(ref.path) for ref in sample.images]
    bos = vp.processor.tokenizer.bos_token
    out = vp.processor(text=[text], images=[images] if images else None, return_tensors="pt",
                       add_special_tokens=not (bos and text.startswith(bos)))  # fmt: skip
    out = {k: v for k, v in out.items() if k not in ("attention_mask", "labels")}
    if "pixel_values" in out:
        out["pixel_values"] = out["pixel_values"].to(torch.float64)
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vision_training")
    source = write_alpha_input(tmp / "input")
    return {"tmp": tmp, "source": source, "samples": read_samples([source]), "processors": {},
            "outputs": {}}  # fmt: skip


def _processor(data, name: str):
    if name not in data["processors"]:
        (data["tmp"] / name).mkdir()
        data["processors"][name] = load_processor(BUILD[name](data["tmp"] / name))
    return data["processors"][name]


def _output(data, processor: str) -> Path:
    """The samples packed by ``packtool pack --processor`` (Parquet) into packs of N tokens, N such that
    the four samples take two or more packs; once per processor."""
    if processor not in data["outputs"]:
        vp = _processor(data, processor)
        _, sequences = encode_samples(vp, data["samples"])
        lengths = [len(s) for s in sequences]
        n = max(max(lengths), (sum(lengths) + 1) // 2) + 5
        out = data["tmp"] / f"out-{processor}"
        options = PackOptions.of(inputs=[str(data["source"])], output=str(out), num_proc=1, quiet=True,
                                 processor=vp.path, packed_sequence_size=n)  # fmt: skip
        run_pack(options)  # in this process: packtool pack --processor DIR --packed-sequence-size N
        assert json.loads((out / "manifest.json").read_text())["stats"]["num_packs"] >= 2
        data["outputs"][processor] = out
    return data["outputs"][processor]


CASES = [
    (family, how)
    for family in MODELS
    for how in ("dense", "flattened")
    if (family, how) != ("gemma3", "flattened")
]


@pytest.mark.parametrize("family, how", CASES, ids=[f"{f}-{h}" for f, h in CASES])
def test_packed_loss_and_gradients_equal_each_sample_alone(data, family, how):
    vp = _processor(data, PROCESSOR[family])
    out = _output(data, PROCESSOR[family])
    _check_training(vp, out, family, how, lambda i: _alone(vp, data["samples"][i]), images=5)


def _check_training(vp, out: Path, family: str, how: str, alone, images: int) -> None:
    """The packs of ``out`` read by the loader in one batch and trained on (dense or flattened) give the
    per-token loss and the gradients of ``alone(i)`` (the processor's inputs for input sample ``i`` alone)
    run sample by sample; every pack's ``images`` are read."""
    sample_index = [p["sample_index"].tolist() for p in read_packs(out, with_sample_index=True)]  # by pack
    vocab = len(vp.processor.tokenizer)
    model, vision_param, text_param = MODELS[family](vp, vocab)

    # the output directory of `packtool pack --processor`, read by the loader in one batch of every pack:
    # the stored images decoded and processed in pack order, M-RoPE by the model's rule
    rule = model.model.get_rope_index if family.startswith("qwen") else None
    mask = "dense" if how == "dense" else "varlen"
    ds = vision_dataset(
        out,
        vp,
        rule,
        dtype=torch.float64,
        batch_size=len(sample_index),
        mask=mask,
        attention=model.config.get_text_config(),
        cross_attention=model if vp.cross_attention else None,  # Mllama: hooked to keep samples apart
    )  # Gemma 3's sliding window: one mask a layer type
    (batch,) = list(ds)
    assert isinstance(batch, VisionBatch) and batch.images_per_pack.sum().item() == images
    input_ids = batch.input_ids.to(torch.int64)
    labels = batch.shift_labels()

    # each sample alone, as a user of transformers runs it: the model's own positions
    model.zero_grad()
    want = torch.zeros(labels.shape, dtype=torch.float64)
    for b, pack_index in enumerate(batch.pack_index.tolist()):
        ends = np.cumsum(batch.seq_lens[b].numpy()).tolist()
        for j, i in enumerate(sample_index[pack_index]):
            a, e = ([0, *ends][j], ends[j])
            inputs = alone(i)
            assert torch.equal(inputs["input_ids"], input_ids[b : b + 1, a:e])  # the processor's own ids
            if rule is not None:
                positions, _ = rule(inputs["input_ids"], inputs["mm_token_type_ids"],
                                    image_grid_thw=inputs.get("image_grid_thw"))  # fmt: skip
                assert torch.equal(batch.mrope_position_ids[:, b : b + 1, a:e].to(torch.int64), positions)
            logits = model(**inputs, use_cache=False).logits
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
        assert (got - expected).abs().max().item() < GRAD_TOL


# interleaved documents over the same images: text around images, two images side by side, one first, one
# without any image
DOCUMENTS = [
    {"texts": ["A logo, ", None, " drawn in blue.\n"], "images": [None, "images/logo.png", None]},
    {"texts": [None, None, "An icon and a person. ", None, "A banner."],
     "images": ["images/icon.png", "images/photo.jpg", None, "images/wide.webp", None]},
    {"texts": ["No picture in this one, only words about pictures."], "images": [None]},
    {"texts": ["Two icons:\n\n", None, "the same, in another format.", None],
     "images": [None, "images/icon.gif", None, "images/icon.png"]},
]  # fmt: skip
DOCUMENT_CASES = [
    (family, how) for family in ("llava", "qwen2vl", "mllama") for how in ("dense", "flattened")
]
# what the processor takes at an image in a text, written out as a user does
IMAGE_MARKUP = {
    "llava": "<image>",
    "qwen2vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "mllama": "<|image|>",
}


@pytest.mark.parametrize("family, how", DOCUMENT_CASES, ids=[f"{f}-{h}" for f, h in DOCUMENT_CASES])
def test_packed_documents_train_as_each_document_alone(data, family, how):
    """Interleaved documents (``--sample-format interleaved``, ``--add-eos``) packed into two or more packs:
    the loss and the gradients of each document alone, as a user of transformers runs it (its texts joined
    with the processor's image placeholder, the EOS after, through the processor)."""
    source = write_jsonl(data["source"].parent / "documents.jsonl", DOCUMENTS)
    key = f"documents-{family}"
    if key not in data["processors"]:
        data["processors"][key] = load_processor(_processor(data, family).path, conversations=False)
    vp = data["processors"][key]
    eos = vp.tokenizer.special_token("eos")

    def alone(i: int) -> dict:
        record = DOCUMENTS[i]
        text = "".join(IMAGE_MARKUP[family] if t is None else t for t in record["texts"]) + eos
        images = [Image.open(source.parent / p) for p in record["images"] if p is not None]
        out = vp.processor(text=[text], images=[images] if images else None, return_tensors="pt")
        out = {k: v for k, v in out.items() if k not in ("attention_mask", "labels")}
        if "pixel_values" in out:
            out["pixel_values"] = out["pixel_values"].to(torch.float64)
        return out

    if key not in data["outputs"]:
        lengths = [alone(i)["input_ids"].shape[1] for i in range(len(DOCUMENTS))]
        n = max(max(lengths), (sum(lengths) + 1) // 2) + 5
        out = data["tmp"] / f"out-{key}"
        options = PackOptions.of(inputs=[str(source)], output=str(out), num_proc=1, quiet=True, add_eos=True,
                                 processor=vp.path, sample_format="interleaved",
                                 packed_sequence_size=n)  # fmt: skip
        run_pack(options)
        assert json.loads((out / "manifest.json").read_text())["stats"]["num_packs"] >= 2
        data["outputs"][key] = out
    images = sum(p is not None for r in DOCUMENTS for p in r["images"])
    _check_training(vp, data["outputs"][key], family, how, alone, images=images)


def test_gemma3_packs_flattened_are_refused(data):
    """Flattened, transformers' Gemma 3 sliding-window layers attend across the packed samples (found with
    this test's model: every token of the second pack off): the loader refuses it in one line."""
    vp = _processor(data, "gemma3")
    for mask in ("varlen", "flex"):
        with pytest.raises(ValueError, match=f"need mask dense or additive.*with {mask}"):
            vision_dataset(_output(data, "gemma3"), vp, batch_size=1, mask=mask)


def test_a_wrong_image_order_or_dropped_alpha_would_be_caught(data):
    """The check has teeth: the first pack's images in reverse order, or with their transparency dropped
    (``convert("RGB")``, not composited onto white), change the loss."""
    vp = _processor(data, "llava")
    pack = next(p for p in read_packs(_output(data, "llava")) if len(p["images"]) >= 2)
    model, _, _ = _llava(vp, len(vp.processor.tokenizer))
    images = decode_images([image["bytes"] for image in pack["images"]])
    assert any(im.mode in ("RGBA", "P") for im in images)
    ids = torch.from_numpy(pack["input_ids"].astype(np.int64)).view(1, -1)
    positions = torch.from_numpy(pack["position_ids"].astype(np.int64)).view(1, -1)

    def logits(of: list) -> torch.Tensor:
        pixels = vp.image_processor(images=of, return_tensors="pt")["pixel_values"].to(torch.float64)
        with torch.no_grad():
            return model(input_ids=ids, position_ids=positions, pixel_values=pixels).logits

    right = logits(images)
    assert (right - logits(images[::-1])).abs().max().item() > 1e-6
    assert (right - logits([im.convert("RGB") for im in images])).abs().max().item() > 1e-6


# --- Llama 3.2 Vision: cross-attention ------------------------------------------------------------------
def _mllama_batch(data, model):
    vp = _processor(data, "mllama")
    out = _output(data, "mllama")
    mask = {"sdpa": "dense", "eager": "additive", "flex_attention": "flex"}[model.config._attn_implementation]
    ds = vision_dataset(out, vp, dtype=torch.float64, batch_size=8, drop_last=False, mask=mask,
                        attention=model.config, cross_attention=model)  # fmt: skip
    (batch,) = list(ds)
    return batch, {k: v for k, v in batch.model_inputs().items() if k not in ("labels", "shift_labels")}


def test_mllama_without_the_hooks_attends_other_samples_images(data):
    """Why the loader hooks Mllama: through transformers' own handling of the pack's cross_attention_mask
    (as its processor gives it: 1 where the rule gives a token an image), the text of a sample before its
    first image, and all the text of a sample without images, attend every image of the pack (transformers
    unmasks a row with nothing to attend and zeroes only its MLP output). And a pack's batch given to a
    model without the hooks fails: its mask has a slot more than the batch has images."""
    vp = _processor(data, "mllama")
    model, _, _ = _mllama(vp, len(vp.processor.tokenizer))
    batch, inputs = _mllama_batch(data, model)
    slots = batch.cross_attention_mask
    assert (slots == 2).any() and (~(slots > 0).any(dim=(2, 3))).any()  # both kinds of token are there
    plain = {**inputs, "cross_attention_mask": (slots[:, :, :-1] == 1).to(torch.int64)}
    with torch.no_grad():
        right = model(**inputs).logits  # equal to each sample alone: the test above
        wrong = model(**plain).logits
        assert (right - wrong).abs().max().item() > 1e-3
        unhooked, _, _ = _mllama(vp, len(vp.processor.tokenizer))
        with pytest.raises(RuntimeError):
            unhooked(**inputs)


@pytest.mark.parametrize("attn", ["eager", "flex_attention"])
def test_mllama_eager_and_flex_forward_equal_each_sample_alone(data, attn, unfused_flex):
    """The additive mask under eager, the BlockMask under flex_attention (forward only: no flex backward on
    the CPU): each sample's logits in the packs equal its logits alone (eager's softmax is float32)."""
    vp = _processor(data, "mllama")
    model, _, _ = _mllama(vp, len(vp.processor.tokenizer), attn)
    batch, inputs = _mllama_batch(data, model)
    sample_index = [
        p["sample_index"].tolist() for p in read_packs(_output(data, "mllama"), with_sample_index=True)
    ]
    worst, compared = 0.0, 0
    with torch.no_grad():
        logits = model(**inputs).logits
        for b, pack_index in enumerate(batch.pack_index.tolist()):
            ends = np.cumsum(batch.seq_lens[b].numpy()).tolist()
            for j, i in enumerate(sample_index[pack_index]):
                a, e = ([0, *ends][j], ends[j])
                alone = model(**_alone(vp, data["samples"][i]), use_cache=False).logits
                worst = max(worst, (logits[b, a:e] - alone[0]).abs().max().item())
                compared += e - a
    assert compared > 100 and worst < 1e-6
