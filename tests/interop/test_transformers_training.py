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
piece alone), pretokenized with a loss mask, and chat data through a template. Then sliding windows
(Mistral, Gemma 2, Gemma 3), Llama 4's chunked attention, and every architecture the docs name on every
path, each offered path exact and each refused one refused in one line (and wrong when forced past the
check).
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


@pytest.fixture
def unfused_flex(monkeypatch):
    """flex_attention unfused: torch.compile of flex on CPU takes ~20 s; flex has no backward there."""
    import torch.nn.attention.flex_attention as flex
    import transformers.integrations.flex_attention as hf_flex

    monkeypatch.setattr(flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    monkeypatch.setattr(
        hf_flex,
        "compile_friendly_flex_attention",
        lambda q, k, v, training=False, **kw: flex.flex_attention(q, k, v, **kw),
    )


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


def _batches(directory: Path, mask: str, attention) -> list:
    ds = PackedDataset(
        directory, batch_size=B, shuffle=False, mask=mask, drop_last=False, attention=attention
    )
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
    taken = _train_and_compare(model, directory, mask, how, TOL[attn], attention=model.config)
    assert taken > 100


def _train_and_compare(model, directory: Path, mask: str, how: str, tol: float, attention) -> int:
    """Each batch of ``directory`` through ``model`` (``how``: its ``mask`` as ``attention_mask``, or
    ``batch.flattened()``): every token's loss and the gradient of the first layer's ``q_proj`` equal
    those of each piece run alone, within ``tol``. Returns the number of targets compared."""
    param = next(model.model.layers[0].self_attn.parameters())  # q_proj's weight (Phi-3: the fused qkv)
    pieces = _pieces(directory)
    taken = 0
    for batch in _batches(directory, mask, attention):
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
        assert (loss.detach() - want_loss).abs().max().item() < tol
        assert (param.grad - want_grad).abs().max().item() < tol
    return taken


def test_flex_attention_forward_equals_each_sample_alone(outputs, unfused_flex):
    """flex_attention with the loader's BlockMask (unfused)."""
    directory = outputs["split"]
    model = _model("flex_attention", _vocab(directory), torch.float32)
    alone_model = _model("sdpa", _vocab(directory), torch.float32)  # the same weights (same seed)
    pieces = _pieces(directory)
    with torch.no_grad():
        for batch in _batches(directory, "flex", model.config):
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
    with pytest.raises(ValueError, match="mask='dense' does not fit llama with attn_implementation='eager'"):
        _batches(directory, "dense", model.config)
    batch = _batches(directory, "dense", "causal")[0]  # forced: a declaration is taken on the user's word
    additive = _batches(directory, "additive", model.config)[0]
    kw = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "use_cache": False}
    with torch.no_grad():
        wrong = model(**kw, attention_mask=batch.attention_mask).logits
        right = model(**kw, attention_mask=additive.attention_mask).logits
    assert (wrong - right).abs().max().item() > 1e-3


def test_flattened_batch_is_what_data_collator_with_flattening_gives(outputs):
    from transformers import DataCollatorWithFlattening

    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    for batch in _batches(outputs["split"], "varlen", "causal"):  # any model: the kwargs are compared
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


# --- sliding-window attention --------------------------------------------------------------------------
# Mistral slides on every layer; Gemma 2 and Gemma 3 alternate sliding and full layers (one mask per layer
# type, given to the model as a dict). Samples of 100-180 tokens against a window of 48: most tokens have
# more of their sample behind them than the window lets them see.
WINDOW = 48
LONG_N = 192


@pytest.fixture(scope="module")
def long_samples(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("sliding")
    rng = np.random.default_rng(11)
    rows = [{"input_ids": rng.integers(1, 100, int(n)).tolist()} for n in rng.integers(100, 180, 8)]
    rows += [{"input_ids": rng.integers(1, 100, int(n)).tolist()} for n in rng.integers(10, 60, 4)]
    return _pack(tmp, rows, "long", LONG_N)


def _sliding_model(family: str, attn: str, vocab: int, dtype: torch.dtype = torch.float64):
    """A tiny random Mistral (window on every layer), Gemma 2 or Gemma 3 text model (a sliding layer, then a
    full one), window ``WINDOW``."""
    import transformers

    config = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=LONG_N, sliding_window=WINDOW,
    )  # fmt: skip
    if family != "mistral":
        config["layer_types"] = ["sliding_attention", "full_attention"]
    config_class, model_class = {
        "mistral": ("MistralConfig", "MistralForCausalLM"),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    }[family]
    torch.manual_seed(0)
    model_type = getattr(transformers, model_class)
    config = getattr(transformers, config_class)(**config)
    return model_type._from_config(config, attn_implementation=attn, dtype=dtype).eval()


