"""A mask path is offered only for a model it trains exactly (``packtool.loader.fit``), refused in one line
otherwise; and the masks that depend on the model are never built without it.

The refusals here are decided from tiny transformers configs by the meta-device probe of each model's code
(no forward with weights); tests/interop/test_transformers_training.py trains every architecture the docs
name on every path, float64, and checks that each offered path equals each sample alone and each refused
one is wrong when forced.
"""

from __future__ import annotations

import types

import pytest
import torch

from packtool.loader import PackedDataset, collate_packs, masks_for_model
from packtool.loader.batch import default_batch, packed_batch
from packtool.loader.fit import check_mask_for_model, model_attention, probe_model_code
from packtool.loader.hf_trainer import check_dataset_fits_model
from packtool.masks import AttentionPattern
from packtool.reading import read_packs
from tests.fixtures.loader_outputs import packed  # noqa: F401 - fixture

SHAPE = dict(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=8)  # fmt: skip


def _config(name: str, attn: str | None, **extra):
    import transformers

    config = getattr(transformers, name)(**SHAPE, **extra)
    config._attn_implementation = attn
    return config


def gpt_oss(attn="eager"):
    return _config(
        "GptOssConfig", attn, sliding_window=8, layer_types=["sliding_attention", "full_attention"]
    )


def afmoe(attn="sdpa"):
    return _config("AfmoeConfig", attn, sliding_window=8, layer_types=["sliding_attention", "full_attention"])


def granite_hybrid(attn="sdpa"):
    return _config(
        "GraniteMoeHybridConfig", attn, layer_types=["mamba", "attention"], mamba_n_heads=2, mamba_d_head=16
    )


def llama4(attn="sdpa", **extra):
    return _config("Llama4TextConfig", attn, **{"attention_chunk_size": 32, **extra})


def llama4_tuned(attn="sdpa", floor_scale=64):
    """Llama 4 with a layer without RoPE, whose queries its attn_temperature_tuning scales by their index in
    the row from index floor_scale - 1 on."""
    return llama4(attn, no_rope_layers=[1, 0], floor_scale=floor_scale)


def bamba(attn="sdpa"):
    return _config("BambaConfig", attn, attn_layer_indices=[1], mamba_n_heads=2, mamba_d_head=16)


def qwen2_vl(attn="sdpa"):
    import transformers

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}  # 8 / 2 per head
    config = transformers.Qwen2VLConfig(text_config={**SHAPE, "rope_parameters": rope})
    config.get_text_config()._attn_implementation = attn
    return config


def llama(attn="sdpa"):
    return _config("LlamaConfig", attn)


def one_line(match: str):
    """``pytest.raises(ValueError, match=...)`` whose message is one line."""

    class OneLine:
        def __enter__(self):
            self.raises = pytest.raises(ValueError, match=match)
            self.info = self.raises.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.raises.__exit__(*exc)
            assert "\n" not in str(self.info.value), str(self.info.value)
            return handled

    return OneLine()


NEEDS_MODEL = (
    r"mask='{mask}' is built for the model's attention: pass attention=model\.config \(or attention='causal'"
)
FLATTENED = (
    r"GptOssModel builds its attention masks without the position_ids, so the samples of a flattened row"
)


def _trl(packed, attention):
    from packtool.loader.trl import trl_dataset

    return trl_dataset(packed, attention=attention)


def _batch_dense(packed):
    return packed_batch(default_batch(list(read_packs(packed))[:2]), "dense").build_mask()


def _trainer(packed, config):
    check_dataset_fits_model(PackedDataset(packed, mask="varlen"), types.SimpleNamespace(config=config))


