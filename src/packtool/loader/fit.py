"""Which of packtool's mask paths train a model exactly; every other path refused in one line.

A mask path (``PackedDataset(mask=...)``, ``collate_packs``, the vision stages, TRL's padding-free rows)
trains a model on each packed sample alone only if four things hold; ``check_mask_for_model`` checks
them from the model's transformers config (and the rows' length, where known):

* **its layers**: every layer attends causally, to its whole sequence, inside a sliding window or inside
  its attention chunk (Llama 4; ``masks.attention_pattern``). Recurrent or linear layers (Bamba, Jamba,
  Qwen3-Next...) and bidirectional attention have no packtool mask: every path is refused. Flattened
  under flash attention, chunked layers are refused: transformers gives every layer the one
  ``cu_seq_lens`` of the samples, not those of the chunks (``masks.varlen_args(..., chunk=)`` gives a
  kernel of your own the chunks' boundaries).
* **its attention implementation** (``config._attn_implementation``; ``MASKS_FOR_ATTENTION``): eager adds
  the mask to the scores (``"additive"``), sdpa takes the bool mask (``"dense"``; torch's CPU kernel
  misreads a float32 additive mask beside float64 activations), flex_attention a ``BlockMask``
  (``"flex"``); flash attention reads no mask, only the boundaries of a flattened row (``"varlen"``).
* **its code** (``probe_model_code``): given a 4-D mask (a dict of them by layer type), the model hands it
  to its layers as given; given a flattened row (``"varlen"``: one row of ``B * N`` tokens whose positions
  restart at each sample), it keeps the samples apart: under flash attention from the ``cu_seq_lens_q``
  it passes to its layers, under eager, sdpa and flex_attention from the ``position_ids`` it must give its
  mask construction. transformers' GPT-OSS, AFMoE and GraniteMoeHybrid build their masks without them (a
  flattened row attends across its samples there); Qwen2-VL gives them only in its M-RoPE layout
  (``(4, 1, B * N)``: a vision batch with ``get_rope_index``), not for a text batch.
* **the rows it is given** (``row_tokens``: ``N`` for a 4-D mask, ``B * N`` flattened): Llama 4's layers
  without RoPE scale each query by the token's index in the row (``attn_temperature_tuning``:
  ``floor((index + 1) / floor_scale)``), not by its place in its sample, so they train a packed sample as
  alone only in rows shorter than ``floor_scale`` (``row_limit``); longer rows are refused.

**How the code is checked: a probe forward, not the source.** ``probe_model_code`` builds the model's
decoder on the meta device (no weights, no arithmetic: tens of milliseconds even for a 120B config), runs
its own ``forward`` once on a flattened row and once on a given 4-D mask, watches transformers' mask
construction (``masking_utils._preprocess_mask_arguments``, through which every model's masks are made)
and stops at the first decoder layer that runs (Mllama skips a cross-attention layer without images),
whose inputs it then reads. A text config that transformers' model mapping leaves out (Mllama's) is
probed with the model class named after it (``MllamaTextConfig``: ``MllamaTextModel``). Reading the
source instead is not reliable: the contract hides behind indirections (Mistral picks its mask function
at run time, Gemma 3 copies its keyword dict, Qwen2-VL passes ``position_ids`` in one layout only), and a
forward with weights would need a shrunken copy of every config. One probe per config, cached.

A model whose code transformers does not hold (remote code), or that the probe cannot run, is offered
nothing: declare its attention instead (``attention=masks.AttentionPattern(...)`` or ``"causal"``), which
packtool takes on your word.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from packtool.loader.batch import MASKS
from packtool.masks import CAUSAL, CHUNKED_ATTENTION, AttentionPattern, attention_pattern

# transformers' attn_implementation -> the masks it applies (the first is the one to use), before the
# model's code is checked: eager adds the mask to the scores (a bool mask masks nothing there); sdpa takes
# the bool mask (torch 2.13's CPU sdpa misreads a float32 mask beside float64 queries, by up to 4 in the
# output: the additive mask is left out); flash attention reads no 4-D mask; flex_attention takes a BlockMask
MASKS_FOR_ATTENTION = {
    "eager": ("additive", "varlen"),
    "sdpa": ("dense", "varlen"),
    "flex_attention": ("flex", "varlen"),
    "flash_attention_2": ("varlen",),
    "flash_attention_3": ("varlen",),
}
_WHY_NOT = {  # why an implementation does not apply a mask
    "eager": "its attention adds the mask to the scores",
    "sdpa": "it takes the bool mask",
    "flex_attention": "it takes a BlockMask",
}
UNPACKED = "train it on unpacked samples"
CHUNKS_INSTEAD = (
    "load it with attn_implementation 'sdpa', 'eager' or 'flex_attention' (or give a varlen kernel of your "
    "own the chunks' boundaries: masks.varlen_args(..., chunk=config.attention_chunk_size))"
)
DECLARE = (
    "declare its attention yourself (attention=masks.AttentionPattern(...) or 'causal') only if its layers "
    "take packtool's masks as given"
)


def _is_flash(implementation: str | None) -> bool:
    """flash_attention_2/3 and the hub's flash kernels (``kernels-community/...flash...``)."""
    return implementation is not None and "flash" in implementation