# model, attn_implementation, the loader's mask: each row attends past the window without attention=
SLIDING_PATHS = [
    ("mistral", "eager", "additive"),
    ("mistral", "sdpa", "dense"),
    ("gemma2", "eager", "additive"),  # Gemma 2 has no sdpa in transformers
    ("gemma3", "sdpa", "dense"),
    ("gemma3", "eager", "additive"),
]


@pytest.mark.parametrize(("family", "attn", "mask"), SLIDING_PATHS, ids=["-".join(p) for p in SLIDING_PATHS])
def test_sliding_window_training_equals_each_sample_alone(long_samples, family, attn, mask):
    """``PackedDataset(..., attention=model.config)``: the masks keep each query inside the window."""
    model = _sliding_model(family, attn, _vocab(long_samples))
    taken = _train_and_compare(model, long_samples, mask, "mask", TOL[attn], attention=model.config)
    assert taken > 1000


@pytest.mark.parametrize(("family", "attn"), [("mistral", "sdpa"), ("gemma2", "eager"), ("gemma3", "sdpa")])
def test_sliding_window_flattened_equals_each_sample_alone(long_samples, family, attn):
    """The flattened batch needs no window from packtool: transformers finds the sequences from the
    position_ids and applies each layer's window inside them (flash_attention_2: its kernel's window)."""
    model = _sliding_model(family, attn, _vocab(long_samples))
    taken = _train_and_compare(model, long_samples, "varlen", "flattened", TOL[attn], attention=model.config)
    assert taken > 1000


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gemma3"])
def test_sliding_window_flex_attention_forward_equals_each_sample_alone(long_samples, family, unfused_flex):
    """The BlockMask per layer type (forward only, unfused: flex_attention has no backward on CPU)."""
    model = _sliding_model(family, "flex_attention", _vocab(long_samples))
    alone_model = _sliding_model(family, "eager", _vocab(long_samples))  # the same weights (same seed)
    pieces = _pieces(long_samples)
    compared = 0
    with torch.no_grad():
        for batch in _batches(long_samples, "flex", model.config):
            logits = model(
                input_ids=batch.input_ids, attention_mask=batch.block_mask, position_ids=batch.position_ids,
                use_cache=False,
            ).logits  # fmt: skip
            for j, p in enumerate(batch.pack_index.tolist()):
                for a, b in pieces[p]:
                    alone = alone_model(input_ids=batch.input_ids[j : j + 1, a:b], use_cache=False).logits
                    assert (logits[j, a:b] - alone[0]).abs().max().item() < 1e-6
                    compared += b - a
    assert compared > 1000


@pytest.mark.parametrize(
    ("family", "attn", "mask"), [("mistral", "sdpa", "dense"), ("gemma2", "eager", "additive")]
)
def test_without_the_models_attention_a_mask_sees_past_the_window(long_samples, family, attn, mask):
    """Why the loader takes the model's attention: block-causal masks alone attend past the window."""
    model = _sliding_model(family, attn, _vocab(long_samples))
    pieces = _pieces(long_samples)
    worst = 0.0
    with torch.no_grad():
        for batch in _batches(long_samples, mask, "causal"):  # declared full attention: wrong for it
            logits = model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                position_ids=batch.position_ids, use_cache=False,
            ).logits  # fmt: skip
            for j, p in enumerate(batch.pack_index.tolist()):
                for a, b in pieces[p]:
                    alone = model(input_ids=batch.input_ids[j : j + 1, a:b], use_cache=False).logits
                    worst = max(worst, (logits[j, a:b] - alone[0]).abs().max().item())
    assert worst > 1e-3


# --- every architecture the docs name, on every path: offered only where exact, refused in one line --------
# A tiny random model of each (2 layers, window 16; Llama 4: a chunked layer of chunk 32, then a full one
# without RoPE) over the pretokenized packs (samples of 4-49 tokens in packs of 64). Each row is what the
# loader does with PackedDataset(mask=..., attention=model.config): "exact" (the per-token loss and a
# gradient equal each sample's alone, float64; flex: the forward) or "refused" (one line naming the model
# type and what works), and a refused row trains wrongly when forced (its samples see each other): the
# refusal is not a guess.
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": 16, "pad_token_id": 0}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"sliding_window": 16}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"sliding_window": 16}),
    "ministral": ("MinistralConfig", "MinistralForCausalLM", {"sliding_window": 16}),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", {"sliding_window": 16}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", {"sliding_window": 16}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {"sliding_window": 16, "num_local_experts": 4}),
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", {"attention_chunk_size": 32, "num_local_experts": 4}),
    "bamba": (
        "BambaConfig", "BambaForCausalLM",
        {"attn_layer_indices": [1], "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8,
         "mamba_chunk_size": 16},
    ),
}  # fmt: skip
ALTERNATING = {"gemma2", "gemma3", "cohere2", "olmo3", "gpt_oss"}  # a sliding layer, then a full one


