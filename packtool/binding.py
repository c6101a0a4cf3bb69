"""What binds an output together: the ``run_id`` is made from the run's content and from every manifest
field a reader relies on, and every shard carries it.

* ``run_key`` (32 hex digits, in the manifest): the config, tokenizer and inputs' identity
  (``pipeline.identity.make_run_id``) and the *content* the run encoded: the digest of every scratch
  chunk's tokens (``pipeline.chunks.chunk_digest``). A line-shuffled copy of an input gives another key.
* ``run_id`` (16 hex digits) = a hash of ``run_key`` and the *reading fields* (``reading_fields``): the
  conventions (``labels``, ``position_ids``), the columns and layout, ``N``, the pad id, the format and
  the shard list (each shard's name, pack count and split, in order).

Readers recompute the ``run_id`` from the manifest (``manifest_problem``) before the first pack, and
check that each shard carries it (its own metadata): a manifest whose conventions, columns or shard list
were edited no longer gives its ``run_id``; editing the ``run_id`` too leaves the shards naming another;
a shard of another run, or one re-packed in place, names another run.

>>> fields = reading_fields(packed_sequence_size=8, shard_format="parquet", sample_format="text",
...     labels="shifted", position_ids="restart", pad_token_id=0, columns=["input_ids"], layout="full",
...     shards=[("packs-000000.parquet", 3, "train")])
>>> bound_run_id("0" * 32, fields) == bound_run_id("0" * 32, {**fields, "labels": "unshifted"})
False
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from packtool.layout import columns_problem


def content_run_key(identity_key: str, chunk_digests: Sequence[str]) -> str:
    """32 hex digits from the run's identity (config, tokenizer, inputs' names and sizes) and the
    digests of its encoded chunks, in order."""
    basis = json.dumps([identity_key, list(chunk_digests)])
    return hashlib.sha256(basis.encode()).hexdigest()[:32]


def reading_fields(
    *,
    packed_sequence_size: int,
    shard_format: str,
    sample_format: str,
    labels: str,
    position_ids: str,
    pad_token_id: int,
    columns: Sequence[str],
    layout: str,
    shards: Sequence[tuple[str, int, str]],
) -> dict[str, Any]:
    """The manifest fields a reader relies on, as the ``run_id`` binds them (``shards``: ``(path,
    num_packs, split)`` in order)."""
    return {
        "packed_sequence_size": packed_sequence_size,
        "shard_format": shard_format,
        "sample_format": sample_format,
        "labels": labels,
        "position_ids": position_ids,
        "pad_token_id": pad_token_id,
        "columns": list(columns),
        "layout": layout,
        "shards": [[str(p), int(k), str(s)] for p, k, s in shards],
    }


def bound_run_id(run_key: str, fields: dict[str, Any]) -> str:
    """16 hex digits: the ``run_id`` of ``run_key`` with the reading ``fields``."""
    basis = json.dumps([run_key, fields], sort_keys=True, default=str)
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


def manifest_fields(manifest: Any) -> dict[str, Any]:
    """``reading_fields`` of a loaded ``Manifest``."""
    return reading_fields(
        packed_sequence_size=manifest.packed_sequence_size,
        shard_format=manifest.shard_format,
        sample_format=manifest.sample_format,
        labels=manifest.labels,
        position_ids=manifest.position_ids,
        pad_token_id=manifest.pad_token_id,
        columns=manifest.columns,
        layout=manifest.layout,
        shards=[(e.path, e.num_packs, e.split or "train") for e in manifest.shards],
    )


def manifest_problem(manifest: Any) -> str | None:
    """Why the manifest cannot be read as written: its columns cannot give the training columns
    (``layout.columns_problem``), or it does not give its own ``run_id`` (a field a reader relies on was
    edited); None when neither.
    A manifest without ``run_key`` (written before run ids were bound to content) is not checked."""
    if (problem := columns_problem(list(manifest.columns), manifest.labels)) is not None:
        return problem
    run_key = getattr(manifest, "run_key", None)
    if run_key is None:
        return None
    try:
        want = bound_run_id(run_key, manifest_fields(manifest))
    except (TypeError, ValueError):
        return "its reading fields are not of their types"
    if want != manifest.run_id:
        return (
            f"its fields give run_id {want}, it says {manifest.run_id}: the manifest was edited (its "
            "conventions, columns, layout or shard list), its shards would be read as not written"
        )
    return None