def _implementation_masks(implementation: str | None) -> tuple[str, ...]:
    if implementation is None:  # a config bound to no model yet: the code decides alone
        return MASKS
    if implementation in MASKS_FOR_ATTENTION:
        return MASKS_FOR_ATTENTION[implementation]
    return ("varlen",) if _is_flash(implementation) else ()


def _text_config(config: Any) -> Any:
    """The decoder's config (a multimodal model's text config)."""
    text = getattr(config, "get_text_config", None)
    return text(decoder=True) if callable(text) else config


@dataclass(frozen=True)
class ModelCode:
    """What ``probe_model_code`` saw a model's decoder do; each field is None where the path is exact,
    else why not (a phrase for a one-line refusal).

    ``flattened``: a flattened row under eager, sdpa or flex_attention (every mask it builds is given the
    ``position_ids``, with no 2-D mask and no cache: transformers then finds the samples from them);
    ``flash``: a flattened row under flash attention (its first layer receives ``cu_seq_lens_q``);
    ``masked``: a given 4-D mask (or dict of them by layer type) reaches its first layer as given.
    """

    model: str
    flattened: str | None
    flash: str | None
    masked: str | None


class _FirstLayer(Exception):
    """Raised by the probe's hook on the first decoder layer: the probe has seen what it needs."""


_PROBED: dict[tuple[str, bool], ModelCode] = {}
_PROBE_LOCK = threading.Lock()


def probe_model_code(config: Any, mrope: bool = False) -> ModelCode:
    """Probe the code of the transformers model of ``config`` (module docstring): what its decoder does
    with a flattened row (position ids ``(1, L)``, or ``(4, 1, L)`` with ``mrope``) and with a given 4-D
    mask. Cached per config (its JSON) and ``mrope``.

    >>> from transformers import GptOssConfig, LlamaConfig  # doctest: +SKIP
    >>> probe_model_code(LlamaConfig()).flattened is None  # doctest: +SKIP
    True
    >>> probe_model_code(GptOssConfig()).flattened  # doctest: +SKIP
    'GptOssModel builds its attention masks without the position_ids, so the samples of a flattened row
    attend to each other'
    """
    text = _text_config(config)
    key = (f"{type(text).__module__}.{type(text).__name__}:{text.to_json_string(use_diff=False)}", mrope)
    with _PROBE_LOCK:  # one probe at a time: it swaps a function of transformers' masking_utils
        if key not in _PROBED:
            _PROBED[key] = _probe(text, mrope)
        return _PROBED[key]


