"""Example custom packing policy.

Use: ``packtool pack --strategy configs/custom_policy.py:select_samples_to_pack``.

The Megatron-Energon contract: ``select_samples_to_pack(samples) -> list of groups`` receives a buffer of
``--packing-buffer-size`` encoded samples (dicts with ``index``, ``length``, ``input_ids``, ``labels`` and
``loss_mask`` when present; see ``packtool/packing/custom.py``) and returns groups of them, one group per
pack. Every sample of the buffer must be in exactly one group, and no group may hold more than N tokens:
packtool stops with an error naming the file and row otherwise. packtool also passes the run's N
(``packed_sequence_size``, from ``--packed-sequence-size``) and ``seed`` (``--seed``) to a policy that
takes them as keyword arguments, as this one does; Energon's one-argument policies work unchanged.

This one is first-fit in input order over the run's N, so that samples stay near their neighbours (e.g.
documents of one source). ``pack_selected_samples`` is optional; ``pack_with_separator`` below shows one
(rename it to ``pack_selected_samples`` to use it): it puts the group's samples end to end as one
sequence, so attention is not cut between them.
"""

from __future__ import annotations

import numpy as np


def select_samples_to_pack(samples: list[dict], packed_sequence_size: int, seed: int = 0) -> list[list[dict]]:
    """First-fit in input order: each sample goes into the first open group of ``packed_sequence_size``
    tokens it fits in (``seed`` is unused: first-fit has no randomness)."""
    groups: list[list[dict]] = []
    room: list[int] = []
    for sample in samples:
        for g, r in enumerate(room):
            if sample["length"] <= r:
                groups[g].append(sample)
                room[g] -= sample["length"]
                break
        else:
            groups.append([sample])
            room.append(packed_sequence_size - sample["length"])
    return groups


def pack_with_separator(group: list[dict]) -> dict:
    """One sequence for the whole group (``seq_lens`` of one entry, so ``sample_index`` is given)."""
    ids = np.concatenate([s["input_ids"] for s in group])
    labels = np.concatenate([s["labels"] for s in group])
    return {"input_ids": ids, "labels": labels, "seq_lens": [len(ids)], "sample_index": [group[0]["index"]]}
