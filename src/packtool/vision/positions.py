"""Position ids of a vision-language pack: each sample's from 0, and M-RoPE ids through the model's own rule.

Qwen2-VL and Qwen2.5-VL rotate queries and keys by three position ids per token (temporal, height, width):
an image's tokens take their patch's row and column, the text after it goes on from the largest. Only the
model knows the rule (its ``get_rope_index``), so ``mrope_position_ids`` runs the model's function on each
sample of the pack alone, as if it were the whole sequence, and concatenates; the padding counts from 0.
``with_text_positions`` puts the per-sample text positions in front, ``(4, B, N)``: the layout from which
transformers' Qwen2-VL finds the packed sequences' boundaries when no attention mask is given.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from packtool.vision.packs import VisionPack

# get_rope_index(input_ids (1, L), mm_token_type_ids (1, L), image_grid_thw=(k, 3) | None) -> ((3, 1, L), ...)
GetRopeIndex = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def mrope_position_ids(
    get_rope_index: GetRopeIndex, pack: VisionPack, image_grid_thw: torch.Tensor | None
) -> torch.Tensor:
    """``(3, 1, N)`` int64 M-RoPE position ids of ``pack``.

    Args:
        get_rope_index: the model's own, e.g. ``model.model.get_rope_index`` of a
            ``Qwen2VLForConditionalGeneration``.
        pack: the pack (``assemble_pack``).
        image_grid_thw: ``(num_images, 3)`` the grids of the pack's images in pack order (what the image
            processor returns for them), or ``None`` for a pack without images.
    """
    n = len(pack.input_ids)
    ends = np.cumsum(pack.seq_lens)
    starts = ends - pack.seq_lens
    image_token = torch.zeros(n, dtype=torch.int32)
    for a, length in zip(pack.image_offsets.tolist(), pack.image_lengths.tolist(), strict=True):
        image_token[a : a + length] = 1
    input_ids = torch.from_numpy(pack.input_ids).view(1, -1)
    out = torch.from_numpy(pack.position_ids).view(1, 1, -1).repeat(3, 1, 1)
    for j in range(len(pack.samples)):
        a, b = int(starts[j]), int(ends[j])
        mine = np.flatnonzero(pack.image_sample == j)
        grids = image_grid_thw[torch.from_numpy(mine)] if len(mine) else None
        positions, _ = get_rope_index(input_ids[:, a:b], image_token[a:b].view(1, -1), image_grid_thw=grids)
        out[:, :, a:b] = positions
    return out


def with_text_positions(mrope: torch.Tensor, text_position_ids: torch.Tensor) -> torch.Tensor:
    """``(4, B, N)``: the ``(B, N)`` text positions (from 0 in every sample) in front of ``(3, B, N)``
    M-RoPE ids, for the flattened (no mask) path.

    >>> with_text_positions(torch.zeros(3, 1, 2, dtype=torch.long), torch.tensor([[0, 1]])).shape
    torch.Size([4, 1, 2])
    """
    return torch.cat([text_position_ids.unsqueeze(0), mrope], dim=0)
