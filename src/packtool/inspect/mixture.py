"""``packtool inspect`` of a mixture: each source's packs, tokens and fill, and what an epoch of the mixture
takes of it (``packtool.loader.sources``; a mixture file, or several outputs with weights or repeats).

Everything comes from the manifests: nothing is read but ``manifest.json``.

Example::

    >>> report = mixture_report({"out/web": 0.7, "out/code": 0.3})  # doctest: +SKIP
    >>> [(s["path"], s["token_share"]) for s in report["sources"]]  # doctest: +SKIP
    [('out/web', 0.62), ('out/code', 0.38)]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.errors import ConfigError
from packtool.loader.order import mixture_counts
from packtool.loader.sources import Mixture, open_source
from packtool.manifest import total_stats


def mixture_report(spec: Any, split: str | None = "train") -> dict:
    """The figures of the mixture ``spec`` names (what ``inspect --json`` prints for it).

    ``sources``: per source its ``path``, ``run_id``, ``weight`` or ``repeat``, ``packs``, ``tokens`` (of
    the split, from the manifest) and ``fill_rate``; what one epoch of the mixture takes of it
    (``epoch_packs``, ``epoch_tokens``: exact for repeats, expected for weights), its ``pack_share`` and
    ``token_share`` of the epoch (the same share of every 1,000 steps, in expectation), and
    ``source_epochs``: how many times over its own packs an epoch goes. Raises ``ConfigError`` for what
    ``open_source`` refuses (outputs that do not mix, a bad share, a mixture file packtool does not read).
    """
    source = open_source(spec, split)
    if not isinstance(source, Mixture):
        raise ConfigError(f"{source.name}: one output, not a mixture (inspect it alone)")
    n = source.outputs[0].manifest.packed_sequence_size
    sizes = source.sizes
    if source.shares.repeats is not None:  # exact, the same every epoch
        per_epoch = mixture_counts(sizes, source.shares, epoch=0, seed=0, shuffle=False).astype(np.float64)
    else:  # each pack drawn with probability w / sum(w), as many as the sources hold together
        weights = np.asarray(source.shares.weights, dtype=np.float64)
        per_epoch = sizes.sum() * weights / weights.sum()
    rows = []
    for i, output in enumerate(source.outputs):
        packs = int(sizes[i])
        tokens = sum(entry.num_tokens for _, entry in output.manifest.split_shards(split))
        kind, value = source.share(i)
        rows.append({
            "path": output.name, "run_id": output.manifest.run_id, kind: value, "packs": packs,
            "tokens": tokens, "fill_rate": total_stats(n, packs, tokens)["fill_rate"],
            "epoch_packs": round(float(per_epoch[i]), 3),
            "epoch_tokens": round(float(per_epoch[i]) * tokens / packs, 1) if packs else 0.0,
            "source_epochs": round(float(per_epoch[i]) / packs, 4) if packs else 0.0,
        })  # fmt: skip
    epoch_packs = sum(r["epoch_packs"] for r in rows)
    epoch_tokens = sum(r["epoch_tokens"] for r in rows)
    for r in rows:
        r["pack_share"] = round(r["epoch_packs"] / epoch_packs, 6) if epoch_packs else 0.0
        r["token_share"] = round(r["epoch_tokens"] / epoch_tokens, 6) if epoch_tokens else 0.0
    return {
        "mixture": str(spec) if not isinstance(spec, (dict, list)) else None,
        "kind": "repeat" if source.shares.repeats is not None else "weight",
        "split": split,
        "packed_sequence_size": n,
        "epoch_packs": round(epoch_packs, 3),
        "epoch_tokens": round(epoch_tokens, 1),
        "sources": rows,
    }