def _tiny(family: str, attn: str, vocab: int):
    import transformers

    config_name, model_name, extra = ARCHITECTURES[family]
    shape = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=4 * N, **extra,
    )  # fmt: skip
    if family in ALTERNATING:
        shape["layer_types"] = ["sliding_attention", "full_attention"]
    if family == "llama4":  # a chunked layer with RoPE, a full one without (temperature-tuned from 8192)
        shape.update(intermediate_size_mlp=64, no_rope_layers=[1, 0])
    config = getattr(transformers, config_name)(**shape)
    kwargs = {"experts_implementation": "eager"} if family in ("gpt_oss", "llama4") else {}  # float64 MoE
    torch.manual_seed(0)
    model_class = getattr(transformers, model_name)
    return model_class._from_config(config, attn_implementation=attn, dtype=torch.float64, **kwargs).eval()


FULL = {"eager": ["additive", "varlen"], "sdpa": ["dense", "varlen"], "flex_attention": ["flex", "varlen"]}
IMPLEMENTATIONS = {family: ["eager", "sdpa", "flex_attention"] for family in ARCHITECTURES}
IMPLEMENTATIONS["gemma2"] = IMPLEMENTATIONS["gpt_oss"] = [
    "eager",
    "flex_attention",
]  # no sdpa in transformers
IMPLEMENTATIONS["bamba"] = ["eager", "sdpa"]  # no flex_attention in transformers
OFFERED = {family: FULL for family in ARCHITECTURES}
OFFERED["gpt_oss"] = {"eager": ["additive"], "flex_attention": ["flex"]}  # its masks ignore position_ids
OFFERED["bamba"] = {}  # Mamba layers: no packtool mask
ROWS = [
    (family, attn, mask, "exact" if mask in OFFERED[family].get(attn, ()) else "refused")
    for family in ARCHITECTURES
    for attn in IMPLEMENTATIONS[family]
    for mask in ("additive", "dense", "flex", "varlen")
]
# the refusals that guard against a silently wrong loss, each checked by forcing the path: the model's
# layers or code (the implementation's own masks refused), a bool mask under eager, a float32 mask under
# float64 sdpa. Left out: Bamba's flattened row, which transformers itself refuses on CPU (without
# causal_conv1d); GPT-OSS under flex_attention, which runs on CUDA only.
SILENT = {
    row[:3]
    for row in ROWS
    if row[3] == "refused"
    and (row[2] in FULL[row[1]] or row[1:3] in (("eager", "dense"), ("sdpa", "additive")))
    and row[::2] != ("bamba", "varlen")
    and row[:2] != ("gpt_oss", "flex_attention")
}
FAST = {  # in make test: the rows of the defects this table was written for, and one of each kind
    ("gpt_oss", "eager", "varlen"), ("gpt_oss", "eager", "additive"), ("gpt_oss", "eager", "dense"),
    ("llama4", "sdpa", "dense"), ("llama4", "eager", "varlen"), ("llama4", "eager", "dense"),
    ("bamba", "sdpa", "dense"), ("mistral", "sdpa", "varlen"),
    ("gemma3", "sdpa", "dense"), ("phi3", "eager", "additive"), ("llama", "sdpa", "additive"),
}  # fmt: skip


def _worst_forward(model, batches: list, pieces: dict, how: str) -> float:
    """The largest logit difference between each piece in the packed forward and the piece alone."""
    worst = 0.0
    with torch.no_grad():
        for batch in batches:
            if how == "flattened":
                kwargs = {k: v for k, v in batch.flattened().items() if k not in ("labels", "shift_labels")}
                logits = model(**kwargs).logits.view(*batch.input_ids.shape, -1)
            else:
                inputs = batch.model_inputs()
                logits = model(
                    **{k: v for k, v in inputs.items() if k not in ("labels", "shift_labels")}
                ).logits
            for j, p in enumerate(batch.pack_index.tolist()):
                for a, b in pieces[p]:
                    alone = model(input_ids=batch.input_ids[j : j + 1, a:b], use_cache=False).logits
                    worst = max(worst, (logits[j, a:b] - alone[0]).abs().max().item())
    return worst


