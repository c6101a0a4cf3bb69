"""Training on packs through a transformers model equals training on each sample alone.

A tiny random Llama (CPU, float64) reads packtool's batches through each attention path transformers
has, with what the loader offers for it: ``attn_implementation="eager"`` with the additive mask
(``mask="additive"``), ``"sdpa"`` with the bool mask (``mask="dense"``), both with the flattened batch
and no mask (``batch.flattened()``: the boundaries from ``position_ids``, as ``DataCollatorWithFlattening``
gives them), and ``"flex_attention"`` with the ``BlockMask`` (``mask="flex"``; forward only, float32:
flex has no backward on CPU). For every piece of every pack, the per-token loss equals the loss of that
piece run alone (positions from 0), and the gradient of one parameter of the summed loss equals that of
the pieces alone: within 1e-9 under sdpa, 1e-6 under eager (Llama's eager softmax is float32 in any
dtype). Data: pretokenized samples, the same with ``--split-across-pack`` (a piece's reference is the
piece alone), pretokenized with a loss mask, and chat data through a template.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packtool import read_packs, run_pack
from packtool.loader import PackedDataset, get_loader
from packtool.options import PackOptions
from tests.conftest import DEMO, write_jsonl

N = 64
B = 4
# sdpa runs in the model's float64; Llama's eager attention takes its softmax in float32 whatever the
# model's dtype, so a row of N scores (the masked ones -inf) and the same row alone round differently there
TOL = {"sdpa": 1e-9, "eager": 1e-6}


def _pack(tmp: Path, rows: list[dict], name: str, n: int = N, **config) -> Path:
    out = tmp / name
    inputs = [str(write_jsonl(tmp / f"{name}.jsonl", rows))]
    run_pack(PackOptions.of(inputs=inputs, output=str(out), packed_sequence_size=n, quiet=True, **config))
    return out


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("training")
    rng = np.random.default_rng(3)
    lengths = [int(n) for n in rng.integers(4, 50, 14)]
    plain = [{"input_ids": rng.integers(1, 100, n).tolist()} for n in lengths]
    masked = [{**r, "loss_mask": rng.integers(0, 2, len(r["input_ids"])).tolist()} for r in plain]
    masked = [r for r in masked if sum(r["loss_mask"][1:])]
    chats = [json.loads(line) for line in (DEMO / "chat.jsonl").read_text().splitlines()[:12]]
    chat_rows = [c for c in chats if len(json.dumps(c)) < 1000][:6]  # 100-250 tokens each
    return {
        "pretokenized": _pack(tmp, plain, "plain"),
        "split": _pack(
            tmp, [*plain, {"input_ids": rng.integers(1, 100, 150).tolist()}], "split", split_across_pack=True
        ),
        "loss_mask": _pack(tmp, masked, "masked"),
        "chat": _pack(
            tmp, chat_rows, "chat", 4 * N, sample_format="chat", tokenizer=str(DEMO / "chat-tokenizer")
        ),
    }


def _model(attn: str, vocab: int, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4 * N, rope_theta=10000.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, attn_implementation=attn, dtype=dtype).eval()


def _token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross entropy (0 where the label is -100); packtool's labels are already shifted."""
    flat = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100, reduction="none")
    return flat.view(labels.shape)


def _pieces(directory: Path) -> dict[int, list[tuple[int, int]]]:
    """Each pack's pieces as ``(start, end)`` token ranges (the padding left out)."""
    out = {}
    for i, pack in enumerate(read_packs(directory, with_sample_index=True)):
        ends = np.cumsum(pack["seq_lens"][: len(pack["sample_index"])])
        out[i] = list(zip([0, *ends[:-1].tolist()], ends.tolist(), strict=True))
    return out


def _reference(model, batch, pieces, param) -> tuple[torch.Tensor, torch.Tensor]:
    """Each piece run alone: per-token losses in the batch's layout (0 elsewhere), and ``param``'s gradient
    of their sum."""
    model.zero_grad()
    losses = torch.zeros(batch.labels.shape, dtype=torch.float64)
    for j, p in enumerate(batch.pack_index.tolist()):
        for a, b in pieces[p]:
            ids = batch.input_ids[j : j + 1, a:b]
            logits = model(
                input_ids=ids, position_ids=torch.arange(b - a).view(1, -1), use_cache=False
            ).logits
            loss = _token_loss(logits, batch.labels[j : j + 1, a:b])
            loss.sum().backward()
            losses[j, a:b] = loss[0].detach()
    return losses, param.grad.clone()


def _vocab(directory: Path) -> int:
    return max(int(p["input_ids"].max()) for p in read_packs(directory)) + 1


