"""Packs made by a custom ``pack_selected_samples`` policy, kept as one more chunk of the run's store.

The policy (``packing.custom``) returns whole packs of its own making; the planner stores them with the
encoded samples (``ChunkStore.append_packs``, ``MemoryStore.append_packs``), one new sample per
``seq_lens`` entry, and plans them as they are.
"""

from __future__ import annotations

import numpy as np

from packtool.conventions import IGNORE_INDEX
from packtool.layout import labels_follow_rule


def policy_chunk(
    packs: list[dict[str, np.ndarray]], labels_rule: str | None = None
) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and meta (less ``index``) of the chunk that holds packs made by a custom
    ``pack_selected_samples``, one sample per ``seq_lens`` entry (with ``labels_rule``, as
    ``chunk_parts``: whether the policy's labels follow that rule too).

    Each pack is a dict of ``input_ids``, ``labels`` (and ``loss_mask``), ``seq_lens`` and ``origin``
    (the input index of each ``seq_lens`` entry, what ``sample_index`` says in the output).
    """
    seq = np.concatenate([p["seq_lens"] for p in packs]).astype(np.int64)
    has_mask = any("loss_mask" in p for p in packs)
    arrays = {
        "input_ids": np.concatenate([p["input_ids"] for p in packs]).astype(np.int32),
        "labels": np.concatenate([p["labels"] for p in packs]).astype(np.int32),
    }
    if has_mask:
        masks = [p.get("loss_mask", (p["labels"] != IGNORE_INDEX).astype(np.int8)) for p in packs]
        arrays["loss_mask"] = np.concatenate(masks).astype(np.int8)
    arrays["offsets"] = np.concatenate([[0], np.cumsum(seq)]).astype(np.int64)
    arrays["rows"] = np.repeat(np.arange(len(packs)), [len(p["seq_lens"]) for p in packs])
    arrays["source_ids"] = np.zeros(len(seq), dtype=np.int32)
    arrays["origin"] = np.concatenate([p["origin"] for p in packs]).astype(np.int64)
    meta = {
        "num_samples": len(seq),
        "num_tokens": int(seq.sum()),
        "has_loss_mask": has_mask,
        "sources": ["pack_selected_samples output"],
        "row_kinds": ["pack"],
        "origin": True,
    }
    if labels_rule is not None:
        mask = arrays.get("loss_mask")
        follow = labels_follow_rule(
            arrays["input_ids"], arrays["labels"], mask, arrays["offsets"], labels_rule == "shifted"
        )
        meta.update(labels_rule=labels_rule, labels_follow_rule=follow)
    return arrays, meta