@pytest.mark.parametrize(
    ("family", "attn", "mask", "expected"),
    [pytest.param(*row, marks=() if row[:3] in FAST else pytest.mark.slow) for row in ROWS],
    ids=["-".join(row) for row in ROWS],
)
def test_each_architecture_is_offered_exactly_the_paths_that_train_it_exactly(
    outputs, unfused_flex, family, attn, mask, expected
):
    from packtool.loader import masks_for_model

    directory = outputs["pretokenized"]
    model = _tiny(family, attn, _vocab(directory))
    offered = masks_for_model(model.config)
    assert list(offered) == OFFERED[family].get(attn, [])
    how = "flattened" if mask == "varlen" else "mask"
    if expected == "exact" and attn == "flex_attention":  # forward only: flex has no backward on CPU
        if family == "gpt_oss":
            pytest.skip("transformers runs GPT-OSS's attention sinks under flex_attention on CUDA only")
        assert _worst_forward(model, _batches(directory, mask, model.config), _pieces(directory), how) < 1e-6
    elif expected == "exact":  # Llama 4 takes its norms, router and rotary embedding in float32
        tol = 1e-6 if attn == "eager" or family == "llama4" else 1e-9
        assert _train_and_compare(model, directory, mask, how, tol, attention=model.config) > 100
    else:
        with pytest.raises(ValueError) as refused:
            PackedDataset(directory, batch_size=B, mask=mask, attention=model.config)
        said = str(refused.value)
        assert "\n" not in said and f"mask={mask!r} does not fit {model.config.model_type}" in said
        assert ("use mask=" in said) == bool(offered) and ("unpacked" in said) == (not offered)
        if (family, attn, mask) in SILENT:  # forced past the check (a declaration, on the user's word)
            forced = _batches(directory, mask, "causal")
            assert _worst_forward(model, forced, _pieces(directory), how) > 1e-3


# --- Llama 4's chunked attention ------------------------------------------------------------------------
def test_llama4_chunks_are_counted_in_each_sample(outputs):
    """Why the masks take the model's chunks: a block-causal mask alone (declared full attention) lets a
    chunked layer see across its chunk; and the batch's masks are a dict by layer type, the chunked one
    cutting each sample at multiples of 32 tokens from its own start."""
    directory = outputs["pretokenized"]
    model = _tiny("llama4", "sdpa", _vocab(directory))
    (batch, *_) = _batches(directory, "dense", model.config)
    masks = batch.attention_mask
    assert set(masks) == {"chunked_attention", "full_attention"} and not torch.equal(*masks.values())
    forced = _batches(directory, "dense", "causal")
    assert _worst_forward(model, forced, _pieces(directory), "mask") > 1e-3


def test_llama4_rows_past_its_temperature_floor_are_refused(outputs):
    """Llama 4's layers without RoPE scale each query by its index in the row (attn_temperature_tuning), not
    in its sample: with floor_scale 16, packs of 64 are refused in one line, and wrong when forced with the
    right masks (declared: chunk 32 on the chunked layer)."""
    from packtool.masks import AttentionPattern

    directory = outputs["pretokenized"]
    model = _tiny("llama4", "sdpa", _vocab(directory))
    model.config.floor_scale = 16
    for layer in model.model.layers:
        layer.self_attn.floor_scale = 16
    for mask in ("dense", "varlen"):
        with pytest.raises(ValueError, match=r"on rows of \d+ tokens: its layers without RoPE scale"):
            PackedDataset(directory, batch_size=B, mask=mask, attention=model.config)
    declared = AttentionPattern(None, tuple(model.config.layer_types), 32)
    forced = _batches(directory, "dense", declared)
    wrong = _worst_forward(model, forced, _pieces(directory), "mask")
    model.config.floor_scale = 8192
    for layer in model.model.layers:
        layer.self_attn.floor_scale = 8192
    right = _worst_forward(model, forced, _pieces(directory), "mask")
    assert right < 1e-6 and wrong > 1e-4, (right, wrong)


def test_llama4_vision_language_model_takes_the_text_packs_masks(outputs):
    """Llama 4's vision-language model (``Llama4ForConditionalGeneration``; its processor cannot be built
    here, its image processor needing torchvision): given ``attention=model.config``, the loader reads its
    text config's chunked and full layers and offers its paths; its language model (which its forward calls
    with the masks as given: transformers 5.24's forward itself fails without images, on its missing
    ``image_outputs``) gives each sample's logits alone."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    from packtool.loader import masks_for_model

    directory = outputs["pretokenized"]
    text = _tiny("llama4", "sdpa", _vocab(directory)).config.to_dict()
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
              "image_size": 28, "patch_size": 14, "vision_output_dim": 32, "projector_input_dim": 32,
              "projector_output_dim": 32}  # fmt: skip
    config = Llama4Config(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    model = Llama4ForConditionalGeneration._from_config(
        config, attn_implementation="sdpa", dtype=torch.float64, experts_implementation="eager"
    ).eval()
    assert masks_for_model(model.config) == ("dense", "varlen")
    batches = _batches(directory, "dense", model.config)
    assert set(batches[0].attention_mask) == {"chunked_attention", "full_attention"}
    assert _worst_forward(model.language_model, batches, _pieces(directory), "mask") < 1e-6