def _batches(directory: Path, mask: str) -> list:
    ds = PackedDataset(directory, batch_size=B, shuffle=False, mask=mask, drop_last=False)
    return [batch.to("cpu") for batch in get_loader(ds, num_workers=0)]


# attn_implementation, the loader's mask, how the batch goes into the model
PATHS = [
    ("eager", "additive", "mask"),
    ("sdpa", "dense", "mask"),
    ("sdpa", "varlen", "flattened"),
    ("eager", "varlen", "flattened"),
]


@pytest.mark.parametrize("data", ["pretokenized", "split", "loss_mask", "chat"])
@pytest.mark.parametrize(("attn", "mask", "how"), PATHS, ids=[f"{a}-{m}-{h}" for a, m, h in PATHS])
def test_packed_loss_and_gradient_equal_each_sample_alone(outputs, data, attn, mask, how):
    directory = outputs[data]
    model = _model(attn, _vocab(directory), torch.float64)
    param = model.model.layers[0].self_attn.q_proj.weight
    pieces = _pieces(directory)
    taken = 0
    for batch in _batches(directory, mask):
        want_loss, want_grad = _reference(model, batch, pieces, param)
        model.zero_grad()
        if how == "mask":
            logits = model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                position_ids=batch.position_ids, use_cache=False,
            ).logits  # fmt: skip
            loss = _token_loss(logits, batch.labels)
        else:
            out = model(**batch.flattened())  # labels and shift_labels (never shifted twice), use_cache=False
            labels = batch.labels.reshape(1, -1)
            loss = _token_loss(out.logits, labels).view(batch.labels.shape)
            assert abs(out.loss.item() - loss.sum().item() / int((labels != -100).sum())) < 1e-6
        loss.sum().backward()
        taken += int((batch.labels != -100).sum())
        assert (loss.detach() - want_loss).abs().max().item() < TOL[attn]
        assert (param.grad - want_grad).abs().max().item() < TOL[attn]
    assert taken > 100


def test_flex_attention_forward_equals_each_sample_alone(outputs, monkeypatch):
    """flex_attention with the loader's BlockMask; unfused (torch.compile of flex on CPU takes ~20 s)."""
    import torch.nn.attention.flex_attention as flex
    import transformers.integrations.flex_attention as hf_flex

    monkeypatch.setattr(flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    monkeypatch.setattr(
        hf_flex,
        "compile_friendly_flex_attention",
        lambda q, k, v, training=False, **kw: flex.flex_attention(q, k, v, **kw),
    )
    directory = outputs["split"]
    model = _model("flex_attention", _vocab(directory), torch.float32)
    alone_model = _model("sdpa", _vocab(directory), torch.float32)  # the same weights (same seed)
    pieces = _pieces(directory)
    with torch.no_grad():
        for batch in _batches(directory, "flex"):
            logits = model(
                input_ids=batch.input_ids, attention_mask=batch.block_mask, position_ids=batch.position_ids,
                use_cache=False,
            ).logits  # fmt: skip
            for j, p in enumerate(batch.pack_index.tolist()):
                for a, b in pieces[p]:
                    alone = alone_model(input_ids=batch.input_ids[j : j + 1, a:b], use_cache=False).logits
                    assert (logits[j, a:b] - alone[0]).abs().max().item() < 1e-4


def test_a_bool_mask_masks_nothing_under_eager(outputs):
    """Why eager gets the additive mask: transformers adds the mask to the scores, True/False as 1/0."""
    directory = outputs["pretokenized"]
    model = _model("eager", _vocab(directory), torch.float64)
    batch = _batches(directory, "dense")[0]
    additive = _batches(directory, "additive")[0]
    kw = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "use_cache": False}
    with torch.no_grad():
        wrong = model(**kw, attention_mask=batch.attention_mask).logits
        right = model(**kw, attention_mask=additive.attention_mask).logits
    assert (wrong - right).abs().max().item() > 1e-3


def test_flattened_batch_is_what_data_collator_with_flattening_gives(outputs):
    from transformers import DataCollatorWithFlattening

    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    for batch in _batches(outputs["split"], "varlen"):
        features = []
        for j in range(len(batch)):
            ends = np.cumsum(batch.seq_lens[j][batch.seq_lens[j] > 0].numpy())
            for a, b in zip([0, *ends[:-1]], ends, strict=True):  # every sequence, the padding too
                features.append({"input_ids": batch.input_ids[j, a:b].tolist()})
        want = collator(features, return_tensors="pt")
        got = batch.flattened()
        for key in ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx"):
            assert torch.equal(got[key], want[key]) and got[key].dtype == want[key].dtype, key
        assert (got["max_length_q"], got["max_length_k"]) == (want["max_length_q"], want["max_length_k"])