UNPACKED = "; train it on unpacked samples$"
# (item, what is done, the one-line refusal): each was accepted, and trained wrongly, before
CASES = [
    # 15: a mask that depends on the model is never built without knowing it
    *[(15, f"PackedDataset-{m}", lambda p, m=m: PackedDataset(p, mask=m), NEEDS_MODEL.format(mask=m))
      for m in ("dense", "additive", "flex")],
    *[(15, f"collate_packs-{m}", lambda p, m=m: collate_packs(list(read_packs(p))[:2], mask=m),
       NEEDS_MODEL.format(mask=m)) for m in ("dense", "additive", "flex")],
    (15, "PackedBatch-dense", _batch_dense,
     r"PackedBatch: mask='dense' is built for the model's attention and this batch has none"),
    (15, "llama4-flash-varlen", lambda p: PackedDataset(p, attention=llama4("flash_attention_2")),
     r"^mask='varlen' does not fit llama4_text with attn_implementation='flash_attention_2': its "
     r"'chunked_attention' layers would attend across their chunks \(transformers gives every layer the one "
     r"cu_seq_lens of the samples, not those of the chunks\); load it with attn_implementation 'sdpa'"),
    (15, "llama4-rows-dense", lambda p: PackedDataset(p, mask="dense", attention=llama4_tuned()),
     r"^mask='dense' does not fit llama4_text with attn_implementation='sdpa' on rows of 64 tokens: its "
     r"layers without RoPE scale each query by the token's index in the row \(attn_temperature_tuning, "
     r"floor_scale 64\), so a packed sample's tokens at index 63 of the row or later train otherwise than "
     r"alone; give it rows of fewer than 64 tokens"),
    (15, "llama4-rows-varlen",
     lambda p: PackedDataset(p, batch_size=2, attention=llama4_tuned(floor_scale=65)),
     r"^mask='varlen' does not fit llama4_text .* on rows of 128 tokens: "),
    (15, "llama4-rows-collate", lambda p: collate_packs(list(read_packs(p))[:2], attention=llama4_tuned(
        floor_scale=100)), r"^mask='varlen' does not fit llama4_text .* on rows of 128 tokens: "),
    (15, "llama4-rows-trl", lambda p: _trl(p, llama4_tuned(floor_scale=10**6)),
     r"^trl_dataset: the model scales its queries by their index in the row \(attn_temperature_tuning, "
     r"floor_scale 1000000\), and TRL's padding-free rows"),
    (15, "llama4-rows-trainer", lambda p: check_dataset_fits_model(PackedDataset(p, batch_size=1,
     attention="causal"), types.SimpleNamespace(config=llama4_tuned())), r"on rows of 64 tokens: "),
    (15, "bamba-dense", lambda p: PackedDataset(p, mask="dense", attention=bamba()),
     r"^mask='dense' does not fit bamba with .*'linear_attention' \(layers 0\)" + UNPACKED),
    (15, "bamba-varlen", lambda p: PackedDataset(p, mask="varlen", attention=bamba()),
     r"^mask='varlen' does not fit bamba .*" + UNPACKED),
    # 14: the flattened row of a model whose masks ignore position_ids (and the paths that suggested it)
    (14, "flattened-without-the-model", lambda p: next(iter(PackedDataset(p))).flattened(),
     r"^PackedBatch: a flattened row keeps its samples apart only where the model's code finds them"),
    (14, "gpt_oss-varlen", lambda p: PackedDataset(p, mask="varlen", attention=gpt_oss()),
     r"^mask='varlen' does not fit gpt_oss with attn_implementation='eager': " + FLATTENED
     + r" .*; use mask='additive'$"),
    (14, "gpt_oss-dense-suggests", lambda p: PackedDataset(p, mask="dense", attention=gpt_oss()),
     r"^mask='dense' does not fit gpt_oss with attn_implementation='eager' \(its attention adds the mask "
     r"to the scores\): use mask='additive'$"),
    (14, "gpt_oss-flex_attention-varlen", lambda p: PackedDataset(p, attention=gpt_oss("flex_attention")),
     r"; use mask='flex'$"),
    (14, "gpt_oss-collate_packs", lambda p: collate_packs(list(read_packs(p))[:2], attention=gpt_oss()),
     FLATTENED),
    (14, "gpt_oss-trainer", lambda p: _trainer(p, gpt_oss()), FLATTENED),
    (14, "gpt_oss-trl", lambda p: _trl(p, gpt_oss()),
     r"^trl_dataset: TRL's padding-free rows are the flattened path, and mask='varlen' does not fit "
     r"gpt_oss .* use mask='additive' through packtool\.loader"),
    (14, "afmoe-varlen", lambda p: PackedDataset(p, attention=afmoe()),
     r"^mask='varlen' does not fit afmoe with attn_implementation='sdpa': AfmoeModel builds its "
     r"attention masks without the position_ids.*; use mask='dense'$"),
    (14, "granitemoehybrid-varlen", lambda p: PackedDataset(p, attention=granite_hybrid()),
     r"^mask='varlen' does not fit granitemoehybrid .*" + UNPACKED),
    (14, "qwen2_vl-text-varlen", lambda p: PackedDataset(p, attention=qwen2_vl()),
     r"Qwen2VLTextModel builds its attention masks without the position_ids.*; use mask='dense'$"),
    (14, "sdpa-additive", lambda p: PackedDataset(p, mask="additive", attention=llama()),
     r"^mask='additive' does not fit llama with attn_implementation='sdpa' \(it takes the bool mask\): "
     r"use mask='dense' \(or 'varlen'\)$"),
]  # fmt: skip


