"""Cross-attention models (Llama 3.2 Vision, ``mllama``): each packed sample's text on its own images only.

A cross-attention model's images are not in its token sequence (one ``<|image|>`` token each): its vision
tower turns each image into ``T`` tiles of ``P`` vision tokens, and the text attends to them in its
cross-attention layers, each text token to the images the processor's rule gives it
(``get_cross_attention_token_mask``: from its image's ``<|image|>`` up to the next image's; consecutive
images together), through ``cross_attention_mask`` ``(B, N, images, T)``. In a pack every row holds the
images of all its samples, and transformers' ``MllamaModel`` serves three kinds of text token:

1. **a token the rule gives images**: it attends their real tiles, as alone (the processor's
   ``cross_attention_mask`` of its sample, placed at the pack's images);
2. **a token of a sample with images that the rule gives none** (the text before the first image, the
   BOS among it): alone, transformers lets it attend *every* vision token of its sample (a row with nothing
   to attend is unmasked, then only its MLP output is zeroed by ``full_text_row_masked_out_mask``, not its
   attention output); packed, it would attend every image of the pack;
3. **a token of a sample without images**: alone, the model skips its cross-attention layers (nothing
   added); packed, it would attend every image of its row.

No ``cross_attention_mask`` given to ``MllamaModel`` serves 2 and 3: 2 needs a row that attends its own
sample's images while its MLP output stays zeroed, 3 a row that adds nothing. ``attend_own_images(model)``
makes the model serve them, with two forward pre-hooks: on ``model.model`` it takes the pack's mask (one
slot more than the batch's images: ``OWN`` where the rule gives a token an image's tiles, ``SAMPLE`` on
every tile of its sample's images for a token of kind 2; kind 3 has none) instead of letting
``MllamaModel`` prepare it; on ``model.model.language_model`` it gives the decoder the masks that serve all
three kinds: kind 1 as transformers would, kind 2 its own sample's vision tokens (every tile, as alone)
with ``full_text_row_masked_out_mask`` 0, kind 3 the extra slot: one image of zero vision tokens, whose
keys and values the cross-attention's bias-free projections and norms keep at zero, so the layer adds
nothing (its MLP output zeroed), as when skipped. Nothing of transformers' code is changed: the hooks
replace the inputs it hands its language model. A batch that does not carry the extra slot (the
processor's own) goes through untouched, and a pack's batch given to a model without the hooks fails in
its cross-attention (one slot more in the mask than vision tokens), never silently.

The pack's inputs are the processor's on each sample alone (``model_inputs.image_inputs``): ``pixel_values``
``(1, images, T, 3, H, W)``, ``aspect_ratio_ids`` ``(1, images)`` and ``aspect_ratio_mask``
``(1, images, T)`` of the pack's images in order; ``pack_cross_attention_mask`` the rule's mask of each
sample placed in the pack's. ``batch_cross_attention_mask`` stacks the packs' masks and adds the slot;
``flattened_cross_attention`` lays a batch out as one row (``mask="varlen"``).

Example::

    model = attend_own_images(MllamaForConditionalGeneration.from_pretrained(...))
    ds = vision_dataset("out/", vp, cross_attention=model, mask="dense", attention=model.config)
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import numpy as np
import torch

from packtool.vision.model_inputs import concat_padded

OWN, SAMPLE = 1, 2  # a pack's cross_attention_mask: the tiles the rule gives a token; its sample's images
_HOOKED = "_packtool_attend_own_images"  # set on a model whose hooks are registered


def is_cross_attention_model(model: Any) -> bool:
    """Whether ``model`` is a transformers cross-attention model ``attend_own_images`` serves (Mllama's
    ``...ForConditionalGeneration`` or ``...Model``: a ``language_model`` taking
    ``cross_attention_states``)."""
    language = getattr(getattr(model, "model", model), "language_model", None)
    forward = getattr(language, "forward", None)
    return callable(forward) and "cross_attention_states" in inspect.signature(forward).parameters


def attend_own_images(model: Any) -> Any:
    """Register on ``model`` (``MllamaForConditionalGeneration``, or its ``MllamaModel``) the hooks that keep
    each packed sample's text on its own images (module docstring), once; returns ``model``.
    ``ValueError`` for a model that is not a cross-attention model."""
    if not is_cross_attention_model(model):
        raise ValueError(
            f"{type(model).__name__} is not a cross-attention model (a language_model taking "
            "cross_attention_states, as Mllama's)"
        )
    inner = getattr(model, "model", model)
    if not getattr(inner, _HOOKED, False):
        taken: dict[str, torch.Tensor] = {}
        inner.register_forward_pre_hook(lambda m, a, kw: _take_pack_mask(taken, a, kw), with_kwargs=True)
        inner.language_model.register_forward_pre_hook(
            lambda m, a, kw: _give_masks(taken, a, kw), with_kwargs=True
        )
        setattr(inner, _HOOKED, True)
    return model


def _take_pack_mask(taken: dict, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """On ``MllamaModel``: a pack's mask (one slot more than ``pixel_values`` has images) kept for
    ``_give_masks`` and not given to the model; any other input left as it is."""
    taken.clear()
    mask, pixels = kwargs.get("cross_attention_mask"), kwargs.get("pixel_values")
    images = 0 if pixels is None else pixels.shape[1]
    if mask is None or mask.dim() != 4 or mask.shape[2] != images + 1:
        return None
    taken["mask"] = mask
    return args, {**kwargs, "cross_attention_mask": None}


def _give_masks(taken: dict, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """On the language model: the cross-attention inputs that serve every kind of text token (module
    docstring), from the pack's mask ``(B, N, images + 1, T)`` and the vision tokens
    ``(B * images * T, P, hidden)``."""
    mask = taken.pop("mask", None)
    states = kwargs.get("cross_attention_states")
    if mask is None or states is None:  # no image in the batch: the model skips its cross-attention layers
        return None
    b, n, slots, tiles = mask.shape
    patches, hidden = states.shape[-2:]
    zero_image = states.new_zeros(b, tiles, patches, hidden)
    states = torch.cat([states.reshape(b, (slots - 1) * tiles, patches, hidden), zero_image], 1)
    mask = mask.to(states.device)
    by_rule = mask == OWN
    attends = by_rule | (mask == SAMPLE)
    attends[:, :, -1] |= ~attends.any(dim=(2, 3)).unsqueeze(-1)  # a token without images: the zero image
    allowed = attends.repeat_interleave(patches, dim=3).reshape(b, 1, n, -1)
    additive = torch.zeros(allowed.shape, dtype=states.dtype, device=states.device)
    additive.masked_fill_(~allowed, torch.finfo(states.dtype).min)  # as transformers' own mask
    rows = by_rule.any(dim=(2, 3)).to(states.dtype)[:, None, :, None]
    given = {"cross_attention_states": states.reshape(-1, patches, hidden), "cross_attention_mask": additive,
             "full_text_row_masked_out_mask": rows}  # fmt: skip
    return args, {**kwargs, **given}


def pack_cross_attention_mask(
    processor: Any, input_ids: np.ndarray, seq_lens: np.ndarray, image_sample: np.ndarray, tiles: np.ndarray
) -> torch.Tensor:
    """``(N, images, T)`` int8: a pack's cross-attention mask, ``T`` the processor's ``max_image_tiles``.

    Args:
        processor: the transformers processor (``MllamaProcessor``), whose module holds the rule
            (``get_cross_attention_token_mask``, ``convert_sparse_cross_attention_mask_to_dense``).
        input_ids: ``(N,)`` the pack's ids; seq_lens: its sequences' lengths.
        image_sample: ``(images,)`` the sequence of the pack each image is in (in pack order).
        tiles: ``(images,)`` each image's tiles (its ``aspect_ratio_mask``'s ones).

    Each sample's rows hold the processor's mask of that sample alone (``OWN``) at the sample's images, and
    ``SAMPLE`` on every tile of them in the rows the rule gives no image.
    """
    rule = importlib.import_module(type(processor).__module__)  # the processor's own module
    image_id, most = int(processor.image_token_id), int(processor.image_processor.max_image_tiles)
    out = np.zeros((len(input_ids), len(image_sample), most), dtype=np.int8)
    ends = np.cumsum(seq_lens)
    for s in np.unique(image_sample).tolist():
        a, b = int(ends[s] - seq_lens[s]), int(ends[s])
        own = np.flatnonzero(image_sample == s)
        spans = rule.get_cross_attention_token_mask(input_ids[a:b].tolist(), image_id)
        dense = rule.convert_sparse_cross_attention_mask_to_dense(
            [spans], [tiles[own].tolist()], most, b - a
        )[0]
        if dense.shape[1] != len(own):
            raise ValueError(f"sequence {s} has {dense.shape[1]} image tokens and {len(own)} images")
        block = np.where(dense > 0, OWN, 0).astype(np.int8)
        block[~block.any(axis=(1, 2))] = SAMPLE
        out[a:b, own[0] : own[-1] + 1] = block
    return torch.from_numpy(out)


def batch_rows(values: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The packs' image inputs ``(1, images, ...)`` (None: a pack without images) stacked to
    ``(B, most images, ...)``, padded with zeros; None when no pack has an image."""
    template = next((v for v in values if v is not None), None)
    if template is None:
        return None
    empty = template.new_zeros((1, 0, *template.shape[2:]))
    return concat_padded([empty if v is None else v for v in values])