def _probe(text: Any, mrope: bool) -> ModelCode:
    import transformers  # the transformers extra: only a transformers config is probed
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES  # the same

    names = MODEL_MAPPING_NAMES.get(text.model_type)
    name = names[0] if isinstance(names, tuple | list) else names
    if not name:  # a text config the mapping leaves out (Mllama's): the model class named after it
        own = type(text).__name__.removesuffix("Config") + "Model"
        name = own if getattr(getattr(transformers, own, None), "config_class", None) is type(text) else None
    model_class = getattr(transformers, name, None) if name else None
    if model_class is None:
        why = f"transformers has no model class for {text.model_type!r} (remote code?) to check"
        return ModelCode(text.model_type, why, why, why)
    try:
        with torch.device("meta"):
            model = model_class._from_config(copy.deepcopy(text), attn_implementation="eager")
    except Exception as e:  # whatever its constructor raises: its code cannot be checked
        why = _could_not(name, e)
        return ModelCode(name, why, why, why)
    n = 8
    embeds = torch.zeros(1, n, text.hidden_size, device="meta")
    positions = torch.zeros((4, 1, n) if mrope else (1, n), dtype=torch.int64, device="meta")
    cu = torch.zeros(3, dtype=torch.int32, device="meta")
    flattening = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 4, "max_length_k": 4}
    seen = _first_layer_call(model, text, inputs_embeds=embeds, position_ids=positions, **flattening)
    if isinstance(seen, str):
        flattened = flash = _could_not(name, seen)
    else:
        built, _, kwargs = seen
        flattened = _flattened(name, built)
        flash = None if "cu_seq_lens_q" in kwargs else f"{name} does not pass cu_seq_lens to its layers"
    # a 4-D mask as PackedBatch gives it: one, or a dict keyed by layer type when the model has several
    try:
        types = list(attention_pattern(text).windows())
    except ValueError as e:  # layers no packtool mask serves: no 4-D mask for them
        return ModelCode(name, flattened, flash, str(e))
    masks = {t: torch.zeros(1, 1, n, n, dtype=torch.bool, device="meta") for t in types}
    given = masks if len(masks) > 1 else masks[types[0]]
    positions = positions[1:] if mrope else positions  # the (3, B, N) M-RoPE ids of a VisionBatch
    seen = _first_layer_call(model, text, inputs_embeds=embeds, position_ids=positions, attention_mask=given)
    if isinstance(seen, str):
        masked = _could_not(name, seen)
    else:
        _, args, kwargs = seen
        first = masks[text.layer_types[kwargs.pop("_layer")]] if len(masks) > 1 else given
        masked = (
            None
            if any(v is first for v in (*args, *kwargs.values()))
            else (f"{name} does not hand a given 4-D mask to its layers as given")
        )
    return ModelCode(name, flattened, flash, masked)


def _flattened(name: str, built: list[bool]) -> str | None:
    if not built:
        return f"{name} builds no attention mask through transformers' masking_utils that packtool can check"
    if not all(built):
        return (
            f"{name} builds its attention masks without the position_ids, so the samples of a flattened row "
            "attend to each other"
        )
    return None


def _could_not(name: str, error: Any) -> str:
    said = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return f"packtool could not probe {name}'s code ({said.splitlines()[0][:200] if said else ''})"


def _first_layer_call(model: Any, text: Any, **inputs: Any) -> tuple[list[bool], tuple, dict] | str:
    """Run ``model(**inputs, use_cache=False)`` on the meta device until its first decoder layer that runs
    (Mllama skips a cross-attention layer without images): ``(built, args, kwargs)``, for each mask it built
    whether it was given the ``position_ids`` (with no 2-D mask and no cache), and that layer's arguments
    (``kwargs["_layer"]``: its index); or what went wrong."""
    from transformers import masking_utils  # the transformers extra, as in _probe

    lists = (m for m in model.modules() if isinstance(m, torch.nn.ModuleList))
    layers = next((m for m in lists if len(m) == text.num_hidden_layers), None)
    if layers is None:
        return "no list of its decoder layers"
    built: list[bool] = []
    real = masking_utils._preprocess_mask_arguments

    def observe(config, inputs_embeds, attention_mask, cache, position_ids, *rest, **kwargs):
        if config is not model.config:  # another model, in another thread: as transformers does
            return real(config, inputs_embeds, attention_mask, cache, position_ids, *rest, **kwargs)
        built.append(position_ids is not None and attention_mask is None and cache is None)
        return True, attention_mask, None, None, None, None, None  # the mask as given: nothing computed

    called: dict[str, Any] = {}

    def stop(index, module, args, kwargs):
        called["args"], called["kwargs"] = args, {**kwargs, "_layer": index}
        raise _FirstLayer

    hooks = [
        layer.register_forward_pre_hook(lambda *a, i=i: stop(i, *a), with_kwargs=True)
        for i, layer in enumerate(layers)
    ]
    masking_utils._preprocess_mask_arguments = observe
    try:
        model(**inputs, use_cache=False)
    except _FirstLayer:
        pass
    except Exception as e:  # whatever the model's code raises on the meta device: it cannot be checked
        return f"{type(e).__name__}: {e}"
    finally:
        masking_utils._preprocess_mask_arguments = real
        for hook in hooks:
            hook.remove()
    if not called:
        return "its first layer was not reached"
    return built, called["args"], called["kwargs"]


