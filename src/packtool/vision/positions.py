"""M-RoPE position ids of a vision-language pack, through the model's own rule, each sample's from 0.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL rotate queries and keys by three position ids per token (temporal,
height, width): an image's tokens take their patch's row and column, the text after it goes on from the
largest. Only the model knows the rule (its ``get_rope_index``), so ``pack_mrope_position_ids`` runs the
model's function on each sample of the pack alone, as if it were the whole sequence, and concatenates;
the padding counts from 0. The loader (``packtool.vision.loader``) puts the per-sample text positions in
front for the flattened path, ``(4, 1, B * N)``: the layout from which transformers' Qwen2-VL finds the
packed sequences' boundaries when no attention mask is given.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from packtool.arrays import ranges

# get_rope_index(input_ids (1, L), mm_token_type_ids (1, L), image_grid_thw=(k, 3) | None) -> ((3, 1, L), ...)
GetRopeIndex = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def pack_mrope_position_ids(
    get_rope_index: GetRopeIndex,
    input_ids: np.ndarray | torch.Tensor,
    seq_lens: np.ndarray | torch.Tensor,
    image_offsets: np.ndarray | torch.Tensor,
    image_lengths: np.ndarray | torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    image_token_ids: np.ndarray | None = None,
) -> torch.Tensor:
    """``(3, N)`` int64 M-RoPE position ids of one pack, from its stored columns (what the loader reads).

    The model's rule runs on every segment of ``seq_lens`` alone (each sample, and the padding, which is
    text and so counts from 0 as the text positions do), with the grids of the images whose spans start in
    it; the k-th span (``image_offsets[k]``, ``image_lengths[k]``) is the k-th image. The
    ``mm_token_type_ids`` the rule reads are 1 on the processor's image tokens (``image_token_ids``) inside
    the spans (every token of the spans without it).

    Args:
        get_rope_index: the model's own (``model.model.get_rope_index``).
        input_ids: ``(N,)`` the pack's tokens.
        seq_lens: ``(num_segments,)`` its sequences' lengths, the padding last; they sum to N.
        image_offsets, image_lengths: ``(num_images,)`` each image's span, in pack order.
        image_grid_thw: ``(num_images, 3)`` the images' grids in pack order, or ``None`` without images.
        image_token_ids: ``(m,)`` the processor's image tokens.
    """
    ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.int64).view(1, -1)
    lengths = np.asarray(seq_lens, dtype=np.int64)
    offsets = np.asarray(image_offsets, dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    marked = ranges_mask(ids.shape[1], offsets, np.asarray(image_lengths, dtype=np.int64))
    if image_token_ids is not None:
        marked &= np.isin(ids.numpy()[0], image_token_ids).astype(np.int32)
    image_token = torch.from_numpy(marked)
    segment_of_image = np.searchsorted(ends, offsets, side="right")
    out = torch.empty((3, ids.shape[1]), dtype=torch.int64)
    for j, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        mine = np.flatnonzero(segment_of_image == j)
        grids = image_grid_thw[torch.from_numpy(mine)] if len(mine) else None
        positions, _ = get_rope_index(ids[:, a:b], image_token[a:b].view(1, -1), image_grid_thw=grids)
        out[:, a:b] = positions.view(3, -1)
    return out


def ranges_mask(n: int, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``(n,)`` int32: 1 on the runs ``[offsets[k], offsets[k] + lengths[k])``, 0 elsewhere.

    >>> ranges_mask(6, np.array([1, 4]), np.array([2, 1])).tolist()
    [0, 1, 1, 0, 1, 0]
    """
    out = np.zeros(n, dtype=np.int32)
    out[ranges(np.asarray(offsets, dtype=np.int64), np.asarray(lengths, dtype=np.int64))] = 1
    return out