@pytest.mark.parametrize(("item", "name", "do", "refusal"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_path_that_would_train_wrongly_is_refused_in_one_line(packed, item, name, do, refusal):
    with one_line(refusal):
        do(packed)


def test_the_paths_that_fit_are_offered(packed):
    import transformers

    assert masks_for_model(gpt_oss()) == ("additive",)
    assert masks_for_model(gpt_oss("flash_attention_2")) == ("varlen",)  # the kernel reads cu_seq_lens
    assert masks_for_model(llama()) == ("dense", "varlen")
    assert masks_for_model(qwen2_vl(), mrope=True) == (
        "dense",
        "varlen",
    )  # text positions in front: (4, 1, L)
    assert masks_for_model(qwen2_vl()) == ("dense",)
    assert masks_for_model(bamba()) == ()
    # Mllama: its text model (left out of transformers' model mapping), whose first layer here is a
    # cross-attention one, skipped without images: the probe reads the first layer that runs
    mllama = transformers.MllamaConfig(
        text_config={**SHAPE, "cross_attention_layers": [0], "pad_token_id": 0}
    )
    mllama.get_text_config()._attn_implementation = "sdpa"
    assert masks_for_model(mllama) == ("dense", "varlen")
    # Llama 4: one mask per layer type, its chunks counted in each sample; flattened, transformers counts
    # them from the position_ids (eager, sdpa, flex_attention), but flash attention is given no chunks
    assert masks_for_model(llama4()) == ("dense", "varlen")
    assert masks_for_model(llama4("eager")) == ("additive", "varlen")
    assert masks_for_model(llama4("flex_attention")) == ("flex", "varlen")
    assert masks_for_model(llama4("flash_attention_2")) == ()
    assert masks_for_model(llama4("flash_attention_2", attention_chunk_size=None)) == ("varlen",)  # full
    tuned = PackedDataset(packed, mask="dense", attention=llama4_tuned(floor_scale=65))  # rows of 64: exact
    assert tuned.attention.chunks() == {"chunked_attention": 32, "full_attention": None}
    with pytest.raises(ValueError, match="chunk 32"):  # a dataset whose masks have no chunks
        check_dataset_fits_model(PackedDataset(packed, mask="dense", attention="causal"),
                                 types.SimpleNamespace(config=llama4()))  # fmt: skip
    assert PackedDataset(packed, mask="additive", attention=gpt_oss()).attention.windows() == {
        "sliding_attention": 8, "full_attention": None,
    }  # fmt: skip
    # declarations, taken on the user's word: full causal attention, or a pattern
    assert PackedDataset(packed, mask="dense", attention="causal").attention == AttentionPattern()
    assert model_attention("flex", AttentionPattern(4)) == AttentionPattern(4)
    assert model_attention("varlen", None) is None  # cu_seqlens only: nothing of the model's in them


def test_what_packtool_cannot_check_is_refused_naming_what_to_do():
    import transformers

    class RemoteConfig(transformers.LlamaConfig):
        model_type = "my_remote_model"

    remote = RemoteConfig(**SHAPE)
    remote._attn_implementation = "sdpa"
    with one_line(r"my_remote_model.*transformers has no model class .*; declare its attention yourself"):
        check_mask_for_model("dense", remote)
    with one_line(r"packtool does not know what 'my_kernel' does with a mask\): load the model with"):
        check_mask_for_model("varlen", llama("my_kernel"))
    with one_line(r"^attention= takes the model's transformers config .*got a Linear$"):
        model_attention("dense", torch.nn.Linear(2, 2))
    with one_line(r"the one declaration by name is 'causal', got 'full'"):
        model_attention("dense", "full")


def test_the_probe_leaves_transformers_as_it_found_it():
    """The probe swaps transformers' mask preprocessing while it runs (for its own model only) and puts it
    back, whatever the model's code does; each config is probed once."""
    from transformers import masking_utils

    before = masking_utils._preprocess_mask_arguments
    config = gpt_oss()
    code = probe_model_code(config)
    assert code.flattened is not None and code.flash is None and code.masked is None
    assert probe_model_code(gpt_oss()) is code  # cached by the config's content
    assert masking_utils._preprocess_mask_arguments is before
    assert probe_model_code(llama()).flattened is None
    assert masking_utils._preprocess_mask_arguments is before