def _reasons(config: Any, mrope: bool) -> tuple[str, str, dict[str, str | None]]:
    """``(subject, what works when nothing does, {mask: None if it fits, else why not})`` for ``config``;
    the dict in the order of preference of the model's implementation."""
    text = _text_config(config)
    name = getattr(text, "model_type", None) or type(config).__name__
    implementation = getattr(text, "_attn_implementation", None) or getattr(
        config, "_attn_implementation", None
    )
    subject = f"{name} with attn_implementation={implementation!r}" if implementation else name
    try:
        pattern = attention_pattern(config)
    except ValueError as e:
        why = ": " + str(e).removeprefix(f"{name}: ")
        return subject, UNPACKED, {m: why for m in MASKS}
    fits = _implementation_masks(implementation)
    if not fits:
        why = f" (packtool does not know what {implementation!r} does with a mask)"
        instead = (
            "load the model with attn_implementation 'sdpa', 'eager', 'flex_attention' or 'flash_attention_2'"
        )
        return subject, instead, {m: why for m in MASKS}
    reasons: dict[str, str | None] = {m: None for m in fits}
    code = probe_model_code(config, mrope)
    flash = _is_flash(implementation)
    for mask in fits:
        if mask != "varlen":
            why = code.masked
        elif flash and CHUNKED_ATTENTION in pattern.windows():
            why = (
                "its 'chunked_attention' layers would attend across their chunks (transformers gives every "
                "layer the one cu_seq_lens of the samples, not those of the chunks)"
            )
        else:
            why = code.flash if flash else code.flattened
        reasons[mask] = None if why is None else f": {why}"
    for mask in MASKS:
        if mask not in reasons:
            reasons[mask] = f" ({'it reads no 4-D mask' if flash else _WHY_NOT.get(implementation, '')})"
    if flash and CHUNKED_ATTENTION in pattern.windows():
        return subject, CHUNKS_INSTEAD, reasons
    return subject, DECLARE, reasons


def row_limit(config: Any) -> int | None:
    """The tokens a row given to the model of transformers ``config`` must stay under for a packed sample to
    train as alone, or None (any row). Llama 4's layers without RoPE (``no_rope_layers`` 0) with
    ``attn_temperature_tuning`` scale each query by ``log1p(floor((i + 1) / floor_scale))``, ``i`` its index
    in the row the model is given (not its ``position_ids``): equal to alone while ``i + 1 < floor_scale``.

    >>> row_limit(Llama4TextConfig(floor_scale=8192))  # doctest: +SKIP
    8192
    """
    text = _text_config(config)
    without_rope = 0 in (getattr(text, "no_rope_layers", None) or ())
    if without_rope and getattr(text, "attn_temperature_tuning", False):
        return int(text.floor_scale)
    return None


def masks_for_model(config: Any, *, mrope: bool = False) -> tuple[str, ...]:
    """The mask paths that train the model of transformers ``config`` exactly (the first is the one to
    use); empty when none does. ``mrope``: the batches give M-RoPE position ids (``VisionTaskEncoder`` with
    ``get_rope_index``).

    >>> masks_for_model(model.config)  # doctest: +SKIP
    ('additive',)
    """
    _, _, reasons = _reasons(config, mrope)
    return tuple(m for m, why in reasons.items() if why is None)


