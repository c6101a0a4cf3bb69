"""What binds an output together: the ``run_id`` is made from the run's content and from every manifest
field a reader relies on, and every shard carries it.

* ``run_key`` (32 hex digits, in the manifest): the config, tokenizer and inputs' identity
  (``pipeline.identity.make_run_id``) and the *content* the run encoded: the digest of every scratch
  chunk's tokens (``pipeline.chunks.chunk_digest``). A line-shuffled copy of an input gives another key.
  A vision-language output's (format 6.2 on) is followed by ``.`` and the digest of its processor record
  (``vision.processor`` less its ``path``: ``processor_run_key``), so that the record ``inspect`` and
  ``verify`` read (the loss rule, the chat template's and config's hashes, the image tokens) is bound too,
  while a 6.1 reader, to which the key is a string like any other, still reads the output whole.
* ``run_id`` (16 hex digits) = a hash of ``run_key`` and the *reading fields* (``reading_fields``): the
  conventions (``labels``, ``position_ids``), the columns and layout, ``N``, the pad id, the format and
  the shard list (each shard's name, pack count and split, in order).

Readers recompute the ``run_id`` from the manifest (``manifest_problem``) before the first pack, and
check that each shard carries it (its own metadata): a manifest whose conventions, columns or shard list
were edited no longer gives its ``run_id``; editing the ``run_id`` too leaves the shards naming another;
a shard of another run, or one re-packed in place, names another run. What the manifest says twice is
checked both ways: each shard's ``first_pack`` against the pack counts before it (``first_pack_problem``),
the processor record against the digest in the ``run_key`` (``processor_problem``).

>>> fields = reading_fields(packed_sequence_size=8, shard_format="parquet", sample_format="text",
...     labels="shifted", position_ids="restart", pad_token_id=0, columns=["input_ids"], layout="full",
...     shards=[("packs-000000.parquet", 3, "train")])
>>> bound_run_id("0" * 32, fields) == bound_run_id("0" * 32, {**fields, "labels": "unshifted"})
False
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from packtool.conventions import LABELS, MAX_PACKED_SEQUENCE_SIZE, MAX_TOKEN_ID, POSITION_IDS
from packtool.errors import InputError
from packtool.formats.registry import get_format
from packtool.layout import columns_problem
from packtool.manifest import IMAGE_COLUMNS

INT64 = 1 << 63  # a manifest's ints: within int64, as NumPy and Arrow hold counts and offsets


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
    image_columns: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The manifest fields a reader relies on, as the ``run_id`` binds them (``shards``: ``(path,
    num_packs, split)`` in order; ``image_columns``: a vision-language output's, bound only when set so
    that a text output's ``run_id`` is what it was)."""
    images = {} if image_columns is None else {"image_columns": list(image_columns)}
    return images | {
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


PROCESSOR_KEY = "."  # between a run_key's 32 hex digits and its processor record's digest


def processor_digest(record: Any) -> str:
    """32 hex digits: sha256 of a processor record (``VisionProcessor.identity()``, as the manifest's
    ``vision.processor`` holds it) less its ``path`` (where the processor lay, made absolute for
    ``inspect``: the same run elsewhere writes the same shards). Any value is digested (an edited
    manifest's), so that a record that is not the run's gives another digest.

    >>> record = {"path": "/a/qwen", "loss_on": "assistant", "image_token_ids": [7]}
    >>> processor_digest(record) == processor_digest({**record, "path": "/b/qwen"})
    True
    >>> processor_digest(record) == processor_digest({**record, "loss_on": "all"})
    False
    """
    kept = {k: v for k, v in record.items() if k != "path"} if isinstance(record, dict) else record
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:32]


def processor_run_key(run_key: str, record: dict[str, Any]) -> str:
    """A vision-language run's ``run_key``: ``run_key`` and, after ``PROCESSOR_KEY``, the digest of its
    processor ``record`` (``processor_digest``), so that the ``run_id`` made from it binds the record."""
    return f"{run_key}{PROCESSOR_KEY}{processor_digest(record)}"


def processor_problem(manifest: Any) -> str | None:
    """Why the manifest's processor record (``vision.processor``) is not the one its ``run_key`` binds
    (``processor_run_key``), or None: it is, or the ``run_key`` binds none (a text output, or one written
    before format 6.2, whose record is a record for people only)."""
    run_key = getattr(manifest, "run_key", None)
    if not isinstance(run_key, str) or PROCESSOR_KEY not in run_key:
        return None
    vision = manifest.vision if isinstance(manifest.vision, dict) else {}
    if processor_digest(vision.get("processor")) != run_key.partition(PROCESSOR_KEY)[2]:
        return (
            "field 'vision.processor': not the processor record its run_key binds (an edited manifest: "
            "its processor, loss rule, chat template or image tokens are not the run's)"
        )
    return None


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
        image_columns=getattr(manifest, "image_columns", None),
    )


def _fits(value: Any, annotation: str) -> bool:
    """Whether ``value`` is of the (string) ``annotation`` of a manifest dataclass field: ``int``,
    ``float``, ``str``, ``bool``, ``list[X]``, ``dict[...]``, unions with ``None``; a dataclass field is
    checked field by field (``type_problem``), any other annotation passes."""
    for alt in (a.strip() for a in annotation.split("|")):
        if alt == "None" and value is None:
            return True
        if alt == "int" and isinstance(value, int) and not isinstance(value, bool):
            return -INT64 <= value < INT64  # what NumPy and Arrow hold: a count past it overflows there
        if alt == "float" and isinstance(value, int | float) and not isinstance(value, bool):
            return True
        if alt in ("str", "bool") and type(value).__name__ == alt:
            return True
        if alt.startswith("list[") and isinstance(value, list):
            return all(_fits(v, alt[5:-1]) for v in value)
        if alt.startswith("dict") and isinstance(value, dict):
            return True
        if alt not in ("None", "int", "float", "str", "bool") and not alt.startswith(("list", "dict")):
            return not dataclasses.is_dataclass(value) or type_problem(value) is None
    return False


