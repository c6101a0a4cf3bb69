"""``PackedBatch`` masks for a model's attention pattern: one mask per layer type, built where the batch is,
from the loader (``PackedDataset(attention=...)``), a task encoder's batches and ``collate_packs``."""

from __future__ import annotations

import pytest
import torch

from packtool.loader import PackedBatch, PackedDataset, collate_packs, get_loader
from packtool.loader.batch import default_batch, packed_batch
from packtool.loader.fit import MASKS_FOR_ATTENTION, check_mask_for_model
from packtool.masks import AttentionPattern, additive_mask, block_causal_mask, flex_block_mask
from packtool.reading import read_packs
from tests.fixtures.loader_outputs import packed  # noqa: F401 - fixture

N = 64
GEMMA = AttentionPattern(5, ("sliding_attention", "full_attention", "sliding_attention"))


def _batch(packed, mask: str, attention=None) -> PackedBatch:
    ds = PackedDataset(packed, batch_size=3, shuffle=False, mask=mask, attention=attention)
    return next(iter(get_loader(ds, num_workers=0)))


@pytest.mark.parametrize("mask", ["dense", "additive", "flex"])
def test_one_mask_per_layer_type_built_on_the_batchs_device(packed, mask):
    host = _batch(packed, mask, GEMMA)
    assert host.attention is GEMMA and host.attention_mask is None and host.block_mask is None
    batch = host.to("cpu")
    built = batch.block_mask if mask == "flex" else batch.attention_mask
    assert list(built) == ["sliding_attention", "full_attention"]
    seq_lens = batch.seq_lens
    for kind, window in (("sliding_attention", 5), ("full_attention", None)):
        if mask == "flex":
            want = flex_block_mask(seq_lens, N, window=window).to_dense()
            assert torch.equal(built[kind].to_dense(), want)
        else:
            want = block_causal_mask(seq_lens, N, window=window)
            assert torch.equal(
                built[kind], want if mask == "dense" else additive_mask(seq_lens, N, window=window)
            )
    assert batch["attention_mask"] is built  # model(**batch): transformers gives each layer its type's mask


def test_one_layer_type_gives_one_mask_and_a_window_as_long_as_the_sequences_cuts_nothing(packed):
    batch = _batch(packed, "dense", AttentionPattern(7)).to("cpu")  # Mistral-like: every layer slides
    assert torch.equal(batch.attention_mask, block_causal_mask(batch.seq_lens, N, window=7))
    longest = int(batch.seq_lens.max())
    wide = _batch(packed, "dense", AttentionPattern(longest, ("sliding_attention", "full_attention"))).to(
        "cpu"
    )
    assert wide.attention_mask["sliding_attention"] is wide.attention_mask["full_attention"]  # built once
    assert torch.equal(wide.attention_mask["full_attention"], block_causal_mask(wide.seq_lens, N))


def test_to_moves_masks_built_on_the_host_keeping_what_layer_types_share(packed):
    raw = default_batch([dict(p, pack_index=i) for i, p in enumerate(list(read_packs(packed))[:2])])
    pattern = AttentionPattern(N, ("sliding_attention", "full_attention"))
    batch = packed_batch(raw, "additive", "shifted", pattern).build_mask()
    moved = batch.to("meta")  # an accelerator's stand-in
    assert {m.device.type for m in moved.attention_mask.values()} == {"meta"}
    assert moved.attention_mask["sliding_attention"] is moved.attention_mask["full_attention"]


def test_task_encoder_batches_get_the_datasets_attention(packed):
    class Stages:
        def batch(self, packs):
            return default_batch(packs)

    ds = PackedDataset(packed, batch_size=2, mask="dense", attention=GEMMA, task_encoder=Stages())
    assert next(iter(ds)).attention is GEMMA


def test_collate_packs_builds_the_masks_of_the_models_attention(packed):
    packs = list(read_packs(packed))[:3]
    batch = collate_packs(packs, mask="dense", attention={"sliding_window": 4, "layer_types": None})
    assert torch.equal(batch.attention_mask, block_causal_mask(batch.seq_lens, N, window=4))


def test_masks_that_an_attention_implementation_ignores_are_refused():
    """A Llama, whose code serves every path: each implementation gets the masks it applies."""
    from transformers import LlamaConfig

    def config(implementation):
        llama = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
        llama._attn_implementation = implementation
        return llama

    for implementation, fits in MASKS_FOR_ATTENTION.items():
        for mask in ("varlen", "dense", "additive", "flex"):
            if mask in fits:
                check_mask_for_model(mask, config(implementation))
            else:
                with pytest.raises(
                    ValueError, match=f"with attn_implementation={implementation!r}.*: use mask"
                ):
                    check_mask_for_model(mask, config(implementation))
    check_mask_for_model("dense", config(None))  # a config bound to no model yet: its code decides
    with pytest.raises(ValueError, match="packtool does not know what 'some_kernel' does with a mask"):
        check_mask_for_model("dense", config("some_kernel"))  # an implementation packtool does not know