def check_mask_for_model(
    mask: str, config: Any, *, mrope: bool = False, row_tokens: int | None = None
) -> None:
    """Refuse (``ValueError``, one line naming the model type, the path and what works instead) a ``mask``
    path that does not train the model of transformers ``config`` exactly (module docstring: its layers,
    its ``attn_implementation``, its code, the rows it is given). ``mrope`` as ``masks_for_model``;
    ``row_tokens``: the tokens of each row the model is given (``N`` for a 4-D mask, ``B * N`` flattened),
    checked against ``row_limit`` (None: not known here, not checked).

    >>> check_mask_for_model("varlen", gpt_oss.config)  # doctest: +SKIP
    Traceback (most recent call last):
    ValueError: mask='varlen' does not fit gpt_oss with attn_implementation='eager': GptOssModel builds its
    attention masks without the position_ids, so the samples of a flattened row attend to each other;
    use mask='additive'
    """
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {', '.join(MASKS)}, got {mask!r}")
    subject, instead, reasons = _reasons(config, mrope)
    limit = row_limit(config)
    if reasons[mask] is None and limit is not None and row_tokens is not None and row_tokens >= limit:
        raise ValueError(
            f"mask={mask!r} does not fit {subject} on rows of {row_tokens} tokens: its layers without "
            f"RoPE scale each query by the token's index in the row (attn_temperature_tuning, floor_scale "
            f"{limit}), so a packed sample's tokens at index {limit - 1} of the row or later train otherwise "
            f"than alone; give it rows of fewer than {limit} tokens (--packed-sequence-size; batch_size x N "
            "flattened)"
        )
    if reasons[mask] is None:
        return
    offered = [m for m, why in reasons.items() if why is None]
    if offered:
        others = f" (or {', '.join(map(repr, offered[1:]))})" if len(offered) > 1 else ""
        instead = f"use mask={offered[0]!r}{others}"
    why = reasons[mask]
    joint = "; " if why.startswith(":") else ": "
    raise ValueError(f"mask={mask!r} does not fit {subject}{why}{joint}{instead}")


def _is_model_config(value: Any) -> bool:
    try:
        from transformers import PretrainedConfig  # the transformers extra: a config is one of its objects
    except ImportError:
        return False
    return isinstance(value, PretrainedConfig)


def model_attention(
    mask: str, attention: Any, *, mrope: bool = False, row_tokens: int | None = None
) -> AttentionPattern | None:
    """The ``AttentionPattern`` a batch's masks are built for, from a loader's ``attention=``, once the
    ``mask`` path is known to train the model exactly (else ``ValueError``, one line).

    ``attention``: the model's transformers config (``model.config``: its layers, implementation and code
    are checked, ``check_mask_for_model``); or a declaration, taken on your word, for a model of your own:
    ``"causal"`` (``masks.CAUSAL``: full causal attention on every layer), a ``masks.AttentionPattern`` or a
    mapping of its keys; or None, for ``mask="varlen"`` only (its ``cu_seqlens`` hold no model's
    attention; None is returned): the ``"dense"``, ``"additive"`` and ``"flex"`` masks depend on the model
    and are never built without it. ``mrope`` and ``row_tokens`` as ``check_mask_for_model``.

    >>> model_attention("dense", "causal")
    AttentionPattern(sliding_window=None, layer_types=None, attention_chunk_size=None)
    >>> model_attention("varlen", None) is None
    True
    >>> model_attention("flex", None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: mask='flex' is built for the model's attention: pass attention=model.config (or ...
    """
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {', '.join(MASKS)}, got {mask!r}")
    if attention is None:
        if mask == "varlen":
            return None
        raise ValueError(
            f"mask={mask!r} is built for the model's attention: pass attention=model.config (or "
            f"attention={CAUSAL!r} for a model of your own whose every layer attends causally to its whole "
            "sequence)"
        )
    if isinstance(attention, str | AttentionPattern | Mapping):
        return attention_pattern(attention)
    if not _is_model_config(attention):
        raise ValueError(
            f"attention= takes the model's transformers config (model.config), a masks.AttentionPattern, a "
            f"mapping or {CAUSAL!r}; got a {type(attention).__name__}"
        )
    check_mask_for_model(mask, attention, mrope=mrope, row_tokens=row_tokens)
    return attention_pattern(attention)