def type_problem(record: Any, where: str = "") -> str | None:
    """The first field of dataclass ``record`` (a loaded ``Manifest``'s shard entries, stats...) whose value
    is not of its declared type, as ``field 'shards[2].num_packs': not an int``; None when all are. A
    manifest is untrusted: a reader must not meet a string where it adds numbers."""
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name in ("provenance", "tokenizer", "histograms", "inputs", "notes"):  # read by their own rules
            continue
        if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                if (problem := type_problem(item, f"{where}{f.name}[{i}].")) is not None:
                    return problem
            continue
        if dataclasses.is_dataclass(value):
            if (problem := type_problem(value, f"{where}{f.name}.")) is not None:
                return problem
            continue
        if isinstance(f.type, str) and not _fits(value, f.type):
            return f"field '{where}{f.name}': {json.dumps(value, default=str)[:40]} is not of type {f.type}"
    return None


def negative_problem(record: Any, where: str = "") -> str | None:
    """The first int field of dataclass ``record`` (a shard format's own fields: counts, byte offsets and
    sizes), or int in a list field, that is negative, as ``field 'shards[0].image_bytes': -1 is
    negative``; None when none is (``record``'s types checked first, ``type_problem``)."""
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        values = value if isinstance(value, list) else [value]
        bad = next((v for v in values if isinstance(v, int) and not isinstance(v, bool) and v < 0), None)
        if bad is not None:
            return f"field '{where}{f.name}': {bad} is negative, not a count or offset"
    return None


def fields_problem(manifest: Any) -> str | None:
    """Why the manifest's fields cannot be read at all: one not of its type (``type_problem``), a negative
    count, a convention packtool does not know, or columns that are not a list packtool writes
    (``layout.columns_problem``); None if none. ``verify`` stops at these; an edit that leaves the fields
    readable is ``manifest_problem``'s, and verify checks on past it."""
    if (problem := type_problem(manifest)) is not None:
        return problem
    try:
        shard_reader = get_format(manifest.shard_format).reader
    except InputError:  # named where the format is needed
        shard_reader = None
    for i, entry in enumerate(manifest.shards if shard_reader is not None else []):  # the format's fields
        own = shard_reader.entry_fields(entry)
        if own is not None and (problem := type_problem(own, f"shards[{i}].fields.")) is not None:
            return problem
        if own is not None and (problem := negative_problem(own, f"shards[{i}].")) is not None:
            return problem
    vocab = manifest.tokenizer.vocab_size
    if not _fits(vocab, "int | None"):
        return f"field 'tokenizer.vocab_size': {vocab!r} is not a number"
    if any(e.num_packs < 0 or e.bytes < 0 for e in manifest.shards):
        return "a shard entry counts fewer than 0 packs or bytes"
    if not 0 <= manifest.pad_token_id <= MAX_TOKEN_ID:
        return f"field 'pad_token_id': {manifest.pad_token_id} is not a token id (0 to {MAX_TOKEN_ID:,})"
    if not 0 < manifest.packed_sequence_size <= MAX_PACKED_SEQUENCE_SIZE:
        n = manifest.packed_sequence_size
        return f"field 'packed_sequence_size': {n} is not between 1 and {MAX_PACKED_SEQUENCE_SIZE:,}"
    for key, known in (("labels", LABELS), ("position_ids", POSITION_IDS)):
        if getattr(manifest, key) not in known:
            return f"field '{key}': {getattr(manifest, key)!r} is not one of {', '.join(known)}"
    image_columns = getattr(manifest, "image_columns", None)
    if image_columns is not None and list(image_columns) != list(IMAGE_COLUMNS):
        return f"field 'image_columns': {image_columns!r} is not the image columns packtool writes"
    return columns_problem(list(manifest.columns), manifest.labels)


def first_pack_problem(manifest: Any) -> str | None:
    """The first shard entry whose ``first_pack`` is not where the packs of the shards before it end
    (``Manifest.shard_starts``: the ``run_id`` binds each shard's pack count, so this field is checked
    against them), as a sentence; None when every one is."""
    for i, (entry, start) in enumerate(zip(manifest.shards, manifest.shard_starts, strict=True)):
        if entry.first_pack != start:
            return (
                f"field 'shards[{i}].first_pack': {entry.first_pack}, where the shards before it end at "
                f"pack {start} (an edited manifest: its packs would be numbered wrong)"
            )
    return None


def manifest_problem(manifest: Any) -> str | None:
    """Why the manifest cannot be read as written: ``fields_problem``, a shard's ``first_pack`` that is not
    its place in the shard list (``first_pack_problem``), a processor record that is not the one its
    ``run_key`` binds (``processor_problem``), or it does not give its own ``run_id`` (a field a reader
    relies on was edited); None when none. A manifest without ``run_key`` (written before run ids
    were bound to content) is not checked for the last."""
    if (problem := fields_problem(manifest)) is not None:
        return problem
    if (problem := first_pack_problem(manifest)) is not None:
        return problem
    if (problem := processor_problem(manifest)) is not None:
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