def batch_cross_attention_mask(masks: list[torch.Tensor], tiles: int) -> torch.Tensor:
    """``(B, N, images + 1, T)`` int8: the packs' masks (``pack_cross_attention_mask``) padded to the batch's
    most images (the padding images: attended by no token), and the zero image's slot last."""
    most = max(m.shape[1] for m in masks)
    out = torch.zeros((len(masks), masks[0].shape[0], most + 1, tiles), dtype=torch.int8)
    for row, m in enumerate(masks):
        out[row, :, : m.shape[1]] = m
    return out


def flattened_cross_attention(inputs: dict[str, Any], mask: torch.Tensor) -> dict[str, Any]:
    """The cross-attention inputs of a batch laid out as one row of ``B * N`` tokens (``mask="varlen"``):
    ``pixel_values`` ``(1, B * images, ...)``, the aspect-ratio inputs alike, and the mask
    ``(1, B * N, B * images + 1, T)``, each pack's rows on its own images."""
    b, n, slots, tiles = mask.shape
    images = slots - 1
    out = dict(inputs)
    for name in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"):
        if out.get(name) is not None:
            out[name] = out[name].reshape(1, b * images, *out[name].shape[2:])
    wide = mask.new_zeros(b, n, b, images, tiles)
    rows = torch.arange(b)
    wide[rows, :, rows] = mask[:, :, :images]
    flat = torch.cat(
        [wide.reshape(1, b * n, b * images, tiles), mask[:, :, images:].reshape(1, b * n, 1, tiles)], 2
    )
    out["cross_attention_mask"] = flat
    return out
